"""p-values that the verdicts' intervals invert, and Holm's correction over the family of strict comparisons."""

import numpy as np
import pytest

from sve.paper import bootstrap
from sve.paper.claims import HELD, LENIENT, REVERSED, STRICT, UNRESOLVED, Verdict, family, holm, holm_step_down
from sve.paper.evidence import Difference


def draws(shift: float, seeds: int = 3, n: int = 400, replicates: int = 500) -> bootstrap.Draws:
    rng = np.random.default_rng(0)
    points = shift / seeds + rng.normal(0, 0.02, seeds)  # (K,): each seed's share of the difference
    replicates_ = points + rng.normal(0, 0.03, (replicates, seeds)) / np.sqrt(seeds)
    return bootstrap.Draws(tuple(("u", s) for s in range(seeds)), points, replicates_)


@pytest.mark.parametrize("procedure", sorted(bootstrap.PROCEDURES))
@pytest.mark.parametrize("shift", [0.02, 0.1, -0.3])
def test_the_p_value_is_where_the_interval_reaches_zero(shift, procedure):
    found = draws(shift)
    p = bootstrap.p_value(found, procedure=procedure)
    if p > 1e-9:  # the (1 - p) interval touches 0 (below that, 1 - p is 1 to float precision)
        low, high = bootstrap.bounds(found, 1 - p, procedure)
        assert min(abs(float(low)), abs(float(high))) == pytest.approx(0, abs=1e-6)
    low95, high95 = bootstrap.bounds(found, 0.95, procedure)
    assert (p < 0.05) == (float(low95) > 0 or float(high95) < 0)  # the 95% verdict and p < 0.05 agree


def test_the_verdicts_p_value_is_the_verdict_procedures():
    found = draws(0.1)
    assert bootstrap.p_value(found) == bootstrap.p_value(found, procedure=bootstrap.VERDICTS)
    assert bootstrap.p_value(found, procedure="seed_level") != bootstrap.p_value(found, procedure="combined")
    with pytest.raises(ValueError, match="not one of"):
        bootstrap.bounds(found, 0.95, "percentile")


def verdict(p: float, word: str, kind: str = STRICT, training: bool = True) -> Verdict:
    d = Difference(1.0 if word == HELD else -1.0, 0.1, 0.2, training, p)
    return Verdict("s", f"p={p}", "NLL", "", word == HELD, word == UNRESOLVED, word, [d], kind=kind)


def test_holm_keeps_the_small_p_values_and_leaves_the_rest_unresolved():
    # m = 4 at 5%: thresholds 0.0125, 0.0167, 0.025, 0.05 in order of p. 0.01 passes, 0.02 fails its 0.0167
    # and stops the procedure, so 0.021 and 0.03 (each held at 95% alone) become unresolved.
    found = [verdict(0.03, HELD), verdict(0.01, REVERSED), verdict(0.021, HELD), verdict(0.02, HELD)]
    adjusted = holm(found)
    assert [adjusted[id(v)] for v in found] == [UNRESOLVED, REVERSED, UNRESOLVED, UNRESOLVED]
    one = verdict(0.049, HELD)
    assert holm([one])[id(one)] == HELD  # a family of one: Holm is the plain test


def test_the_step_down_rejects_where_holms_adjusted_p_value_is_below_alpha():
    # The other textbook form of Holm: adjusted p of the i-th smallest = max over j <= i of (m - j) * p_(j).
    rng = np.random.default_rng(1)
    for _ in range(200):
        m = int(rng.integers(1, 8))
        p = list(rng.choice([0.001, 0.004, 0.01, 0.02, 0.03, 0.049, 0.2], m) * rng.uniform(0.5, 1.5, m))
        order = np.argsort(p, kind="stable")
        adjusted_p = np.maximum.accumulate([(m - i) * p[k] for i, k in enumerate(order)])
        expected = [UNRESOLVED] * m
        for i, k in enumerate(order):
            expected[k] = HELD if adjusted_p[i] <= 0.05 else UNRESOLVED
        assert holm_step_down(p, [HELD] * m) == expected


def test_the_family_leaves_out_lenient_one_seed_and_trend_verdicts():
    kept = verdict(0.01, HELD)
    lenient = verdict(0.01, HELD, kind=LENIENT)
    one_seed = verdict(0.01, HELD, training=False)
    trend = verdict(0.01, HELD)
    trend.differences = [trend.differences[0], trend.differences[0]]
    assert family([kept, lenient, one_seed, trend]) == [kept]


def test_the_summary_counts_one_seed_rows_apart_and_splits_not_worse_from_better():
    from sve.paper.claims_text import summary

    def lenient(low: float) -> Verdict:
        v = verdict(0.01, HELD, kind=LENIENT)
        v.differences = [Difference(0.5, low, 1.0, True, 0.01)]
        return v

    text = summary([verdict(0.01, HELD), verdict(0.01, HELD, training=False), lenient(0.2), lenient(-0.1)])
    assert 'Strict ("better"): of 1 with a 95% interval, held in 1' in text  # the one-seed row is not in it
    assert "Not counted above: 1 comparisons of one-seed rows, whose intervals cover the test set only" in text
    assert "Of those 2 held, 1 also better (interval above 0) and 1 not worse only (interval containing 0)." in text
