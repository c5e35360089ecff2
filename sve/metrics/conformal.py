"""Split conformal classification: prediction sets that hold the true class with probability at least 1 - alpha.

A score s(x, c) says how badly class c conforms to the predictive at x (higher: worse). On n held-out
calibration examples the scores of their true labels are sorted, and the threshold q is the k-th smallest with
k = ceil((n + 1)(1 - alpha)): the finite-sample quantile (Vovk et al., 2005; Angelopoulos and Bates, 2021,
"A Gentle Introduction to Conformal Prediction"). The set of a test example is every class with s(x, c) <= q.
If calibration and test examples are exchangeable, the true class is in the set with probability at least
1 - alpha (and below 1 - alpha + 1 / (n + 1) when the scores have no ties). When k > n no finite threshold
covers: q is infinite and every set holds every class (the record writes it as null: JSON has no infinity).

Scores (``SCORES``), each of the predictive p (raw or temperature scaled, the caller's choice):

- ``thr`` (alias ``lac``): 1 - p_c (Sadinle et al., 2019); the smallest sets on average; a set may be empty.
- ``aps``: the mass of every class ranked at or above c, p sorted in decreasing order (Romano et al., 2020), not
  randomised, so a prediction is deterministic and its coverage errs above 1 - alpha. Ties in p are ranked by
  class index (a stable sort), which keeps the score independent of the order of the classes' equal values
  only up to that convention.
- ``raps``: aps + lambda * max(rank - k_reg, 0), rank counted from 1 (Angelopoulos et al., 2021): classes
  beyond the k_reg-th most likely pay lambda each, which shortens the long tail of aps's sets.
- ``thr_mi``: (1 - p_c) / (beta + I(x)), I the members' mutual information (``sve.metrics.scores``). The
  normalised score of conformal regression (Papadopoulos et al., 2008) read for an ensemble: where the members
  agree (I near 0) the threshold on 1 - p is tight, where they disagree it is loose, so the set grows with the
  disagreement. beta (nats) keeps a set where the members agree from shrinking to nothing. Its coverage is the
  same guarantee: any score that is a fixed function of (x, c) is valid.

Mondrian or class-conditional guarantees are not offered; the class-conditional coverage is reported, so a
class that is under-covered shows.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

SCORES = ("thr", "aps", "raps", "thr_mi")
ALIASES = {"lac": "thr"}
ALPHAS = (0.1, 0.05)  # the levels a run reports
DEFAULTS = {"k_reg": 1, "lam": 0.01, "beta": 0.1}  # raps's k_reg and lambda (Angelopoulos et al.'s ImageNet ones)


def score_name(score: str) -> str:
    name = ALIASES.get(score, score)
    if name not in SCORES:
        raise ValueError(f"conformal score {score!r} is not offered; scores: {list(SCORES)} (lac = thr)")
    return name


def class_scores(probs: Tensor, score: str, mutual_information: Tensor | None = None, **options) -> Tensor:
    """s(x, c) for every example and class, (N, C) float64, of the predictive ``probs`` (N, C) (module
    docstring). ``options``: ``k_reg``, ``lam`` (raps), ``beta`` (thr_mi), else ``DEFAULTS``;
    ``mutual_information`` (N,): thr_mi's I(x)."""
    score, options = score_name(score), {**DEFAULTS, **options}
    probs = probs.detach().double()
    if score == "thr":
        return 1 - probs
    if score == "thr_mi":
        if mutual_information is None:
            raise ValueError("the thr_mi score needs the members' mutual information of every example")
        return (1 - probs) / (options["beta"] + mutual_information.detach().double().clamp_min(0))[:, None]
    ordered, order = probs.sort(dim=-1, descending=True, stable=True)
    ranked = ordered.cumsum(-1)  # the mass at or above each rank
    if score == "raps":
        rank = torch.arange(1, probs.shape[-1] + 1, dtype=torch.float64)
        ranked = ranked + options["lam"] * (rank - options["k_reg"]).clamp_min(0)
    return torch.empty_like(ranked).scatter_(-1, order, ranked)  # back to the classes' own order


def label_scores(probs: Tensor, labels: Tensor, score: str, mutual_information=None, **options) -> Tensor:
    """s(x, y) of each example's true label y, (N,)."""
    scores = class_scores(probs, score, mutual_information, **options)
    return scores.gather(-1, labels.long()[:, None]).squeeze(-1)


def rank(n: int, alpha: float) -> int:
    """k = ceil((n + 1)(1 - alpha)), the threshold's rank among n calibration scores. The product is rounded to
    nine digits first: (n + 1)(1 - alpha) is an integer for many n and alpha, and float rounding (1 - 0.1 is not
    0.9) would otherwise move k up by one."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha} is not a miscoverage level in (0, 1)")
    return math.ceil(round((n + 1) * (1 - alpha), 9))


def threshold(calibration_scores: Tensor, alpha: float) -> float:
    """The k-th smallest calibration score (``rank``); infinite when k > n (module docstring)."""
    n = calibration_scores.numel()
    if n == 0:
        raise ValueError("conformal calibration needs at least one labelled example")
    k = rank(n, alpha)
    return math.inf if k > n else float(calibration_scores.double().flatten().sort().values[k - 1])


def prediction_sets(probs: Tensor, q: float, score: str, mutual_information=None, **options) -> Tensor:
    """The sets, (N, C) bool: class c is in example i's set when s(x_i, c) <= q."""
    return class_scores(probs, score, mutual_information, **options) <= q


def set_metrics(sets: Tensor, labels: Tensor) -> dict:
    """Of sets (N, C) and labels (N,): ``coverage`` (fraction of sets holding the label), ``mean_size``,
    ``median_size``; ``size_stratified``: per set size that occurs, its example count and coverage (Angelopoulos
    et al., 2021: a score whose small sets under-cover and large ones over-cover adapts badly);
    ``class_conditional``: per true class its example count and coverage (None for a class with no example)."""
    labels = labels.long()
    covered = sets.gather(-1, labels[:, None]).squeeze(-1).double()
    sizes = sets.sum(-1)
    present = torch.unique(sizes)
    per_class = torch.bincount(labels, minlength=sets.shape[-1])
    class_covered = torch.zeros(sets.shape[-1], dtype=torch.float64).index_add_(0, labels, covered)
    return {
        "coverage": float(covered.mean()),
        "mean_size": float(sizes.double().mean()),
        "median_size": float(sizes.double().quantile(0.5)),  # the mean of the middle two for even N
        "size_stratified": {
            "size": present.tolist(),
            "count": [int((sizes == s).sum()) for s in present],
            "coverage": [float(covered[sizes == s].mean()) for s in present],
        },
        "class_conditional": {
            "count": per_class.tolist(),
            "coverage": [float(c / n) if n else None for c, n in zip(class_covered, per_class.tolist())],
        },
    }


def json_threshold(q: float) -> float | None:
    return None if math.isinf(q) else q


def record(
    calibration: tuple[Tensor, Tensor, Tensor | None],
    test: tuple[Tensor, Tensor, Tensor | None],
    calibration_split: str,
    test_split: str = "test",
    alphas=ALPHAS,
    scores=SCORES,
    **options,
) -> dict:
    """The conformal record of results.json and ``Ensemble.evaluate``: every score at every alpha fitted on
    ``calibration`` and measured on ``test``, each (probs (N, C), labels (N,), mutual information (N,) or None:
    thr_mi is left out without it). Keys of ``by_alpha`` are the alphas as strings ("0.1")."""
    options = {**DEFAULTS, **options}
    (cal_probs, cal_labels, cal_mi), (test_probs, test_labels, test_mi) = calibration, test
    with_mi = cal_mi is not None and test_mi is not None
    usable = [score_name(s) for s in scores if score_name(s) != "thr_mi" or with_mi]
    by_alpha = {}
    for alpha in alphas:
        for score in usable:
            q = threshold(label_scores(cal_probs, cal_labels, score, cal_mi, **options), alpha)
            sets = prediction_sets(test_probs, q, score, test_mi, **options)
            metrics = {"threshold": json_threshold(q), **set_metrics(sets, test_labels)}
            by_alpha.setdefault(str(alpha), {})[score] = metrics
    return {
        "calibration_split": calibration_split,
        "test_split": test_split,
        "calibration_examples": len(cal_labels),
        "test_examples": len(test_labels),
        "options": options,
        "by_alpha": by_alpha,
    }
