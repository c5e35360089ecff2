"""The open-ended ARC metrics: PRR equals LM-Polygraph's (its area normalised by its oracle, against the exact
random baseline), AUROC sklearn's, AURC the risk-coverage curve's; resample weights equal repeated answers; ties
are shared, so the order of the answers does not matter; the judging rule; and the table and verdicts built
from answers written into a store."""

import json

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from sve.metrics.selective import aurc, prediction_rejection_ratio
from sve.paper import open_answers
from sve.paper.open_answers import rejection
from sve.runs.open_answers import cut, judged
from tests.api.test_generation import polygraph_modules


def answers(n=60, seed=0, ties=False):
    rng = np.random.default_rng(seed)
    correct = rng.random(n) < 0.55
    u = rng.normal(size=n) - 0.8 * correct  # informative: right answers tend to be less uncertain
    if ties:
        u = np.round(u * 2) / 2  # a few distinct values, as the disagreement has
    return u, correct


def test_prr_equals_lm_polygraphs(monkeypatch):
    area_module, base = polygraph_modules(monkeypatch, "ue_metrics.pred_rej_area", "ue_metrics.ue_metric")
    prr = area_module.PredictionRejectionArea()
    u, correct = answers()
    target = correct.astype(float)  # their quality: higher is better
    theirs = base.normalize_metric(prr(u, target), prr(-target, target), target.mean())
    ours = rejection(u, correct, np.ones((1, len(u))))["prr"][0]
    assert ours == pytest.approx(theirs, abs=1e-12)
    assert prediction_rejection_ratio(torch.from_numpy(u), torch.from_numpy(correct)) == pytest.approx(
        theirs, abs=1e-12
    )
    # Their random baseline (1000 shuffles) estimates what ours computes exactly: the accuracy.
    assert base.get_random_scores(prr, target) == pytest.approx(target.mean(), abs=0.01)


@pytest.mark.parametrize("ties", [False, True])
def test_auroc_and_aurc_against_sklearn_and_the_curve(ties):
    u, correct = answers(ties=ties)
    ours = rejection(u, correct, np.ones((1, len(u))))
    assert ours["auroc"][0] == pytest.approx(roc_auc_score(~correct, u), abs=1e-12)
    assert ours["aurc"][0] == pytest.approx(aurc(torch.from_numpy(-u), torch.from_numpy(correct)), abs=1e-12)
    assert ours["prr"][0] == pytest.approx(
        prediction_rejection_ratio(torch.from_numpy(u), torch.from_numpy(correct)), abs=1e-12
    )


def test_weights_are_repeated_answers_and_order_does_not_matter():
    u, correct = answers(ties=True)
    rng = np.random.default_rng(1)
    counts = np.bincount(rng.integers(0, len(u), len(u)), minlength=len(u))
    weighted = rejection(u, correct, counts[None].astype(float))
    repeated = rejection(np.repeat(u, counts), np.repeat(correct, counts), np.ones((1, counts.sum())))
    order = rng.permutation(len(u))
    shuffled = rejection(u[order], correct[order], np.ones((1, len(u))))
    plain = rejection(u, correct, np.ones((1, len(u))))
    for key in ("prr", "auroc", "aurc"):
        assert weighted[key][0] == pytest.approx(repeated[key][0], abs=1e-12), key
        assert shuffled[key][0] == pytest.approx(plain[key][0], abs=1e-12), key
    # Perfect ranking: PRR 1, AUROC 1; the reversed ranking: AUROC 0.
    perfect = rejection(-correct.astype(float), correct, np.ones((1, len(u))))
    assert perfect["prr"][0] == pytest.approx(1) and perfect["auroc"][0] == pytest.approx(1)
    assert rejection(correct.astype(float), correct, np.ones((1, len(u))))["auroc"][0] == pytest.approx(0)


def test_the_judging_rule():
    vectors = {
        "sun": [1, 0, 0],
        "moon": [0, 1, 0],
        "a hot star": [0.9, 0.1, 0],
        "rock": [0, 0, 1],
        "x": [0.3, 0.3, 0.3],
    }

    def embed(texts):
        return torch.nn.functional.normalize(torch.tensor([vectors[t] for t in texts], dtype=torch.float), dim=-1)

    options = ("sun", "moon", "rock")
    assert judged("a hot star", options, 0, embed, 0.4)["correct"] is True
    assert judged("a hot star", options, 1, embed, 0.4)["correct"] is False  # closer to another option
    assert judged("x", options, 0, embed, 0.6)["correct"] is False  # a tie is not "closer", and under the floor
    assert judged("sun", options, 0, embed, 0.4)["exact"] is True and judged("", options, 0, embed, 0.4) == {
        "similarity": [0.0, 0.0, 0.0],
        "correct": False,
        "exact": False,
    }
    assert cut(" The sun. It is hot\n", ["\n", "."]) == "The sun"


def write_run(root, row, seed, u, correct):
    path = root / "runs" / "exp" / open_answers.row_directory(row) / f"seed{seed}" / open_answers.ANSWERS
    path.parent.mkdir(parents=True)
    with path.open("w") as f:
        for i, (v, c) in enumerate(zip(u, correct)):
            scores = {
                "sequence_probability": float(np.exp(-abs(v) - 1)),
                "normalized_sequence_probability": 0.5,
                "mutual_information": float(v),
            }
            f.write(
                json.dumps({"index": i, "label": i % 4, "correct": bool(c), "exact": False, "scores": scores}) + "\n"
            )


def test_table_and_verdicts_from_written_answers(tmp_path):
    spec = open_answers.load_spec()
    spec.experiment, spec.questions = "exp", 60
    for seed in (0, 1, 2):
        u, correct = answers(seed=seed)
        write_run(tmp_path, "sve:4", seed, u, correct)  # an informative uncertainty
        write_run(tmp_path, "svf:1", seed, np.random.default_rng(9 + seed).normal(size=60), correct)  # noise
    unrelated = {"pairs": 60, "hits": 1, "rate": 1 / 60, "paired_with": "the next question"}
    (tmp_path / "runs/exp/sve_m4/seed0" / open_answers.ANSWERS).with_name("unrelated.json").write_text(
        json.dumps(unrelated)
    )
    spec.claims[0].note = "A note written after the answers."
    out = open_answers.build(tmp_path, spec)
    text = out.read_text()
    assert "right in 1 of 60 pairs (1.7%), over the 1 runs found" in text
    assert text.rstrip().endswith("**Why:** A note written after the answers.")
    import csv

    per_seed = list(csv.DictReader(out.with_suffix(".csv").open()))
    assert {(r["row"], r["seed"]) for r in per_seed} == {(row, str(s)) for row in ("sve:4", "svf:1") for s in (0, 1, 2)}
    sve0 = next(r for r in per_seed if r["row"] == "sve:4" and r["seed"] == "0" and r["score"] == "mutual_information")
    u, correct = answers(seed=0)
    assert float(sve0["prr"]) == pytest.approx(100 * rejection(u, correct, np.ones((1, 60)))["prr"][0], abs=1e-4)
    figures = sorted(p.name for p in (tmp_path / "figures").iterdir())
    assert figures == ["mini_open_answers_risk_coverage.pdf", "mini_open_answers_risk_coverage.png"]
    assert "| SV-Ensemble (M=4) | 3 |" in text and "| LoRA-Ensemble (M=4) | 0 | – |" in text
    found = open_answers.collect(tmp_path, spec)
    checks = open_answers.judge(spec, found)
    assert checks[1].verdict == "not measured"  # LoRA-Ensemble's answers are absent
    first = checks[0]
    expected = np.mean(
        [
            100
            * rejection(
                found["sve:4", s].uncertainty("mutual_information"), found["sve:4", s].correct, np.ones((1, 60))
            )["prr"][0]
            - 100
            * rejection(
                found["svf:1", s].uncertainty("sequence_probability"), found["svf:1", s].correct, np.ones((1, 60))
            )["prr"][0]
            for s in (0, 1, 2)
        ]
    )
    assert first.point == pytest.approx(expected) and first.low < first.point < first.high
    assert first.holm in ("held", "reversed", "unresolved") and f"{first.point:+.1f}" in text
