"""OOD detection metrics against a pairwise/threshold-sweep numpy reference (Appendix E.5-E.7)."""

import numpy as np
import pytest
import torch

from sve.metrics.scores import OODDetection


def reference(id_scores, ood_scores):
    s = np.concatenate([id_scores, ood_scores])
    y = np.concatenate([np.ones(len(id_scores)), np.zeros(len(ood_scores))])
    diff = id_scores[:, None] - ood_scores[None, :]
    auroc = ((diff > 0) + 0.5 * (diff == 0)).mean()  # Mann-Whitney: P(id > ood) + P(tie) / 2
    ap, prev_recall, fpr95 = 0.0, 0.0, None
    for t in np.unique(s)[::-1]:  # thresholds high to low; "positive" means score >= t
        pred = s >= t
        tp, fp = (pred & (y == 1)).sum(), (pred & (y == 0)).sum()
        recall, precision = tp / (y == 1).sum(), tp / (tp + fp)
        ap += (recall - prev_recall) * precision
        prev_recall = recall
        if fpr95 is None and recall >= 0.95:
            fpr95 = fp / (y == 0).sum()
    return {"auroc": auroc, "auprc": ap, "fpr95": fpr95}


def compute(id_scores, ood_scores):
    metric = OODDetection()
    # Two-class probabilities whose maximum is the score (scores are in [0.5, 1]).
    as_probs = lambda s: torch.from_numpy(np.stack([s, 1 - s], 1))  # noqa: E731
    metric.update(as_probs(id_scores), True)
    metric.update(as_probs(ood_scores), False)
    return {k: float(v) for k, v in metric.compute().items()}


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_reference_with_ties(seed):
    rng = np.random.default_rng(seed)
    id_scores = np.round(rng.uniform(0.6, 1.0, 300), 2)  # rounding creates many ties
    ood_scores = np.round(rng.uniform(0.5, 0.9, 200), 2)
    got, ref = compute(id_scores, ood_scores), reference(id_scores, ood_scores)
    for key in ref:
        assert got[key] == pytest.approx(ref[key], abs=1e-6), key  # torchmetrics returns float32


def test_perfect_and_inverted_separation():
    perfect = compute(np.array([0.9, 0.95, 0.99]), np.array([0.5, 0.6]))
    assert perfect == {"auroc": 1.0, "auprc": 1.0, "fpr95": 0.0}
    inverted = compute(np.array([0.5, 0.6]), np.array([0.9, 0.95, 0.99]))
    assert inverted["auroc"] == 0.0 and inverted["fpr95"] == 1.0


def test_needs_both_kinds():
    metric = OODDetection()
    metric.update(torch.tensor([[0.9, 0.1]]), True)
    with pytest.raises(ValueError, match="both"):
        metric.compute()


def test_run_reports_ood_metrics_when_the_dataset_has_an_ood_set(tmp_path):
    from sve.runs.run import run
    from tests.conftest import compose_cfg

    cfg = compose_cfg(
        [
            "backbone=tiny_vit",
            "+dataset.ood._target_=sve.data.SyntheticImageData",
            "+dataset.ood.seed=7",
            "+dataset.ood.noise=3.0",
        ],
        tmp_path,
    )
    metrics = run(cfg)["metrics"]
    assert {"test/ood_auroc", "test/ood_auprc", "test/ood_fpr95"} <= set(metrics)
    assert all(0 <= metrics[k] <= 1 for k in ("test/ood_auroc", "test/ood_auprc", "test/ood_fpr95"))
    assert 0 <= metrics["test/acc"] <= 1


def test_an_ensemble_run_scores_ood_by_mutual_information_too(tmp_path):
    """With more than one member, test/ood_*_mi use minus the mutual information as the score: equal to the
    pairwise reference on the members' saved logits; a one-member run has no such metrics."""
    from sve.runs.prediction_files import read_predictions
    from sve.runs.run import run
    from tests.conftest import compose_cfg

    ood = ["+dataset.ood._target_=sve.data.SyntheticImageData", "+dataset.ood.seed=7", "+dataset.ood.noise=3.0"]
    result = run(compose_cfg(["backbone=tiny_vit", "method=sve", "ensemble_size=3", *ood], tmp_path / "sve"))

    def minus_mi(name: str) -> np.ndarray:
        logits = torch.from_numpy(read_predictions(tmp_path / "sve" / result["predictions"][name])["member_logits"])
        probs = logits.double().softmax(-1)
        entropy = lambda p: -(p * p.clamp_min(1e-300).log()).sum(-1)  # noqa: E731
        return -(entropy(probs.mean(0)) - entropy(probs).mean(0)).numpy()

    ref = reference(minus_mi("test"), minus_mi("ood"))
    for key in ref:
        assert result["metrics"][f"test/ood_{key}_mi"] == pytest.approx(ref[key], abs=1e-6), key
    assert result["metrics"]["test/ood_auroc_mi"] != result["metrics"]["test/ood_auroc"]
    single = run(compose_cfg(["backbone=tiny_vit", "method=single", *ood], tmp_path / "single"))["metrics"]
    assert "test/ood_auroc" in single and not any(k.endswith("_mi") for k in single)


def test_scores_added_after_a_compute_count_in_the_next_one():
    # update_scores must append to the states inside torchmetrics' update wrapper, or the result cached by the
    # first compute comes back from the second. Reference: sklearn on all scores.
    from sklearn.metrics import average_precision_score, roc_auc_score

    first_id, first_ood, later_ood = np.array([0.9, 0.8, 0.3]), np.array([0.1, 0.2]), np.array([0.95, 0.85, 0.4])
    metric = OODDetection(sync_on_compute=False)
    metric.update_scores(torch.from_numpy(first_id), True)
    metric.update_scores(torch.from_numpy(first_ood), False)
    metric.compute()
    metric.update_scores(torch.from_numpy(later_ood), False)
    got = {k: float(v) for k, v in metric.compute().items()}
    scores = np.concatenate([first_id, first_ood, later_ood])
    target = np.r_[np.ones(3), np.zeros(5)]
    assert got["auroc"] == pytest.approx(roc_auc_score(target, scores), abs=1e-6)
    assert got["auprc"] == pytest.approx(average_precision_score(target, scores), abs=1e-6)
    assert got["fpr95"] == pytest.approx(reference(first_id, np.r_[first_ood, later_ood])["fpr95"], abs=1e-6)


@pytest.mark.parametrize("inside", [True, False])
def test_nan_scores_are_refused_not_ranked(inside):
    # torchmetrics returned finite AUROC/AUPRC/FPR95 with a NaN score among them; sklearn, the reference, refuses.
    from sklearn.metrics import roc_auc_score

    nan_set, clean_set = np.array([0.1, np.nan, 0.95]), np.array([0.9, 0.8, 0.7])
    metric = OODDetection(sync_on_compute=False)
    metric.update_scores(torch.from_numpy(nan_set), inside)
    metric.update_scores(torch.from_numpy(clean_set), not inside)
    with pytest.raises(ValueError, match="NaN"):
        roc_auc_score(np.r_[np.full(3, inside), np.full(3, not inside)], np.r_[nan_set, clean_set])
    with pytest.raises(FloatingPointError, match="NaN"):
        metric.compute()


def test_scores_of_any_range_are_ranked_as_they_are():
    # Scores outside [0, 1] must not go through torchmetrics' sigmoid, which rounds everything above ~37 to 1.0:
    # energies of 40..100 would give AUROC 0.5 for a perfect separation. Reference: sklearn.
    from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

    rng = np.random.default_rng(0)
    inside = np.round(rng.uniform(45, 100, 200), 1)  # rounding makes ties, within and across the two sets
    outside = np.round(rng.uniform(-5, 60, 150), 1)
    metric = OODDetection(sync_on_compute=False)
    metric.update_scores(torch.from_numpy(inside), True)
    metric.update_scores(torch.from_numpy(outside), False)
    got = {k: float(v) for k, v in metric.compute().items()}
    scores, target = np.r_[inside, outside], np.r_[np.ones(200), np.zeros(150)]
    fpr, tpr, _ = roc_curve(target, scores)
    assert got["auroc"] == pytest.approx(roc_auc_score(target, scores), abs=1e-6)
    assert got["auprc"] == pytest.approx(average_precision_score(target, scores), abs=1e-6)
    assert got["fpr95"] == pytest.approx(fpr[np.argmax(tpr >= 0.95)], abs=1e-6)


@pytest.mark.parametrize("aggregate", ["probs", "logits"])
def test_ood_scores_of_member_logits_by_confidence_and_by_mutual_information(aggregate):
    """What the CLI's evaluation and sve.wrap's evaluate(ood=...) both report: the reference on the predictive's
    maximum probability, and on minus the mutual information (computed here with numpy); one member: no MI."""
    from sve.metrics.scores import ood_scores

    rng = np.random.default_rng(5)
    inside, outside = rng.normal(size=(3, 60, 4)) * 3, rng.normal(size=(3, 40, 4))

    def softmax(z):
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def predictive(z):
        return softmax(z).mean(0) if aggregate == "probs" else softmax(z.mean(0))

    def minus_mi(z):
        entropy = lambda p: -(p * np.log(p)).sum(-1)  # noqa: E731
        return -(entropy(softmax(z).mean(0)) - entropy(softmax(z)).mean(0))

    got = ood_scores(torch.from_numpy(inside), torch.from_numpy(outside), aggregate)
    by_confidence = reference(predictive(inside).max(-1), predictive(outside).max(-1))
    by_mi = reference(minus_mi(inside), minus_mi(outside))
    assert list(got) == [f"ood_{k}" for k in by_confidence] + [f"ood_{k}_mi" for k in by_mi]
    for key in by_confidence:
        assert got[f"ood_{key}"] == pytest.approx(by_confidence[key], abs=1e-6), key
        assert got[f"ood_{key}_mi"] == pytest.approx(by_mi[key], abs=1e-6), key
    single = ood_scores(torch.from_numpy(inside[:1]), torch.from_numpy(outside[:1]), aggregate)
    assert list(single) == ["ood_auroc", "ood_auprc", "ood_fpr95"]
