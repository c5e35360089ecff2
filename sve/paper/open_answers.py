"""The open-ended ARC table and its claim (``sve/configs/claims/open_answers.yaml``), from the answers that
``sve.runs.open_answers`` wrote into the runs (``make mini-open-answers``).

For each row (method, ensemble size) and seed: the accuracy of the written answers by the judging rule, the exact
matches, the calibration (ECE, 15 bins) of the sequence confidence (the per-token geometric mean of the answer's
probability, ``normalized_sequence_probability``) for being right, and for each score used as an uncertainty
(higher: less likely right; the two probabilities negated):

- **PRR**, the prediction-rejection ratio: rejecting answers from the most uncertain, the mean accuracy of the kept
  answers averaged over every number kept (the area under the prediction-rejection curve), placed between random
  rejection (0) and the oracle that rejects every wrong answer first (100%), in percent. LM-Polygraph's PRR
  (``PredictionRejectionArea`` normalised by its oracle and random scores) on the same numbers.
- **AUROC** of the uncertainty for telling wrong answers from right ones (ties count a half), in percent.
- **AURC**, the area under the risk-coverage curve (``sve.metrics.selective``): the mean error of the kept answers
  over every number kept, in percent (lower is better).

Ties in a score (the disagreement and the semantic entropy take few values) are shared as in
``sve.metrics.selective``: a cut inside a group of equal scores keeps each of its answers with the same share,
the expected value over every order of the tied answers.

Every metric is also a function of per-answer resampling weights (``rejection``), so the claim's differences get
the other verdicts' intervals (``sve.paper.bootstrap``: the questions resampled jointly for every run, the
seeds' spread at Student's t), and the two checks are Holm-adjusted as one family.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from sve.errors import InputError
from sve.paper import bootstrap
from sve.paper.claims import HELD, REVERSED, UNRESOLVED, decide, holm_step_down
from sve.paper.display import METHOD_NAMES
from sve.runs.prediction_files import Examples

SPEC = Path(__file__).resolve().parents[1] / "configs" / "claims" / "open_answers.yaml"
ANSWERS = "evaluations/open_answers/answers.jsonl"
CONFIDENCE = "normalized_sequence_probability"  # the sequence confidence whose calibration is reported
NEGATED = ("sequence_probability", "normalized_sequence_probability")  # probabilities: uncertainty is their negative
REJECTION = ("prr", "auroc", "aurc")
LABELS = {"prr": "PRR (%) ↑", "auroc": "AUROC (%) ↑", "aurc": "AURC (%) ↓"}


@dataclass
class Answers:
    """One run's judged answers: ``correct``, ``exact`` (n,) booleans and each score (n,), in question order."""

    where: Path
    index: np.ndarray
    labels: np.ndarray
    correct: np.ndarray
    exact: np.ndarray
    scores: dict[str, np.ndarray]
    unrelated: dict | None = None  # the rule's hits on unrelated answers (unrelated.json), where measured

    def uncertainty(self, score: str) -> np.ndarray:
        if score not in self.scores:
            raise InputError(f"{self.where}: no score {score!r}; it has {sorted(self.scores)}")
        return -self.scores[score] if score in NEGATED else self.scores[score]

    def examples(self) -> Examples:
        """The answers as a set of the verdicts' bootstrap: confidence = the sequence confidence, correct = judged
        right; nll and Brier of that confidence for being right."""
        confidence = np.clip(self.scores[CONFIDENCE], 1e-12, 1 - 1e-12)
        hit = self.correct.astype(np.float64)
        arrays = {
            "index": self.index,
            "labels": self.labels,
            "confidence": confidence,
            "correct": self.correct,
            "nll": -(hit * np.log(confidence) + (1 - hit) * np.log1p(-confidence)),
            "brier": (hit - confidence) ** 2,
        }
        return Examples("test", arrays, self.where)


def read_answers(path: Path, questions: int) -> Answers | None:
    """The first ``questions`` answers of a run's file; None while it holds fewer."""
    if not path.is_file():
        return None
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:questions]
    if len(records) < questions:
        return None
    names = sorted({k for r in records for k in r["scores"]})
    unrelated = path.parent / "unrelated.json"
    return Answers(
        where=path,
        index=np.array([r["index"] for r in records], dtype=np.int64),
        labels=np.array([r["label"] for r in records], dtype=np.int64),
        correct=np.array([r["correct"] for r in records], dtype=bool),
        exact=np.array([r["exact"] for r in records], dtype=bool),
        scores={k: np.array([r["scores"].get(k, np.nan) for r in records], dtype=np.float64) for k in names},
        unrelated=json.loads(unrelated.read_text()) if unrelated.is_file() else None,
    )


# --- metrics of weighted (resampled) answers ------------------------------------------------------------------


def harmonic(n: int) -> np.ndarray:
    """H[k] = sum_{j=1..k} 1/j for k = 0..n."""
    return np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, n + 1))])


def rejection(uncertainty: np.ndarray, correct: np.ndarray, weights: np.ndarray) -> dict[str, np.ndarray]:
    """PRR, AUROC and AURC (module docstring), each (R,) in [0, 1] units, of R weightings (R, n) of the answers
    (whole-number counts: a resample; ones: the answers themselves).

    Kept answers come in order of rising uncertainty, a group of equal uncertainty at once with its accuracy
    spread evenly over its copies. Over a group of W copies starting after S kept ones, with Q right answers kept
    before it and accuracy v inside, the kept accuracies sum to sum_{k=S+1..S+W} (Q + (k - S) v) / k =
    (Q - S v)(H[S+W] - H[S]) + v W, with H the harmonic numbers: so the whole curve's area is a few array
    operations per replicate, not a sort per replicate."""
    if np.isnan(uncertainty).any():
        raise InputError(f"{int(np.isnan(uncertainty).sum())} answers have no value of this score")
    weights = np.atleast_2d(weights).astype(np.float64)
    values, group = np.unique(uncertainty, return_inverse=True)  # ascending: the most certain first
    members = np.zeros((len(uncertainty), len(values)))
    members[np.arange(len(uncertainty)), group] = 1.0
    size = weights @ members  # (R, G) copies per group
    right = (weights * correct) @ members  # (R, G) right answers per group
    total = size.sum(1)
    counts = np.rint(total).astype(np.int64)
    if not np.allclose(total, counts):
        raise ValueError("rejection needs whole-number weights (resample counts)")
    H = harmonic(int(counts.max()))
    before = np.cumsum(size, 1) - size  # S
    right_before = np.cumsum(right, 1) - right  # Q
    accuracy = np.divide(right, size, out=np.zeros_like(right), where=size > 0)  # v
    ends = np.rint(before + size).astype(np.int64)
    starts = np.rint(before).astype(np.int64)
    area = (((right_before - before * accuracy) * (H[ends] - H[starts]) + accuracy * size).sum(1)) / total
    hits = right.sum(1)
    chance = hits / total
    whole = np.rint(hits).astype(np.int64)
    oracle = (hits + hits * (H[counts] - H[whole])) / total  # every right answer kept first
    spread = oracle - chance
    prr = np.divide(area - chance, spread, out=np.full_like(area, np.nan), where=spread > 1e-12)
    wrong = size - right
    auroc = (wrong * (right_before + 0.5 * right)).sum(1) / np.where(
        hits * (total - hits) > 0, hits * (total - hits), np.nan
    )
    return {"prr": prr, "auroc": auroc, "aurc": 1.0 - area}


def statistic(key: str, answers: Answers, score: str | None = None) -> bootstrap.Statistic:
    """``key`` of one run's answers as a bootstrap statistic in display units (percent): acc, exact, ece of the
    sequence confidence, or prr/auroc/aurc of ``score``."""
    examples = answers.examples()
    if key in ("acc", "ece"):
        inner = bootstrap.statistic(key, [examples])
        return bootstrap.Statistic(key, (examples,), lambda ws: 100 * inner.evaluate(ws))
    if key == "exact":
        exact = answers.exact.astype(np.float64)
        return bootstrap.Statistic(key, (examples,), lambda ws: 100 * (ws[0] @ exact) / ws[0].sum(1))
    if key in REJECTION:
        u = answers.uncertainty(score)
        return bootstrap.Statistic(
            f"{key}:{score}", (examples,), lambda ws: 100 * rejection(u, answers.correct, ws[0])[key]
        )
    raise ValueError(f"no open-answer metric {key!r}; choose one of {['acc', 'exact', 'ece', *REJECTION]}")


# --- the table and the claim --------------------------------------------------------------------------------


def load_spec(path: Path = SPEC):
    return OmegaConf.load(path)


def label(row: str) -> str:
    """``sve:4`` -> ``SV-Ensemble (M=4)``, as the tables name rows."""
    method, size = row.split(":")
    return f"{METHOD_NAMES.get(method, method)} (M={size})"


def row_directory(row: str) -> str:
    """A row's runs directory: ``sve:4`` -> ``sve_m4``."""
    method, size = row.split(":")
    return f"{method}_m{size}"


def collect(results: Path, spec) -> dict[tuple[str, int], Answers]:
    """(row, seed) -> its answers, for every run of the spec whose answers are complete."""
    runs = results / "runs" / spec.experiment
    found = {}
    for row in spec.rows:
        for seed in spec.seeds:
            answers = read_answers(runs / row_directory(row) / f"seed{seed}" / ANSWERS, int(spec.questions))
            if answers is not None:
                found[row, int(seed)] = answers
    return found


def cell(values: list[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.1f}†"
    return f"{np.mean(values):.1f} ± {np.std(values, ddof=1):.1f}"


def table(spec, found: dict) -> str:
    """The markdown tables: the answers' accuracy and calibration per row, then each score's rejection metrics."""
    seeds = lambda row: [s for s in spec.seeds if (row, s) in found]  # noqa: E731
    value = lambda row, key, score=None: [  # noqa: E731
        statistic(key, found[row, s], score).value() for s in seeds(row)
    ]
    lines = [
        f"## Open-ended ARC-Easy: written answers judged against the options ({spec.questions} test questions)",
        "",
        "| row | seeds | accuracy (%) ↑ | exact (%) ↑ | ECE of the sequence confidence (%) ↓ |",
        "|:--|--:|--:|--:|--:|",
    ]
    for row in spec.rows:
        lines.append(
            f"| {label(row)} | {len(seeds(row))} | {cell(value(row, 'acc'))} | {cell(value(row, 'exact'))} | "
            f"{cell(value(row, 'ece'))} |"
        )
    lines += ["", "| row | score | " + " | ".join(LABELS[k] for k in REJECTION) + " |", "|:--|:--|--:|--:|--:|"]
    for row in spec.rows:
        for score in spec.scores:
            if not seeds(row) or score not in found[row, seeds(row)[0]].scores:
                continue
            if np.isnan(found[row, seeds(row)[0]].scores[score]).all():
                continue
            cells = " | ".join(cell(value(row, k, score)) for k in REJECTION)
            lines.append(f"| {label(row)} | {score} | {cells} |")
    lines += [
        "",
        "Mean ± sample standard deviation over the seeds found; † one seed. A score a row does not have (the "
        "disagreement of one member) is left out.",
    ]
    unrelated = [a.unrelated for a in found.values() if a.unrelated is not None]
    if unrelated:
        hits, pairs = sum(u["hits"] for u in unrelated), sum(u["pairs"] for u in unrelated)
        lines.append(
            f"The rule on unrelated answers (each answer judged against the next question's options): right in "
            f"{hits} of {pairs} pairs ({100 * hits / pairs:.1f}%), over the {len(unrelated)} runs found."
        )
    return "\n".join(lines) + "\n"


@dataclass
class Check:
    text: str
    verdict: str
    point: float | None = None
    low: float | None = None
    high: float | None = None
    p: float | None = None
    holm: str | None = None
    missing: str | None = None


def judge(spec, found: dict) -> list[Check]:
    """Every check of the claim, its interval and p-value (``sve.paper.bootstrap``), then Holm over the family."""
    options = dict(spec.bootstrap)
    checks = []
    for claim in spec.claims:
        for c in claim.checks:
            expect = c.expect.replace("_", " ")
            text = f"{label(c.a)} {c.score_a} against {label(c.b)} {c.score_b}: {c.metric.upper()} {expect}"
            seeds = [s for s in spec.seeds if (c.a, s) in found and (c.b, s) in found]
            if len(seeds) < 2:
                checks.append(Check(text, "not measured", missing=f"{len(seeds)} seed(s) with both rows' answers"))
                continue
            terms = []
            for s in seeds:
                a, b = statistic(c.metric, found[c.a, s], c.score_a), statistic(c.metric, found[c.b, s], c.score_b)
                bootstrap.check_paired(a, b)
                terms += [bootstrap.Term(1 / len(seeds), s, a, "d"), bootstrap.Term(-1 / len(seeds), s, b, "d")]
            draws = bootstrap.draw(terms, int(options["replicates"]), int(options["seed"]))
            low, high = bootstrap.bounds(draws, float(options["level"]))
            margin = float(spec.margins.points) if c.expect == "not_worse" else 0.0
            verdict, _ = decide(c.expect, [bootstrap.Interval(float(draws.point), float(low), float(high))], margin)
            shift = margin / draws.points.shape[-1]  # the null of "not worse" is difference = -margin
            shifted = bootstrap.Draws(draws.columns, draws.points + shift, draws.replicates + shift)
            checks.append(Check(text, verdict, float(draws.point), float(low), float(high), bootstrap.p_value(shifted)))
    tested = [c for c in checks if c.p is not None]
    for c, adjusted in zip(tested, holm_step_down([c.p for c in tested], [c.verdict for c in tested])):
        c.holm = adjusted
    return checks


def verdicts_text(spec, checks: list[Check]) -> str:
    lines = [
        f"### Claim: {spec.claims[0].title}",
        "",
        f"> {spec.claims[0].claim}",
        "",
        "| check | difference (points) | 95% interval | p | verdict | with Holm (2 checks) |",
        "|:--|--:|:--|--:|:--|:--|",
    ]
    for c in checks:
        if c.point is None:
            lines.append(f"| {c.text} | – | – | – | {c.verdict} ({c.missing}) | – |")
            continue
        lines.append(
            f"| {c.text} | {c.point:+.1f} | [{c.low:+.1f}, {c.high:+.1f}] | {c.p:.3f} | {c.verdict} | {c.holm} |"
        )
    lines += [
        "",
        f'Verdicts: {HELD} (the interval on the claimed side of 0, or of -{spec.margins.points} point for "not '
        f'worse"), {REVERSED} (on the other side), {UNRESOLVED} (it contains the threshold). Intervals: the '
        "verdicts' procedure (sve/paper/bootstrap.py), questions resampled jointly for both rows and every seed.",
    ]
    note = spec.claims[0].get("note")
    if note:  # what the verdicts mean, written once the answers are in (the claim itself was written before)
        lines += ["", f"**Why:** {note.strip()}"]
    return "\n".join(lines) + "\n"


CURVE_SCORES = ("sequence_probability", "mutual_information", "semantic_entropy")  # the claim's and the best


def risk_coverage_figure(spec, found: dict, out_dir: Path) -> list[Path]:
    """``mini_open_answers_risk_coverage.png``/``.pdf``: per row, the error of the kept answers against the share
    kept, keeping the least uncertain first by each of ``CURVE_SCORES`` (the mean over seeds), with the oracle's
    curve; nothing while no row has answers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from sve.metrics.plots import save_figure
    from sve.metrics.selective import risk_coverage

    rows = [row for row in spec.rows if any((row, s) in found for s in spec.seeds)]
    if not rows:
        return []
    fig, axes = plt.subplots(1, len(rows), figsize=(4 * len(rows), 3.4), squeeze=False, sharey=True)
    for ax, row in zip(axes[0], rows):
        runs = [found[row, s] for s in spec.seeds if (row, s) in found]
        curves = {"oracle": [a.correct.astype(np.float64) for a in runs]}
        kept = [score for score in CURVE_SCORES if all(score in a.scores for a in runs)]
        curves.update({score: [-a.uncertainty(score) for a in runs] for score in kept})
        for name, confidences in curves.items():
            if any(np.isnan(c).all() for c in confidences):
                continue
            risks = [
                risk_coverage(torch.from_numpy(c), torch.from_numpy(a.correct))[1] for c, a in zip(confidences, runs)
            ]
            coverage = np.arange(1, len(risks[0]) + 1) / len(risks[0])
            style = {"color": "grey", "ls": "--"} if name == "oracle" else {}
            ax.plot(coverage, torch.stack(risks).mean(0).numpy(), label=name, **style)
        ax.set_title(f"{label(row)}, {len(runs)} seed(s)", fontsize=9)
        ax.set_xlabel("share of answers kept")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("error of the kept answers")
    axes[0, 0].legend(fontsize=7)
    return save_figure(fig, out_dir, "mini_open_answers_risk_coverage")


def per_seed_rows(spec, found: dict) -> list[dict]:
    """One row per (method row, seed, score): accuracy, exact, ECE and the score's rejection metrics, in percent."""
    out = []
    for row in spec.rows:
        for seed in spec.seeds:
            if (row, seed) not in found:
                continue
            answers = found[row, seed]
            common = {k: statistic(k, answers).value() for k in ("acc", "exact", "ece")}
            for score in spec.scores:
                if score not in answers.scores or np.isnan(answers.scores[score]).all():
                    continue
                values = {k: statistic(k, answers, score).value() for k in REJECTION}
                out.append({"row": row, "seed": seed, "score": score, **common, **values})
    return out


def write_csv(rows: list[dict], path: Path) -> None:
    import csv

    fields = ["row", "seed", "score", "acc", "exact", "ece", *REJECTION]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})


def build(results: Path, spec=None) -> Path:
    """Writes ``<results>/tables/mini_open_answers.md``, its per-seed ``.csv`` and its risk-coverage figure; returns
    the table's path."""
    spec = spec or load_spec()
    found = collect(results, spec)
    out = results / "tables" / "mini_open_answers.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table(spec, found) + "\n" + verdicts_text(spec, judge(spec, found)))
    write_csv(per_seed_rows(spec, found), out.with_suffix(".csv"))  # every seed's numbers, not only their mean
    risk_coverage_figure(spec, found, results / "figures")
    return out
