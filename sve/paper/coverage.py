"""How often each interval procedure of ``sve.paper.bootstrap`` covers a known difference: a simulation at the
miniature's sizes (3 seeds; 120, 872 and 1,000 test examples), used by the tests and by the README's procedure
paragraph (``make mini-report``), so the coverage it states is measured, not assumed.

**The data.** A binary task scored by two rows, A and B, each trained with S seeds and evaluated on the same n
test examples (as every seed of the miniature is). Run (row R, seed s) puts the logit margin

    x_{R,s,i} = m_R + z_i + v_{R,i} + u_{R,s} + e_{R,s,i}

on example i: ``z_i ~ N(mu, sd_z^2)`` its difficulty, shared by every run (the rows' pairing); ``v_{R,i} ~ N(0,
sd_v^2)`` how row R suits it, shared by R's seeds (the test-set noise common to all seeds); ``u_{R,s} ~ N(0,
tau^2)`` how well that training went (the seed-to-seed variance of training); ``e_{R,s,i} ~ N(0, sd_e^2)`` which
examples that training happens to get right (the test-set noise that differs between seeds). The run is correct
where x > 0 and its NLL is log(1 + exp(-x)). Every term but m_R is Gaussian, so over new examples and new
trainings x is N(mu + m_R, s^2) with s^2 = sd_z^2 + sd_v^2 + tau^2 + sd_e^2, and the true differences are
exact: Phi((mu + m_A) / s) - Phi((mu + m_B) / s) in accuracy, and in NLL the difference of E log(1 + exp(-x))
(Gauss-Hermite quadrature, exact to float precision).

**The study.** ``datasets`` data sets are drawn per scenario (size and tau); every procedure gets each one's
per-seed differences on ``replicates`` resamples, and coverage is the fraction of data sets whose interval
contains the true difference. Each procedure keeps one generator seed for every data set, as the claims do for
every comparison, so the resamples are the same matrices for all data sets and are drawn once (one matrix
product per size instead of one per data set): the procedures are exactly ``sve.paper.bootstrap``'s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from sve.paper import bootstrap

SIZES = (120, 872, 1000)  # ARC-Easy's questions, SST-2's sentences, CIFAR-10's images
SEEDS = 3
DATASETS = 400
REPLICATES = 400
# Seed-to-seed sd of a run's logit margin. At 872 examples a seed's accuracy difference then varies by training
# 0, 1.1 and 3.4 times as much as by the test set (NLL: 0, 1.8 and 5.4 times; at 120 examples 0 to 1.3 times).
TAUS = (0.0, 0.1, 0.3)
PROCEDURES = {
    "per_seed": "every seed resampled apart (the procedure before)",
    "joint": "one resample for every seed, runs fixed",
    "hierarchical": "one resample, seeds resampled too",
    "combined": "one resample, and the seeds' spread beyond the test set's at Student's t",
    "seed_level": "one resample for the shared test-set noise, the seeds' whole spread at Student's t (the verdicts')",
}


@dataclass(frozen=True)
class Scenario:
    """The variance components of the simulation (module docstring), in logit units. The defaults give rows
    near 80% accuracy whose seeds agree on about 90% of the examples, A ahead of B by about 1.3 points."""

    n: int
    tau: float
    seeds: int = SEEDS
    mu: float = 2.7
    sd_z: float = 3.0
    sd_v: float = 0.6
    sd_e: float = 0.8
    m_a: float = 0.15
    m_b: float = 0.0

    @property
    def scale(self) -> float:
        return float(np.sqrt(self.sd_z**2 + self.sd_v**2 + self.tau**2 + self.sd_e**2))

    def truth(self) -> dict[str, float]:
        """A's true advantage over B, in accuracy and in NLL (positive: A better)."""
        from scipy import stats

        x, w = np.polynomial.hermite_e.hermegauss(120)  # nodes and weights for the standard normal
        w = w / w.sum()

        def nll(m: float) -> float:
            return float(np.sum(w * np.logaddexp(0.0, -(self.mu + m + self.scale * x))))

        acc = stats.norm.cdf((self.mu + self.m_a) / self.scale) - stats.norm.cdf((self.mu + self.m_b) / self.scale)
        return {"acc": float(acc), "nll": nll(self.m_b) - nll(self.m_a)}

    def draw(self, rng: np.random.Generator, datasets: int) -> dict[str, np.ndarray]:
        """Per-example advantages of A over B, (datasets, seeds, n) per metric."""

        def normal(mean: float, sd: float, shape: tuple) -> np.ndarray:  # float32: half the time of float64
            return rng.standard_normal(shape, dtype=np.float32) * np.float32(sd) + np.float32(mean)

        z = normal(self.mu, self.sd_z, (datasets, 1, self.n))
        margins = []
        for m in (self.m_a, self.m_b):
            v = normal(0.0, self.sd_v, (datasets, 1, self.n))
            u = normal(0.0, self.tau, (datasets, self.seeds, 1))
            e = normal(m, self.sd_e, (datasets, self.seeds, self.n))
            margins.append(z + v + u + e)
        a, b = margins
        return {
            "acc": (a > 0).astype(np.float32) - (b > 0).astype(np.float32),
            "nll": (np.logaddexp(0.0, -b) - np.logaddexp(0.0, -a)).astype(np.float32),
        }


def study(
    scenario: Scenario, datasets: int = DATASETS, replicates: int = REPLICATES, level: float = 0.95, seed: int = 0
) -> dict[str, dict[str, float]]:
    """{metric: {procedure: coverage}} over ``datasets`` simulated data sets of ``scenario``."""
    rng = np.random.default_rng(seed)
    values = scenario.draw(rng, datasets)
    truth = scenario.truth()
    s, n = scenario.seeds, scenario.n
    # One resample of the examples per replicate, the same for every seed (joint); one per seed (per_seed).
    joint = bootstrap.resample_counts(rng, n, replicates).astype(np.float32) / n
    apart = np.stack([bootstrap.resample_counts(rng, n, replicates).astype(np.float32) / n for _ in range(s)])
    columns = tuple(("", k) for k in range(s))
    out = {}
    for metric, per_example in values.items():
        points = per_example.mean(-1, dtype=np.float64) / s  # (D, S): each seed's column, coef 1/S
        shared = (joint @ per_example.reshape(-1, n).T).reshape(replicates, datasets, s) / s  # (R, D, S)
        separate = np.matmul(apart, per_example.transpose(1, 2, 0)).transpose(1, 2, 0) / s  # (R, D, S)
        draws = bootstrap.Draws(columns, points, shared.astype(np.float64))
        bounds = {
            "per_seed": bootstrap.percentile(bootstrap.Draws(columns, points, separate.astype(np.float64)), level),
            "joint": bootstrap.percentile(draws, level),
            "hierarchical": bootstrap.hierarchical(draws, level),
            "combined": bootstrap.combined(draws, level),
            "seed_level": bootstrap.seed_level(draws, level),
        }
        out[metric] = {
            name: float(np.mean((low <= truth[metric]) & (truth[metric] <= high)))
            for name, (low, high) in bounds.items()
        }
    return out


@functools.lru_cache(maxsize=4)
def coverage_table(
    sizes: tuple[int, ...] = SIZES,
    taus: tuple[float, ...] = TAUS,
    datasets: int = DATASETS,
    replicates: int = REPLICATES,
) -> dict[tuple[int, float, str], dict[str, float]]:
    """{(n, tau, metric): {procedure: coverage}} for every scenario (each from its own generator seed)."""
    table = {}
    for i, n in enumerate(sizes):
        for j, tau in enumerate(taus):
            found = study(Scenario(n, tau), datasets, replicates, seed=100 * i + j)
            table.update({(n, tau, metric): c for metric, c in found.items()})
    return table


def coverage_range(procedure: str, **kwargs) -> tuple[float, float]:
    """The lowest and highest coverage of ``procedure`` over every scenario and metric."""
    values = [c[procedure] for c in coverage_table(**kwargs).values()]
    return min(values), max(values)


__all__ = ["Scenario", "study", "coverage_table", "coverage_range", "SIZES", "TAUS", "PROCEDURES"]
