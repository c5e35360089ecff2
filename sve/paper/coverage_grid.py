"""The interval procedures' coverage over the regimes the committed comparisons occupy: ``make mini-coverage-grid``
writes ``results/mini/diagnostics/coverage_grid`` (a JSON of every cell and a README with its table).

``sve.paper.coverage`` checks the procedures at the miniature's sizes with three training spreads, every seed
seeing mostly the same test-set noise. The real comparisons also sit where that noise differs between seeds
(an ECE, whose bins every training fills differently) and where training varies several times more than the
test set. So this grid varies, for each metric:

- ``share``: the part of the test-set noise common to every seed of a row, from 0 (every training gets other
  examples right) to 1 (the seeds differ by training only);
- ``spread``: the training's sd of one seed's accuracy difference as a multiple of the test set's, 0 to 5;
- ``seeds``: 2, 3 and 5;
- the metric: accuracy, NLL, ECE and an OOD AUROC.

**The data** extend ``sve.paper.coverage.Scenario``'s margins x = mu + m_R + z_i + v_{R,i} + u_{R,s} + e_{R,s,i}
(correct where x > 0) with sd_v^2 = share and sd_e^2 = 1 - share (the test-set noise's variance, 1, split),
and with what ECE and AUROC need. A run's confidence is sigmoid(k_R |x|): k = 0.5 would be close to calibrated
(the log-odds of being right at margin x is 2 mu x / s^2), and rows A and B are overconfident by different
amounts. Its OOD examples have margins of the same kind about a lower mean (mu_ood_R, sharing the run's u), and
its AUROC separates in-distribution from OOD examples by that confidence, i.e. by |x|.

**The truth** is the population difference averaged over trainings: E_u[metric_A(u)] - E_u[metric_B(u)], each
metric of a run with training effect u computed by quadrature over its margin's normal law (ECE with the
runs' own 15 right-closed bins), and u integrated by Gauss-Hermite. Signs are A's advantage (acc and AUROC
A - B; NLL and ECE B - A). The sample ECE overestimates a population ECE by a bias that depends on the run
(``ece_bias`` in the table); an interval for the difference of sample ECEs covers the population difference
only where the two rows' biases nearly cancel, which the grid measures rather than assumes.

**The procedures** (``sve.paper.bootstrap``): ``combined`` (the verdicts' until this grid) and ``seed_level``,
both on one joint resample of the test examples per replicate (and of the OOD examples, a separate stratum),
the same resamples for every data set. The resamples are fewer than a verdict's (``REPLICATES``), which only
adds noise to the variance each interval estimates, so the grid's coverage is, if anything, understated.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass

import numpy as np
from scipy import sparse, stats

from sve.paper import bootstrap

SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
SPREADS = (0.0, 1.0, 5.0)
SEED_COUNTS = (2, 3, 5)
METRICS = ("acc", "nll", "ece", "ood_auroc")
PROCEDURES = {
    "combined": "test set at z (all of it), the training excess at t",
    "seed_level": "test-set noise shared by the seeds at z, every seed-level variance at t",
}
N = 500  # test and OOD examples: ARC-Easy's sized test set, the smallest of the committed three-seed tables
DATASETS = 2000
REPLICATES = 200
LEVEL = 0.95
TARGET = 0.93


@dataclass(frozen=True)
class Cell:
    """One regime: the variance split (share), the training spread, the seeds and the metric."""

    share: float
    spread: float
    seeds: int
    metric: str
    n: int = N
    mu: float = 2.7
    sd_z: float = 3.0
    m_a: float = 0.15
    m_b: float = 0.0
    k_a: float = 0.6  # confidence slopes: both rows overconfident, B more so
    k_b: float = 0.75
    mu_ood_a: float = 0.3  # OOD margins' means: A's OOD examples sit closer to the boundary (A detects better)
    mu_ood_b: float = 0.5

    @property
    def sd_v(self) -> float:
        return float(np.sqrt(self.share))

    @property
    def sd_e(self) -> float:
        return float(np.sqrt(1.0 - self.share))

    @property
    def sd_within(self) -> float:
        """The sd of a trained run's margins over examples: difficulty plus test-set noise."""
        return float(np.sqrt(self.sd_z**2 + 1.0))

    def tau(self) -> float:
        """The training sd of a run's margin that makes the training's sd of one seed's accuracy difference
        ``spread`` times the test set's (the latter: the binomial sd of that difference over test sets, from
        the per-example variance of the two rows' correctness difference at this share)."""
        if self.spread == 0:
            return 0.0
        s = self.sd_within
        slope = stats.norm.pdf((self.mu + (self.m_a + self.m_b) / 2) / s) / s  # d accuracy / d margin shift
        test_sd = float(np.sqrt(_correct_difference_variance(self) / self.n))
        return self.spread * test_sd / (np.sqrt(2.0) * slope)


def _correct_difference_variance(cell: Cell) -> float:
    """Var over examples of 1[x_A > 0] - 1[x_B > 0] for one seed of each row (Monte Carlo, 400k examples, fixed
    seed): what the test set's sampling does to one seed's accuracy difference, per example."""
    rng = np.random.default_rng(12345)
    z = rng.normal(cell.mu, cell.sd_z, 400_000)
    a = z + cell.m_a + rng.normal(0, 1.0, z.shape)
    b = z + cell.m_b + rng.normal(0, 1.0, z.shape)
    return float(np.var((a > 0).astype(float) - (b > 0)))


# --- the truth -------------------------------------------------------------------------------------------------

_GRID = np.linspace(-60.0, 60.0, 240_001)  # margins for the quadratures (step 5e-4)


def _population(metric: str, mean: float, sd: float, k: float, mean_ood: float) -> float:
    """A trained run's population metric: margins N(mean, sd^2) in distribution, N(mean_ood, sd^2) OOD."""
    x = _GRID
    density = stats.norm.pdf(x, mean, sd) * (x[1] - x[0])
    if metric == "acc":
        return float(density[x > 0].sum())
    if metric == "nll":
        return float(np.sum(density * np.logaddexp(0.0, -x)))
    if metric == "ece":
        confidence = 1.0 / (1.0 + np.exp(-k * np.abs(x)))
        bins = bootstrap.ece_bins(confidence)
        gaps = np.bincount(bins, weights=density * ((x > 0) - confidence), minlength=bootstrap.N_BINS)
        return float(np.abs(gaps).sum())
    if metric == "ood_auroc":  # P(|X| > |Y|): the in-distribution example is the more confident
        a = np.abs(x[x >= 0])
        folded_in = stats.norm.pdf(a, mean, sd) + stats.norm.pdf(-a, mean, sd)
        folded_ood_cdf = stats.norm.cdf(a, mean_ood, sd) - stats.norm.cdf(-a, mean_ood, sd)
        return float(np.sum(folded_in * folded_ood_cdf) * (x[1] - x[0]))
    raise ValueError(f"metric {metric!r} is not in the grid; choose one of {list(METRICS)}")


def truth(cell: Cell) -> float:
    """A's true advantage over B in ``cell.metric``, averaged over trainings (Gauss-Hermite, 40 nodes)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(40)
    weights = weights / weights.sum()
    tau, sd = cell.tau(), cell.sd_within

    def expected(m: float, k: float, mu_ood: float) -> float:
        return float(
            sum(
                w * _population(cell.metric, cell.mu + m + tau * u, sd, k, mu_ood + tau * u)
                for u, w in zip(nodes, weights)
            )
        )

    a = expected(cell.m_a, cell.k_a, cell.mu_ood_a)
    b = expected(cell.m_b, cell.k_b, cell.mu_ood_b)
    return a - b if cell.metric in ("acc", "ood_auroc") else b - a


# --- the simulated data sets -----------------------------------------------------------------------------------


def margins(cell: Cell, rng: np.random.Generator, datasets: int, mean_of: dict, ood: bool = False) -> dict:
    """Each row's margins, (datasets, seeds, n), for in-distribution (``ood`` False) or OOD examples; ``mean_of``
    gives each row's mean shift, and the rows' u (training) is drawn by the caller and added after."""
    shape = (datasets, 1, cell.n)
    z = rng.normal(cell.mu if not ood else 0.0, cell.sd_z, shape)
    out = {}
    for row in ("a", "b"):
        v = rng.normal(0.0, cell.sd_v, shape)
        e = rng.normal(0.0, cell.sd_e, (datasets, cell.seeds, cell.n))
        out[row] = z + v + e + mean_of[row]
    return out


def per_seed_values(cell: Cell, rng: np.random.Generator, datasets: int, joint: np.ndarray, joint_ood: np.ndarray):
    """(points (D, S), replicates (R, D, S)) of A's per-seed advantage in ``cell.metric``, each column with its
    coefficient 1/S (the difference of the seeds' means), on the full sets and on the replicates' resamples
    (``joint``: (R, n) counts shared by every seed, row and data set; ``joint_ood`` likewise for OOD examples)."""
    tau, s, n = cell.tau(), cell.seeds, cell.n
    u = {row: rng.normal(0.0, tau, (datasets, s, 1)) for row in ("a", "b")}
    inside = margins(cell, rng, datasets, {"a": cell.m_a, "b": cell.m_b})
    inside = {row: inside[row] + u[row] for row in inside}
    k = {"a": cell.k_a, "b": cell.k_b}
    sign = 1.0 if cell.metric in ("acc", "ood_auroc") else -1.0  # advantage = sign * (A - B)
    if cell.metric in ("acc", "nll"):
        per_example = {
            row: ((x > 0).astype(np.float64) if cell.metric == "acc" else np.logaddexp(0.0, -x))
            for row, x in inside.items()
        }
        d = sign * (per_example["a"] - per_example["b"])  # (D, S, n)
        points = d.mean(-1) / s
        replicates = (joint @ d.reshape(-1, n).T).reshape(len(joint), datasets, s) / (n * s)
        return points, replicates
    if cell.metric == "ece":
        values = {row: _ece_columns(x, k[row], joint) for row, x in inside.items()}
    else:
        outside = margins(cell, rng, datasets, {"a": cell.mu_ood_a, "b": cell.mu_ood_b}, ood=True)
        values = {row: _auroc_columns(inside[row], outside[row] + u[row], joint, joint_ood) for row in inside}
    (full_a, rep_a), (full_b, rep_b) = values["a"], values["b"]
    return sign * (full_a - full_b) / s, sign * (rep_a - rep_b) / s


def _ece_columns(x: np.ndarray, k: float, joint: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ECE of every (data set, seed) column, (D, S), and on every resample, (R, D, S): per-bin weighted sums of
    correct - confidence through one sparse product (each example is in one bin of its column)."""
    d, s, n = x.shape
    confidence = 1.0 / (1.0 + np.exp(-k * np.abs(x)))
    gap = ((x > 0) - confidence).reshape(-1, n)  # (D*S, n)
    bins = bootstrap.ece_bins(confidence.ravel()).reshape(-1, n)
    column = (np.arange(d * s)[:, None] * bootstrap.N_BINS + bins).ravel()
    rows = np.tile(np.arange(n), d * s)
    by_bin = sparse.csr_matrix((gap.ravel(), (rows, column)), shape=(n, d * s * bootstrap.N_BINS))
    full = np.abs(np.asarray(by_bin.sum(0)).reshape(d * s, bootstrap.N_BINS)).sum(-1) / n
    resampled = np.abs(np.asarray(by_bin.T.dot(joint.T).T).reshape(len(joint), d * s, bootstrap.N_BINS)).sum(-1) / n
    return full.reshape(d, s), resampled.reshape(len(joint), d, s)


def _auroc_columns(x: np.ndarray, y: np.ndarray, joint: np.ndarray, joint_ood: np.ndarray, chunk: int = 32):
    """AUROC of |x| (in distribution, positive) against |y| (OOD) for every column, on the full sets and with
    resample counts as weights: w^T H w' / (W W'), H_ij = 1 where in-example i is scored above OOD example j
    (continuous scores, so no ties). Counts and their products are whole numbers below 2^24, so float32 matrix
    products give them exactly."""
    d, s, n = x.shape
    a, b = np.abs(x).reshape(-1, n), np.abs(y).reshape(-1, n)
    w_in, w_ood = joint.astype(np.float32), joint_ood.astype(np.float32)
    full = np.empty(len(a))
    resampled = np.empty((len(joint), len(a)))
    for start in range(0, len(a), chunk):
        cols = slice(start, min(start + chunk, len(a)))
        above = (a[cols, :, None] > b[cols, None, :]).astype(np.float32)  # (chunk, n, n)
        full[cols] = above.sum((1, 2)) / (n * n)
        weighted = np.matmul(w_in, above)  # (chunk, R, n): per OOD example, the drawn in-examples above it
        resampled[:, cols] = (weighted * w_ood).sum(-1, dtype=np.float64).T / (n * n)  # counts sum to n
    return full.reshape(d, s), resampled.reshape(len(joint), d, s)


# --- the study -------------------------------------------------------------------------------------------------


def study(cell: Cell, datasets: int = DATASETS, replicates: int = REPLICATES, level: float = LEVEL, seed: int = 0):
    """{procedure: coverage} of ``cell`` over ``datasets`` simulated data sets, with the truth and timings."""
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    joint = bootstrap.resample_counts(rng, cell.n, replicates)
    joint_ood = bootstrap.resample_counts(rng, cell.n, replicates)
    points, replicated = per_seed_values(cell, rng, datasets, joint, joint_ood)
    draws = bootstrap.Draws(tuple(("", k) for k in range(cell.seeds)), points, replicated)
    targets = {"population": truth(cell)}
    if cell.metric == "ece":  # the plug-in ECE is biased: also the difference a test set of n measures on average
        targets["at_n"] = expected_at_n(cell, seed=seed + 1)
    coverage, width = {}, {}
    for name in PROCEDURES:
        low, high = getattr(bootstrap, name)(draws, level)
        coverage[name] = {k: float(np.mean((low <= v) & (v <= high))) for k, v in targets.items()}
        width[name] = float(np.mean(high - low))  # what a procedure's coverage costs in resolution
    return {
        "cell": asdict(cell),
        "tau": cell.tau(),
        "truth": targets,
        "mean_estimate": float(draws.point.mean()),
        "datasets": datasets,
        "replicates": replicates,
        "coverage": coverage,
        "width": width,
        "seconds": time.perf_counter() - started,
    }


def expected_at_n(cell: Cell, datasets: int = 2 * DATASETS, seed: int = 1) -> float:
    """The expected difference of the sample metric on n examples (over test sets and trainings), estimated from
    ``datasets`` fresh data sets (full sets only): for ECE, what the verdicts' point estimates aim at."""
    rng = np.random.default_rng(seed)
    none = np.ones((1, cell.n))
    points, _ = per_seed_values(cell, rng, datasets, none, none)
    return float(points.sum(-1).mean())


def cells(shares=SHARES, spreads=SPREADS, seed_counts=SEED_COUNTS, metrics=METRICS, n: int = N) -> list[Cell]:
    return [Cell(sh, sp, s, m, n) for m, s, sh, sp in itertools.product(metrics, seed_counts, shares, spreads)]


def read(path) -> dict[tuple, dict]:
    """The cells a run of the grid wrote (``cells.jsonl``, one JSON object a line), by (metric, seeds, share,
    spread, n); empty when the file is absent."""
    import json
    from pathlib import Path

    path = Path(path)
    if not path.exists():
        return {}
    return {key(r["cell"]): r for r in map(json.loads, path.read_text().splitlines()) if r}


def key(cell: dict) -> tuple:
    return (cell["metric"], cell["seeds"], cell["share"], cell["spread"], cell["n"])


def targets(result: dict) -> list[str]:
    """What a cell's verdicts aim at: the population difference, or for ECE (whose plug-in is biased) the
    expected difference of the sample ECEs at the cell's size."""
    return ["at_n"] if result["cell"]["metric"] == "ece" else ["population"]


def summary(results: list[dict]) -> dict[str, dict]:
    """Per procedure: its lowest coverage, that cell's key, and how many cells fall below ``TARGET``; and
    ``chosen``, the procedure with the highest lowest coverage (fewest cells below as the tie-break)."""
    out = {}
    for p in PROCEDURES:
        worst = min((r["coverage"][p][t], key(r["cell"])) for r in results for t in targets(r))
        below = sum(r["coverage"][p][t] < TARGET for r in results for t in targets(r))
        out[p] = {"lowest": worst[0], "cell": worst[1], "below": below}
    chosen = max(PROCEDURES, key=lambda p: (out[p]["lowest"], -out[p]["below"]))
    return {"procedures": out, "chosen": chosen, "cells": sum(len(targets(r)) for r in results)}


def binomial_band(level: float, datasets: int) -> tuple[float, float]:
    """The central 95% range of a coverage estimate from ``datasets`` data sets when the truth is ``level``."""
    low, high = stats.binom.ppf([0.025, 0.975], datasets, level)
    return float(low / datasets), float(high / datasets)


__all__ = [
    "Cell",
    "truth",
    "study",
    "cells",
    "read",
    "summary",
    "binomial_band",
    "SHARES",
    "SPREADS",
    "SEED_COUNTS",
    "METRICS",
]
