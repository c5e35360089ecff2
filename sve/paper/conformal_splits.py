"""Split conformal prediction sets of the committed runs, from each run's saved test predictive
(``predictive/test.npz``: ``probs`` and ``labels``), as per-example statistics the claims' bootstrap can resample.

Why this way: the test predictive is the only held-out data a committed run keeps, so calibration and test
examples both come from it. One split would tie a run's set size to which half happened to calibrate it;
repeated splits average that away. Each example's statistic is its mean over the splits where it was a test
example, so a metric is a mean over the test examples, like acc or nll, and the paired bootstrap of
``sve.paper.bootstrap`` applies to it unchanged (``bootstrap.statistic``).

**Splits** (``split_masks``). ``SPLITS`` permutations of the N examples from ``numpy.random.default_rng(SEED)``:
the same splits for every run of N examples, so two rows evaluated on the same examples are split alike (paired,
as the bootstrap pairs them). Each permutation is used both ways, its first half calibrating its second and then
the reverse, so every example is a test example in exactly ``SPLITS`` of the 2 * ``SPLITS`` splits.

**Per split** (``sve.metrics.conformal``): the threshold at miscoverage alpha is the finite-sample quantile of the
calibration half's label scores (``threshold``); a test example's set is every class whose score is at most it;
its size and whether it holds the label are recorded. Scores: ``thr`` (1 - p_c, the smallest sets on average)
and ``aps`` (adaptive sets, not randomised: they over-cover).

**Metrics** (``KEYS``): ``set_size_90``, the mean set size at 90% coverage (alpha 0.1), and ``coverage_90``, the
share of test examples whose set holds the label; ``_95`` at alpha 0.05; ``aps_`` in front for the aps score,
``mi_`` for thr_mi (sets that grow with the members' disagreement); and two statistics of that disagreement,
``growth_`` and ``mi_saving_`` (defined at ``KEYS``), on files that keep the members' mutual information.
By exchangeability the coverage is at least 1 - alpha averaged over splits.

**What an interval of these leaves out.** The bootstrap resamples examples with their split-averaged statistics
held fixed: it measures how much the comparison depends on which examples were tested, while each threshold
stays fitted on the full set's halves. The thresholds' own sampling error (of a quantile of N / 2 scores) is not
in it; averaging over 2 * ``SPLITS`` splits removes the noise of any one split, not that error.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from sve.metrics import conformal
from sve.runs.prediction_files import PREDICTIVE, TEST, Examples, read_predictive

SPLITS, SEED = 200, 0
LEVELS = {"90": 0.1, "95": 0.05}  # the key's suffix: coverage in percent -> alpha
PREFIXES = {"": "thr", "aps_": "aps", "mi_": "thr_mi"}
STATISTICS = ("set_size", "coverage")
# key -> (score, statistic, alpha), e.g. "set_size_90" -> ("thr", "set_size", 0.1)
KEYS = {
    f"{prefix}{stat}_{level}": (score, stat, alpha)
    for prefix, score in PREFIXES.items()
    for level, alpha in LEVELS.items()
    for stat in STATISTICS
}
# Two statistics of the members' disagreement, each a mean over examples of a per-example value (so the bootstrap
# resamples them like the rest), on the runs whose file keeps it (mutual_information: more than one member):
# - growth_<level>: the THR sets' mean size on the half of the examples where the members disagree most (mutual
#   information above its median) minus that on the other half: above 0 when sets grow with disagreement;
# - mi_saving_<level>: the THR sets' mean size minus the thr_mi sets' (sve.metrics.conformal, beta at its
#   default), both at the same level: above 0 when sets that follow the disagreement are smaller.
KEYS.update({f"growth_{level}": ("thr", "growth", alpha) for level, alpha in LEVELS.items()})
KEYS.update({f"mi_saving_{level}": ("thr_mi", "saving", alpha) for level, alpha in LEVELS.items()})
NEEDS_DISAGREEMENT = tuple(k for k, (score, stat, _) in KEYS.items() if score == "thr_mi" or stat == "growth")


def split_masks(n: int, splits: int = SPLITS, seed: int = SEED) -> np.ndarray:
    """(2 * splits, n) bool, True where an example is a test example of a split (module docstring)."""
    rng = np.random.default_rng(seed)
    masks = np.zeros((2 * splits, n), dtype=bool)
    for r in range(splits):
        order = rng.permutation(n)
        masks[2 * r, order[n // 2 :]] = True  # the first half calibrates
        masks[2 * r + 1, order[: n // 2]] = True  # then the second does
    return masks


def per_example(
    probs: np.ndarray,
    labels: np.ndarray,
    score: str,
    alpha: float,
    splits: int = SPLITS,
    seed: int = SEED,
    mutual_information: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Each example's mean set size and coverage (``STATISTICS``, (N,) each) over the splits where it was a
    test example, the threshold fitted on the other half of each split (thr_mi: ``mutual_information`` (N,))."""
    information = None if mutual_information is None else torch.from_numpy(np.asarray(mutual_information, float))
    scores = conformal.class_scores(torch.from_numpy(np.asarray(probs, dtype=np.float64)), score, information)
    scores = scores.numpy()  # (N, C)
    labels = np.asarray(labels, dtype=np.int64)
    truth = scores[np.arange(len(labels)), labels]  # (N,): each label's score
    masks = split_masks(len(labels), splits, seed)
    q = np.array([conformal.threshold(torch.from_numpy(truth[~m]), alpha) for m in masks])  # (2 * splits,)
    sizes = (scores[None] <= q[:, None, None]).sum(-1)  # (2 * splits, N): every example's set in every split
    covered = truth[None] <= q[:, None]
    return {
        "set_size": (sizes * masks).sum(0) / splits,  # each example is tested in exactly `splits` splits
        "coverage": (covered * masks).sum(0) / splits,
    }


@functools.lru_cache(maxsize=512)
def _values(examples: Examples, score: str, alpha: float) -> dict[str, np.ndarray]:
    information = examples.arrays.get("mutual_information") if score == "thr_mi" else None
    return per_example(examples.arrays["probs"], examples.labels, score, alpha, mutual_information=information)


def has_disagreement(examples: Examples) -> bool:
    return "mutual_information" in examples.arrays


def growth(set_size: np.ndarray, mutual_information: np.ndarray) -> np.ndarray:
    """Per-example values whose mean is the mean set size above the median mutual information minus that at or
    below it: +1 / (share above) on the examples above, -1 / (share at or below) on the rest, times the size."""
    above = np.asarray(mutual_information) > np.median(mutual_information)
    if above.all() or not above.any():
        raise ValueError("the members' mutual information is the same on every example: no half disagrees more")
    weight = np.where(above, 1.0 / above.mean(), -1.0 / (1.0 - above.mean()))
    return weight * set_size


def values(examples: Examples, key: str) -> np.ndarray:
    """The per-example statistic of metric ``key`` on a set whose file holds the predictive (``probs``; the
    disagreement statistics also its ``mutual_information``)."""
    score, stat, alpha = KEYS[key]
    if "probs" not in examples.arrays or examples.labels is None:
        raise ValueError(
            f"{key} needs the ensemble predictive (probs) and labels; {examples.where} has "
            f"{sorted(examples.arrays)} (only the test set's file keeps probs)"
        )
    if key in NEEDS_DISAGREEMENT and not has_disagreement(examples):
        raise ValueError(
            f"{key} needs the members' mutual_information; {examples.where} has {sorted(examples.arrays)} (a "
            "one-member run has none; a run evaluated before it was kept: evaluate it again)"
        )
    if stat == "growth":
        return growth(_values(examples, "thr", alpha)["set_size"], examples.arrays["mutual_information"])
    if stat == "saving":
        return _values(examples, "thr", alpha)["set_size"] - _values(examples, "thr_mi", alpha)["set_size"]
    return _values(examples, score, alpha)[stat]


@functools.lru_cache(maxsize=1024)
def _run_metrics(path: str, stamp: tuple[int, int]) -> dict[str, float] | None:
    examples = read_predictive(Path(path), TEST)
    if examples is None or "probs" not in examples.arrays:
        return None
    usable = [k for k in KEYS if k not in NEEDS_DISAGREEMENT or has_disagreement(examples)]
    return {key: float(values(examples, key).mean()) for key in usable}


def run_metric(run_dir: Path, key: str) -> float | None:
    """Metric ``key`` of the run in ``run_dir`` from its ``predictive/test.npz``; None without that file (a run
    evaluated before it was written). Read and computed once per file version."""
    path = Path(run_dir) / PREDICTIVE / f"{TEST}.npz"
    if not path.is_file():
        return None
    stat = path.stat()
    found = _run_metrics(str(path), (stat.st_mtime_ns, stat.st_size))
    return None if found is None else found.get(key)


__all__ = [
    "KEYS",
    "NEEDS_DISAGREEMENT",
    "SPLITS",
    "SEED",
    "split_masks",
    "per_example",
    "growth",
    "values",
    "run_metric",
]
