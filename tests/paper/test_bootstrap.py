"""Paired-bootstrap intervals of the claims (sve.paper.bootstrap, sve.paper.claims): known answers (a difference of
exactly d per seed, identical rows, a much worse row), every resampled metric equal to the project's metric on the
full and on the materialised resample, pairing that narrows the interval, reproducibility, coverage near 95% when the
true difference is 0, the evaluation writing the files, and the claims pipeline end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from sve.errors import InputError
from sve.metrics.scores import OODDetection, predictive_metrics
from sve.paper import bootstrap
from sve.paper.bootstrap import Term, interval, statistic
from sve.paper.claims import HELD, NOT_HELD, REVERSED, UNRESOLVED, decide, judge
from sve.paper.claims_text import to_markdown
from sve.paper.evidence import Difference
from sve.paper.store import load_runs
from sve.runs import prediction_files
from sve.runs.prediction_files import Examples
from tests.metrics.test_metrics import reference
from tests.paper.test_report import write_run


def random_probs(rng, n: int, c: int, scale: float = 2.0) -> np.ndarray:
    z = rng.normal(size=(n, c)) * scale
    p = np.exp(z - z.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True)


def flip(probs: np.ndarray, labels: np.ndarray, k: int, to_correct: bool, rng) -> np.ndarray:
    """``probs`` with k examples that were wrong (``to_correct``) or right made confidently right or wrong."""
    correct = probs.argmax(1) == labels
    chosen = rng.choice(np.flatnonzero(~correct if to_correct else correct), size=k, replace=False)
    out = probs.copy()
    c = probs.shape[1]
    for i in chosen:
        target = labels[i] if to_correct else (labels[i] + 1) % c
        out[i] = 0.1 / (c - 1)
        out[i, target] = 0.9
    return out


def examples(name: str, probs: np.ndarray, labels: np.ndarray) -> Examples:
    return Examples.from_predictive(name, torch.from_numpy(probs), torch.from_numpy(labels))


def paired_terms(key: str, pairs: list[tuple[Examples, Examples]], sign: float = 1.0) -> list[Term]:
    """(1/S) sum_s sign * [metric(A_s) - metric(B_s)], seed s pairing A_s with B_s."""
    terms = []
    for seed, (a, b) in enumerate(pairs):
        coef = sign / len(pairs)
        terms += [Term(coef, seed, statistic(key, [a])), Term(-coef, seed, statistic(key, [b]))]
    return terms


def verdict(found: bootstrap.Interval, kind: str = "better", tolerance: float = 0.0) -> str:
    return decide(kind, [Difference(found.point, found.low, found.high)], tolerance)[0]


# --- (a) known answers -------------------------------------------------------------------------------------


def test_a_difference_of_exactly_d_on_every_seed_lies_above_zero_and_contains_d():
    rng = np.random.default_rng(0)
    n, k = 400, 40  # A is B with 40 wrong predictions made right: accuracy higher by exactly d = 0.1 on each seed
    pairs = []
    for _ in range(3):
        labels = rng.integers(0, 3, n)
        b = random_probs(rng, n, 3)
        pairs.append((examples("test", flip(b, labels, k, True, rng), labels), examples("test", b, labels)))
    found = interval(paired_terms("acc", pairs))
    d = k / n
    assert found.point == pytest.approx(d, abs=1e-12)
    assert 0 < found.low <= d <= found.high
    assert verdict(found) == HELD and verdict(found, "worse") == REVERSED and verdict(found, "not_worse") == HELD


def test_identical_rows_give_an_interval_of_zero_and_no_verdict_either_way():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 4, 300)
    probs = random_probs(rng, 300, 4)
    for key in bootstrap.CLASSIFICATION:
        found = interval(paired_terms(key, [(examples("test", probs, labels), examples("test", probs, labels))]))
        assert (found.point, found.low, found.high) == (0.0, 0.0, 0.0), key
        assert verdict(found) == UNRESOLVED and verdict(found, "worse") == UNRESOLVED
        assert verdict(found, "not_worse") == UNRESOLVED  # margin 0: [0, 0] does not lie above -0
        assert verdict(found, "not_worse", 1.0) == HELD


def test_a_much_worse_row_is_reversed():
    rng = np.random.default_rng(2)
    pairs = []
    for _ in range(3):
        labels = rng.integers(0, 3, 300)
        b = random_probs(rng, 300, 3, scale=4.0)
        pairs.append((examples("test", flip(b, labels, 60, False, rng), labels), examples("test", b, labels)))
    for key, sign in (("acc", 1.0), ("nll", -1.0), ("brier", -1.0)):  # sign: positive = A better
        found = interval(paired_terms(key, pairs, sign))
        assert found.high < 0, key
        assert verdict(found) == REVERSED and verdict(found, "not_worse") == REVERSED
        assert verdict(found, "worse") == HELD
    acc = interval(paired_terms("acc", pairs))
    assert verdict(acc, "not_worse", 0.5 * abs(acc.point)) == REVERSED  # trails by twice the margin
    # Well within a wide margin, but behind: a difference below 0 is never held.
    assert verdict(acc, "not_worse", 2.0 * abs(acc.high - acc.low) + abs(acc.point)) == UNRESOLVED


# (kind, margin, point, low, high) -> verdict, and whether the interval contains its threshold (0, or -margin).
DECISIONS = [
    ("better", 0, 1.0, 0.5, 1.5, HELD, False),
    ("better", 0, 0.1, -0.5, 0.7, UNRESOLVED, True),
    ("better", 0, -1.0, -1.5, -0.5, REVERSED, False),
    ("better", 0, 0.5, 0.0, 1.0, UNRESOLVED, True),  # touching 0 is not above it
    ("worse", 0, -1.0, -1.5, -0.5, HELD, False),
    ("worse", 0, 1.0, 0.5, 1.5, REVERSED, False),
    ("gain", 0, -1.0, -1.5, -0.5, REVERSED, False),
    ("not_worse", 1.0, 0.2, -0.8, 1.2, HELD, False),  # within the margin, the point not below 0
    ("not_worse", 1.0, 0.0, -0.5, 0.5, HELD, False),  # a tie within the margin
    ("not_worse", 1.0, -0.3, -0.8, 0.2, UNRESOLVED, False),  # within the margin, but the point is worse: never held
    ("not_worse", 1.0, -0.6, -0.9, -0.3, UNRESOLVED, False),  # surely worse, by less than the margin
    ("not_worse", 1.0, 0.4, -1.2, 2.0, UNRESOLVED, True),  # the interval reaches past the margin
    ("not_worse", 1.0, -2.0, -2.5, -1.5, REVERSED, False),  # worse by more than the margin
    ("not_worse", 0.0, 0.3, -0.1, 0.7, UNRESOLVED, True),  # margin 0: "better or equal" needs the interval above 0
]


@pytest.mark.parametrize("kind, margin, point, low, high, expected, straddles", DECISIONS)
def test_decide_table_of_cases(kind, margin, point, low, high, expected, straddles):
    assert decide(kind, [Difference(point, low, high)], margin) == (expected, straddles)


def test_a_trend_holds_only_when_every_step_does_and_a_wrong_point_is_never_held():
    up, down, across = Difference(1.0, 0.5, 1.5), Difference(-1.0, -1.5, -0.5), Difference(0.1, -0.5, 0.7)
    assert decide("trend", [up, up])[0] == HELD and decide("trend", [up, across])[0] == UNRESOLVED
    assert decide("trend", [up, down])[0] == REVERSED
    # An asymmetric interval (never produced by the verdicts' procedure, but possible from another) with its point
    # on the wrong side is not held either.
    assert decide("better", [Difference(-0.1, 0.05, 0.3)])[0] == UNRESOLVED
    assert decide("worse", [Difference(0.1, -0.3, -0.05)])[0] == UNRESOLVED


# --- (b) the point estimate is the project's metric ------------------------------------------------------------


def awkward_probs(rng, n: int = 600, c: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Random predictives with confidences exactly on ECE bin edges, tied maxima and a zero-probability label."""
    probs = random_probs(rng, n, c)
    for i, m in enumerate(range(1, 16)):  # confidence m/15 (>= 1/c), the rest spread evenly
        conf = max(m / 15, 1 / c)
        probs[i] = (1 - conf) / (c - 1)
        probs[i, i % c] = conf
    probs[20] = [0.5, 0.5, 0.0, 0.0]  # a tie: the first maximum is the prediction
    probs[21] = [0.0, 1.0, 0.0, 0.0]
    labels = rng.integers(0, c, n)
    labels[21] = 0  # probability 0 on the label: NLL clamped at 1e-12
    return probs, labels


def test_the_point_estimate_of_every_metric_is_the_projects_metric():
    rng = np.random.default_rng(3)
    probs, labels = awkward_probs(rng)
    ex = examples("test", probs, labels)
    ours = predictive_metrics(torch.from_numpy(probs), torch.from_numpy(labels))
    independent = reference(probs, labels)
    for key in bootstrap.CLASSIFICATION:
        tol = 1e-12 if key in ("acc", "ece") else 1e-6  # nll and brier are stored in float32
        assert statistic(key, [ex]).value() == pytest.approx(ours[key], abs=tol), key
        assert statistic(key, [ex]).value() == pytest.approx(independent[key], abs=tol), key


def ood_sets(rng, n_in: int = 300, n_out: int = 200, ties: bool = True):
    inside, outside = random_probs(rng, n_in, 5, 2.0), random_probs(rng, n_out, 5, 1.0)
    if ties:  # many tied scores, across the two sets too
        inside[:50], outside[:30] = inside[0], inside[0]
    return inside, outside


def ood_examples(inside: np.ndarray, outside: np.ndarray) -> list[Examples]:
    """(in-distribution, OOD) sets of an OOD metric; their labels are never read."""
    return [
        examples("test", inside, np.zeros(len(inside), dtype=np.int64)),
        examples("ood", outside, np.zeros(len(outside), dtype=np.int64)),
    ]


def ood_reference(inside: np.ndarray, outside: np.ndarray) -> dict[str, float]:
    ood = OODDetection(sync_on_compute=False)
    ood.update(torch.from_numpy(inside), in_distribution=True)
    ood.update(torch.from_numpy(outside), in_distribution=False)
    return {f"ood_{k}": float(v) for k, v in ood.compute().items()}


def test_the_ood_point_estimates_are_the_projects_and_textbook_definitions():
    rng = np.random.default_rng(4)
    inside, outside = ood_sets(rng)
    sets = ood_examples(inside, outside)
    ours = ood_reference(inside, outside)
    for key in bootstrap.OOD_METRICS:
        assert statistic(key, sets).value() == pytest.approx(ours[key], abs=1e-6), key  # torchmetrics: float32
    pos, neg = inside.max(1), outside.max(1)
    mann_whitney = np.mean((pos[:, None] > neg[None]) + 0.5 * (pos[:, None] == neg[None]))
    assert statistic("ood_auroc", sets).value() == pytest.approx(mann_whitney, abs=1e-12)
    inside, outside = ood_sets(rng, ties=False)  # without ties AP is the mean precision at each positive's rank
    sets = ood_examples(inside, outside)
    scores = np.r_[inside.max(1), outside.max(1)]
    positive = np.r_[np.ones(len(inside)), np.zeros(len(outside))][np.argsort(-scores)]
    precision_at = np.cumsum(positive) / np.arange(1, len(positive) + 1)
    assert statistic("ood_auprc", sets).value() == pytest.approx(precision_at[positive == 1].mean(), abs=1e-12)


def test_a_resample_by_weights_equals_the_metric_of_the_resampled_set():
    """Resamples are evaluated as weighted sums; each equals the project's metric on the examples drawn."""
    rng = np.random.default_rng(5)
    probs, labels = awkward_probs(rng, 400)
    inside, outside = ood_sets(rng)
    test, ood = examples("test", probs, labels), examples("ood", outside, np.zeros(len(outside), dtype=np.int64))
    ood_in = examples("test", inside, np.zeros(len(inside), dtype=np.int64))
    for _ in range(3):
        w, w_in, w_out = (bootstrap.resample_counts(rng, n, 1) for n in (len(probs), len(inside), len(outside)))
        drawn, drawn_in, drawn_out = (np.repeat(np.arange(x.shape[1]), x[0].astype(int)) for x in (w, w_in, w_out))
        ours = predictive_metrics(torch.from_numpy(probs[drawn]), torch.from_numpy(labels[drawn]))
        for key in bootstrap.CLASSIFICATION:
            assert statistic(key, [test]).evaluate([w])[0] == pytest.approx(ours[key], abs=1e-6), key
        ours = ood_reference(inside[drawn_in], outside[drawn_out])
        for key in bootstrap.OOD_METRICS:
            assert statistic(key, [ood_in, ood]).evaluate([w_in, w_out])[0] == pytest.approx(ours[key], abs=1e-6), key


def test_ece_bins_are_the_metrics_bins():
    """Confidences on and next to every edge m/15 land where sve.metrics.scores puts them (checked one by one), and
    both put them in ((m-1)/15, m/15] with m/15 the nearest double (torch's linspace edges are one ulp off m/15
    for m = 11, so both sides must take the same edges)."""
    from sve.metrics.scores import ExpectedCalibrationError

    torch_edges = torch.linspace(0, 1, 16, dtype=torch.float64).numpy()[1:]
    numpy_edges = np.arange(1, 16) / 15
    edges = np.r_[torch_edges, numpy_edges]
    conf = np.unique(np.r_[edges, np.nextafter(edges, 2), np.nextafter(edges, -1)].clip(0, 1))
    bins = bootstrap.ece_bins(conf)
    for c, b in zip(conf, bins):  # c on class 0, the rest spread over 100 classes: the maximum is c
        probs = torch.full((1, 101), (1 - c) / 100, dtype=torch.float64)
        probs[0, 0] = c
        metric = ExpectedCalibrationError()
        metric.update(probs, torch.tensor([0]))
        assert int(metric.bin_count.argmax()) == b, c
        assert b == next(m for m in range(15) if c <= (m + 1) / 15), c
    assert bootstrap.ece_bins(numpy_edges).tolist() == list(range(15))  # right-closed: m/15 in bin m - 1
    assert bootstrap.ece_bins(np.nextafter(numpy_edges[:-1], 2)).tolist() == list(range(1, 15))


# --- (c) pairing, (d) reproducibility, (e) coverage --------------------------------------------------------------


def test_pairing_separates_strongly_correlated_rows_that_unpaired_resamples_cannot():
    rng = np.random.default_rng(6)
    labels = rng.integers(0, 2, 200)
    b = random_probs(rng, 200, 2, scale=0.3)  # about half right: the largest per-example variance
    a = flip(b, labels, 6, True, rng)  # 6 of 200 made right: A is better by 3 points, everything else equal
    sa, sb = statistic("acc", [examples("test", a, labels)]), statistic("acc", [examples("test", b, labels)])
    paired = interval([Term(1.0, 0, sa), Term(-1.0, 0, sb)])
    # Unpaired: B's resample drawn apart from A's (the per-seed strata of the procedure before, another seed key).
    apart = bootstrap.draw([Term(1.0, 0, sa, "a"), Term(-1.0, 1, sb, "b")], joint=False)
    unpaired = bootstrap.as_interval(apart, bootstrap.percentile(apart))
    assert paired.point == unpaired.point == pytest.approx(0.03)
    assert paired.low > 0 and unpaired.low < 0 < unpaired.high
    assert (paired.high - paired.low) < 0.3 * (unpaired.high - unpaired.low)


def test_every_seed_and_row_shares_one_resample_of_the_same_examples():
    """Seeds 0 and 1 scored the same examples: in every replicate their columns are drawn from one resample (equal
    when their predictions are), where the procedure before drew each seed's apart."""
    rng = np.random.default_rng(13)
    labels = rng.integers(0, 3, 150)
    a, b = random_probs(rng, 150, 3), random_probs(rng, 150, 3)
    terms = [
        Term(coef, seed, statistic("nll", [examples("test", p, labels)]))
        for seed in (0, 1)
        for coef, p in ((0.5, a), (-0.5, b))
    ]
    joint = bootstrap.draw(terms, replicates=200)
    assert joint.columns == (("", 0), ("", 1))
    assert np.array_equal(joint.replicates[:, 0], joint.replicates[:, 1])
    apart = bootstrap.draw(terms, replicates=200, joint=False)
    assert not np.allclose(apart.replicates[:, 0], apart.replicates[:, 1])
    assert np.allclose(joint.points, apart.points)
    # The verdicts' interval is the seed_level procedure on the joint draws, and the one it replaced (combined)
    # comes from the same draws; the per-seed procedure, the percentile interval of the draws apart, runs fixed.
    found = interval(terms, replicates=200)
    assert bootstrap.VERDICTS == "seed_level"
    assert (found.low, found.high) == pytest.approx(bootstrap.seed_level(joint)) and found.training
    both = bootstrap.intervals(terms, ("seed_level", "combined"), replicates=200)
    assert both["seed_level"] == found
    assert (both["combined"].low, both["combined"].high) == pytest.approx(bootstrap.combined(joint))
    before = bootstrap.per_seed_bootstrap(terms, replicates=200)
    assert (before.low, before.high) == pytest.approx(bootstrap.percentile(apart)) and not before.training


def test_the_seeds_spread_widens_the_interval_at_students_t():
    """Three seeds whose A is B with 0, 6 and 12 more examples right: the differences (0, 2 and 4 points) scatter
    far more than the test set explains. The verdicts' half-width is sqrt(z^2 (T - sigma_i^2 / 3) + t_2^2 s^2 / 3)
    (T: the joint replicates' variance; sigma_i^2: their mean across-seed variance of each seed's deviation, the
    test-set noise that differs between seeds; s^2: the per-seed differences' sample variance), recomputed here
    from the draws; the replaced procedure's is sqrt(z^2 T + t_2^2 (s^2 - sigma_i^2) / 3). Both are far wider than
    the test set's part alone and narrower than adding the seeds' whole spread at t to all of T, which would count
    sigma_i^2 twice. One seed alone gives the test set's interval and says so."""
    rng = np.random.default_rng(14)
    n, labels = 300, rng.integers(0, 3, 300)
    b = random_probs(rng, n, 3)
    pairs = [
        (examples("test", flip(b, labels, 6 * k, True, rng), labels), examples("test", b, labels)) for k in range(3)
    ]
    terms = paired_terms("acc", pairs)
    found, draws = interval(terms), bootstrap.draw(terms)
    per_seed = 3 * draws.points
    assert found.point == pytest.approx(0.02) and per_seed == pytest.approx([0.0, 0.02, 0.04])
    test = draws.replicates.sum(1).var(ddof=1)
    interaction = (3 * (draws.replicates - draws.points)).var(axis=1, ddof=1).mean()
    z, t = bootstrap.quantile(0.95), bootstrap.quantile(0.95, 2)
    assert z == pytest.approx(1.959964) and t == pytest.approx(4.302653)
    # Here the seeds' deviations are negatively correlated (each flips other examples), so the shared part
    # estimate T - sigma_i^2 / 3 is below 0 and is taken as 0.
    assert test - interaction / 3 < 0
    half = np.sqrt(z**2 * max(test - interaction / 3, 0) + t**2 * per_seed.var(ddof=1) / 3)
    assert (found.low, found.high) == pytest.approx((found.point - half, found.point + half))
    replaced = np.sqrt(z**2 * test + t**2 * max(per_seed.var(ddof=1) - interaction, 0) / 3)
    low, high = bootstrap.combined(draws)
    assert (low, high) == pytest.approx((found.point - replaced, found.point + replaced))
    for width in (half, replaced):
        assert 3 * z * np.sqrt(test) < width < np.sqrt(z**2 * test + t**2 * per_seed.var(ddof=1) / 3)
    one = interval(paired_terms("acc", pairs[2:]))
    assert found.training and not one.training and one.high - one.low < found.high - found.low


def test_coverage_of_a_known_difference_is_near_95_percent_and_the_procedure_before_falls_short():
    """The simulation of sve.paper.coverage at the miniature's sizes (3 seeds; 120, 872 and 1,000 examples; training
    variance from none to several times the test set's; accuracy and NLL; 400 data sets each): the verdicts'
    interval covers the true difference in 94-99% of the data sets in every scenario, the one it replaced in
    92-98%; resampling each seed apart
    with the runs fixed (the procedure before) covers it less often in every scenario, and at 872 and 1,000
    examples, where training varies most, in fewer than half; a bootstrap over the three seeds falls short too."""
    from sve.paper import coverage

    table = coverage.coverage_table()
    assert len(table) == len(coverage.SIZES) * len(coverage.TAUS) * 2
    for scenario, found in table.items():
        assert 0.92 <= found["combined"] <= 0.98, (scenario, found)
        assert 0.94 <= found["seed_level"] <= 0.99, (scenario, found)
        assert found["per_seed"] < found["combined"], (scenario, found)
    assert max(c["per_seed"] for (n, tau, _), c in table.items() if tau == max(coverage.TAUS) and n > 120) < 0.5
    assert min(c["hierarchical"] for c in table.values()) < 0.85
    assert coverage.coverage_range("combined") == (
        min(c["combined"] for c in table.values()),
        max(c["combined"] for c in table.values()),
    )


def test_the_simulated_truths_are_the_differences_of_many_examples():
    """The closed-form truths of the simulation (normal CDF, Gauss-Hermite) against the mean over 20,000 simulated
    examples and 200 trainings (its sampling sd: about 0.0014 in accuracy, 0.0035 in NLL)."""
    from sve.paper.coverage import Scenario

    scenario = Scenario(n=20000, tau=0.1, seeds=200)
    values = scenario.draw(np.random.default_rng(0), 1)
    truth = scenario.truth()
    assert truth["acc"] == pytest.approx(0.0129, abs=5e-4) and truth["nll"] > 0
    assert values["acc"].mean() == pytest.approx(truth["acc"], abs=0.005)
    assert values["nll"].mean() == pytest.approx(truth["nll"], abs=0.012)


def test_a_severitys_corruption_sets_of_the_same_images_share_one_resample():
    """A's two corruption sets are B's swapped: the mean over corruptions is the same on every shared resample
    (interval [0, 0]), which independent resamples per corruption set would not give."""
    rng = np.random.default_rng(12)
    labels = rng.integers(0, 3, 150)
    noise, blur = random_probs(rng, 150, 3), random_probs(rng, 150, 3)
    a = statistic("acc", [examples("shift/noise/3", noise, labels), examples("shift/blur/3", blur, labels)])
    b = statistic("acc", [examples("shift/noise/3", blur, labels), examples("shift/blur/3", noise, labels)])
    found = interval([Term(1.0, 0, a), Term(-1.0, 0, b)])
    assert (found.low, found.high) == (0.0, 0.0)
    reversed_labels = labels[::-1].copy()
    c = statistic("acc", [examples("shift/noise/3", blur, labels), examples("shift/blur/3", noise, reversed_labels)])
    with pytest.raises(InputError, match="same examples"):  # other labels: not the same images
        bootstrap.check_paired(a, c)


def test_the_same_seed_gives_the_same_interval_to_the_last_digit():
    rng = np.random.default_rng(7)
    labels = rng.integers(0, 3, 250)
    pairs = [(examples("test", random_probs(rng, 250, 3), labels), examples("test", random_probs(rng, 250, 3), labels))]
    for key in ("ece", "nll"):
        first, again = interval(paired_terms(key, pairs), seed=11), interval(paired_terms(key, pairs), seed=11)
        assert first == again
        other = interval(paired_terms(key, pairs), seed=12)
        assert (other.low, other.high) != (first.low, first.high) and other.point == first.point


def test_the_interval_covers_a_true_difference_of_zero_about_95_percent_of_the_time():
    """200 fresh test sets from one population where A and B are equally good (correlated per example):
    the 95% interval contains 0 in about 95% of them (binomial spread at 200: about 1.5 points)."""
    rng = np.random.default_rng(8)
    n, covered = 120, 0
    for _ in range(200):
        hard = rng.random(n) < 0.3  # shared difficulty: A and B tend to fail on the same examples
        p_right = np.where(hard, 0.3, 0.9)
        sets = []
        for _ in "ab":
            correct = rng.random(n) < p_right
            conf = np.where(correct, 0.8, 0.6)
            arrays = {
                "index": np.arange(n),
                "labels": np.zeros(n, dtype=np.int64),
                "confidence": conf,
                "correct": correct,
                "nll": np.zeros(n),
                "brier": np.zeros(n),
            }  # only acc is read here
            sets.append(Examples("test", arrays))
        found = interval(
            [Term(1.0, 0, statistic("acc", [sets[0]])), Term(-1.0, 0, statistic("acc", [sets[1]]))],
            replicates=300,
            seed=0,
        )
        covered += found.low <= 0 <= found.high
    assert 0.90 <= covered / 200 <= 0.99, covered


def test_unpaired_examples_and_bad_options_are_refused():
    rng = np.random.default_rng(9)
    labels = rng.integers(0, 3, 100)
    probs = random_probs(rng, 100, 3)
    other = labels.copy()
    other[0] = (other[0] + 1) % 3
    with pytest.raises(InputError, match="same examples"):
        bootstrap.check_paired(
            statistic("acc", [examples("test", probs, labels)]), statistic("acc", [examples("test", probs, other)])
        )
    terms = paired_terms("acc", [(examples("test", probs, labels), examples("test", probs, labels))])
    with pytest.raises(ValueError, match="replicates=0 is not valid"):
        interval(terms, replicates=0)
    with pytest.raises(ValueError, match="level=95 is not valid"):
        interval(terms, level=95)
    with pytest.raises(ValueError, match="choose one of"):
        statistic("ts_ece", [examples("test", probs, labels)])


# --- (f) the claims pipeline on a fake result store -----------------------------------------------------------------


def store_run(
    root,
    experiment: str,
    row: str,
    seed: int,
    probs: np.ndarray,
    labels: np.ndarray,
    files: bool = True,
    shift: dict | None = None,
    ood: np.ndarray | None = None,
    mutual_information: np.ndarray | None = None,
) -> None:
    """A results.json whose metrics are sve.metrics.scores' on ``probs`` (as an evaluation writes them) and, with
    ``files``, its predictive/ files; ``shift``: {corruption: probs} at severity 3 (labels: the first 100);
    ``mutual_information``: the members' disagreement kept in the test set's file."""
    method, members = row.split(":")
    metrics = predictive_metrics(torch.from_numpy(probs), torch.from_numpy(labels))
    extra = {}
    if ood is not None:
        metrics.update(ood_reference(probs, ood))
    if shift:
        by_corruption = {
            c: {"3": predictive_metrics(torch.from_numpy(p), torch.from_numpy(labels[:100]))} for c, p in shift.items()
        }
        by_severity = {
            "3": {
                k: float(np.mean([m["3"][k] for m in by_corruption.values()]))
                for k in metrics
                if k in bootstrap.CLASSIFICATION
            }
        }
        extra["shift"] = {"by_corruption": by_corruption, "by_severity": by_severity}
    path = write_run(root, experiment, method, int(members), seed, metrics, num_members=int(members), **extra)
    if not files:
        return
    sets = {
        "test": (probs, labels),
        **({"ood": (ood, np.zeros(len(ood), dtype=np.int64))} if ood is not None else {}),
        **{f"shift/{c}/3": (p, labels[:100]) for c, p in (shift or {}).items()},
    }
    for name, (p, y) in sets.items():
        prediction_files.write_predictive(
            path.parent / "predictive" / f"{name}.npz",
            name,
            torch.from_numpy(p),
            torch.from_numpy(y),
            torch.arange(len(y)),
            torch.from_numpy(mutual_information) if name == "test" and mutual_information is not None else None,
        )


@pytest.fixture
def store(tmp_path):
    """Experiment "e", 3 seeds, 300 test examples: Single; SVF = Single; SV-Ensemble = Single with 30 more right;
    the deep ensemble with 60 more right than SV-Ensemble; MC dropout without predictive files. Experiment "r":
    SV-Ensemble = Single. Shift sets (severity 3, two corruptions) and an OOD set for Single and SV-Ensemble."""
    rng = np.random.default_rng(10)
    for seed in range(3):
        labels = rng.integers(0, 3, 300)
        single = random_probs(rng, 300, 3, scale=1.0)
        sve = flip(single, labels, 30, True, rng)
        deep = flip(sve, labels, 60, True, rng)
        ood = random_probs(rng, 200, 3, scale=0.5)
        shift_single = {c: random_probs(rng, 100, 3, scale=1.0) for c in ("noise", "blur")}
        shift_sve = {c: flip(p, labels[:100], 30, True, rng) for c, p in shift_single.items()}
        store_run(tmp_path, "e", "single:1", seed, single, labels, shift=shift_single, ood=ood)
        store_run(tmp_path, "e", "sve:4", seed, sve, labels, shift=shift_sve, ood=random_probs(rng, 200, 3, 0.3))
        store_run(tmp_path, "e", "svf:1", seed, single, labels)
        store_run(tmp_path, "e", "deep_ensemble:4", seed, deep, labels)
        store_run(tmp_path, "e", "mc_dropout:10", seed, single, labels, files=False)
        store_run(tmp_path, "e", "batch_ensemble:4", seed, deep, labels, files=seed > 0)  # seed 0 predates them
        store_run(tmp_path, "r", "single:1", seed, single, labels)
        store_run(tmp_path, "r", "sve:4", seed, single, labels)
    return tmp_path


def claims(*checks) -> OmegaConf:
    return OmegaConf.create(
        {
            "settings": {"e": "Exp"},
            "bootstrap": {"replicates": 500, "seed": 3},
            "claims": [{"title": "T", "paper": "P", "checks": list(checks)}],
        }
    )


def test_claims_give_held_reversed_unresolved_and_fall_back_without_files(store):
    runs = load_runs(store)
    ((_, verdicts),) = judge(
        claims(
            {
                "experiment": "e",
                "a": "sve:4",
                "metrics": ["acc"],
                "against": ["single:1", "deep_ensemble:4", "mc_dropout:10"],
            },
            {"experiment": "e", "a": "svf:1", "metrics": ["acc"], "against": ["single:1"]},
            {"experiment": "e", "a": "svf:1", "metrics": ["acc"], "expect": "not_worse", "against": ["single:1"]},
        ),
        runs,
    )
    over_single, over_deep, over_dropout, same, same_at_least = verdicts
    assert over_single.verdict == HELD and over_single.held and not over_single.noise
    assert over_single.differences[0].point == pytest.approx(10.0, abs=1e-9)  # 30 of 300: 10 points, every seed
    low, high = over_single.interval
    assert 0 < low < 10.0 < high
    assert over_deep.verdict == REVERSED and not over_deep.held and over_deep.interval[1] < 0
    assert over_dropout.verdict == HELD and over_dropout.no_interval == "predictive files missing"
    assert over_dropout.interval is None
    assert same.verdict == UNRESOLVED and same.interval == (0.0, 0.0) and same.noise
    assert same_at_least.verdict == HELD
    text = to_markdown(
        judge(
            claims(
                {
                    "experiment": "e",
                    "a": "sve:4",
                    "metrics": ["acc"],
                    "against": ["single:1", "deep_ensemble:4", "mc_dropout:10"],
                }
            ),
            runs,
        )
    )
    assert f"| +10.0 [{low:+.1f}, {high:+.1f}] | held |" in text
    assert "| **reversed** |" in text
    assert "held (no interval: predictive files missing)" in text
    assert 'Strict ("better"): of 2 with a 95% interval, held in 1, reversed in 1, unresolved in 0.' in text


def test_a_one_seed_row_has_no_interval_and_an_unknown_spread_passes_no_check(store):
    """SVF has seed 0 only, 60 examples (20 points) worse than Single: no interval (different seeds), and "at
    least as good" does not hold on an unknown spread, as it would within a known one; the note says so."""
    import shutil

    rng = np.random.default_rng(4)
    labels = rng.integers(0, 3, 300)
    single = random_probs(rng, 300, 3, scale=1.0)
    for seed in range(3):
        store_run(store, "o", "single:1", seed, single, labels)
    store_run(store, "o", "svf:1", 0, flip(single, labels, 60, False, rng), labels)
    shutil.rmtree(store / "runs" / "o" / "svf_m1" / "seed1", ignore_errors=True)
    check = {"experiment": "o", "a": "svf:1", "metrics": ["acc"], "expect": "not_worse", "against": ["single:1"]}
    ((_, (v,)),) = judge(claims(check), load_runs(store))
    assert v.no_interval is not None and v.one_seed and v.noise
    assert v.differences[0].point == pytest.approx(-20.0, abs=1e-9)
    assert v.verdict == NOT_HELD and not v.held
    text = to_markdown(judge(claims(check), load_runs(store)))
    assert "**not held** (one seed: spread unknown; no interval: the rows have different seeds" in text
    assert "within seed noise" not in text


def test_a_seed_without_per_example_files_is_left_out_of_the_interval_and_said_so(store):
    """Seeds 1 and 2 have the files, seed 0 not: the difference and its interval are over seeds 1 and 2 (each 20
    points behind), and the verdict names the seed it left out; the summary counts it as an interval."""
    runs = load_runs(store)
    ((_, (v,)),) = judge(
        claims({"experiment": "e", "a": "sve:4", "metrics": ["acc"], "against": ["batch_ensemble:4"]}), runs
    )
    assert v.no_interval is None and v.verdict == REVERSED
    assert v.differences[0].point == pytest.approx(-20.0, abs=1e-9) and v.interval[1] < 0
    assert v.partial == "difference and interval without seed 0: predictive files missing"
    text = to_markdown(
        judge(claims({"experiment": "e", "a": "sve:4", "metrics": ["acc"], "against": ["batch_ensemble:4"]}), runs)
    )
    assert "| **reversed** (difference and interval without seed 0: predictive files missing) |" in text
    assert 'Strict ("better"): of 1 with a 95% interval, held in 0, reversed in 1, unresolved in 0.' in text


def test_the_point_difference_is_the_tables_difference_for_every_metric_kind(store):
    """acc, nll, ece (lower is better: oriented), a severity's mean over corruptions and the OOD AUROC."""
    from sve.paper.evidence import cell, improvement, metric_of

    runs = load_runs(store)
    keys = ["acc", "nll", "ece", "brier", "sev3/acc", "sev3/ece", "ood_auroc", "ood_fpr95"]
    ((_, verdicts),) = judge(claims({"experiment": "e", "a": "sve:4", "metrics": keys, "against": ["single:1"]}), runs)
    assert len(verdicts) == len(keys)
    for key, v in zip(keys, verdicts):
        table = improvement(cell(runs, "e", "sve:4", key), cell(runs, "e", "single:1", key), metric_of(key)[0])
        assert v.no_interval is None, (key, v.no_interval)
        assert v.differences[0].point == pytest.approx(table, abs=1e-4), key
        assert v.differences[0].low <= v.differences[0].point <= v.differences[0].high, key
    assert verdicts[0].verdict == verdicts[4].verdict == HELD  # 30 more right, on the test and the shift sets


def test_gain_and_trend_intervals(store):
    runs = load_runs(store)
    ((_, g),) = judge(
        claims({"kind": "gain", "experiments": ["e", "r"], "a": "sve:4", "metrics": ["acc"], "against": ["single:1"]}),
        runs,
    )
    assert g[0].verdict == HELD and g[0].ours == "+10.0 vs +0.0"
    assert g[0].differences[0].point == pytest.approx(10.0) and g[0].interval[0] > 0
    ((_, t),) = judge(
        claims(
            {"kind": "trend", "experiment": "e", "rows": ["single:1", "sve:4", "deep_ensemble:4"], "metrics": ["acc"]}
        ),
        runs,
    )
    assert t[0].verdict == HELD and [d.point for d in t[0].differences] == pytest.approx([10.0, 20.0])
    ((_, t),) = judge(
        claims({"kind": "trend", "experiment": "e", "rows": ["deep_ensemble:4", "sve:4", "svf:1"], "metrics": ["acc"]}),
        runs,
    )
    assert t[0].verdict == REVERSED
    ((_, t),) = judge(
        claims({"kind": "trend", "experiment": "e", "rows": ["single:1", "mc_dropout:10"], "metrics": ["acc"]}), runs
    )
    assert t[0].verdict == NOT_HELD and t[0].no_interval == "predictive files missing"  # equal means: not held


def test_a_file_that_disagrees_with_results_json_gets_no_interval_and_unpaired_runs_are_refused(store):
    path = next((store / "runs" / "e" / "svf_m1" / "seed0" / "predictive").glob("test.npz"))
    rng = np.random.default_rng(11)
    labels = np.load(path)["labels"]
    prediction_files.write_predictive(
        path, "test", torch.from_numpy(random_probs(rng, 300, 3)), torch.from_numpy(labels), torch.arange(300)
    )
    ((_, v),) = judge(
        claims({"experiment": "e", "a": "svf:1", "metrics": ["acc"], "against": ["single:1"]}), load_runs(store)
    )
    assert "disagrees with results.json on acc" in v[0].no_interval
    probs = np.load(path)["probs"].astype(np.float64)
    shuffled = rng.permutation(labels)
    store_run(store, "e", "svf:1", 0, probs, shuffled)  # other labels: other examples
    with pytest.raises(InputError, match="same examples"):
        judge(claims({"experiment": "e", "a": "svf:1", "metrics": ["acc"], "against": ["single:1"]}), load_runs(store))


def test_the_evaluation_writes_the_predictive_files_the_claims_read(tmp_path):
    """A tiny run with an OOD set and shift sets: predictive/ holds test (with probs), ood (scores only) and
    every shift set, no val; each metric computed from them is the run's results.json value."""
    from sve.paper.evidence import Evidence
    from sve.runs.run import run
    from tests.conftest import compose_cfg
    from tests.runs.test_evaluation import OOD, TINY

    run(
        compose_cfg(
            [
                "method=sve",
                "ensemble_size=2",
                OOD,
                "dataset.corruptions=[gaussian_noise,contrast]",
                "dataset.severities=[3]",
                *TINY,
            ],
            tmp_path,
        )
    )
    found = sorted(p.relative_to(tmp_path / "predictive").as_posix() for p in (tmp_path / "predictive").rglob("*.npz"))
    assert found == ["ood.npz", "shift/contrast/3.npz", "shift/gaussian_noise/3.npz", "test.npz"]
    with np.load(tmp_path / "predictive" / "test.npz") as test, np.load(tmp_path / "predictive" / "ood.npz") as ood:
        assert test["probs"].dtype == np.float32 and test["probs"].shape == (21, 4)
        assert test["confidence"].dtype == np.float64 and test["labels"].tolist() == [i % 4 for i in range(21)]
        assert sorted(ood.files) == ["confidence", "index"] and len(ood["index"]) == 17
        # the members' disagreement, kept for the conformal statistics that follow it: the results' mean
        information = test["mutual_information"]
        assert information.shape == (21,) and (information >= 0).all()
    (run_,) = load_runs(tmp_path)
    assert float(information.mean()) == pytest.approx(run_.metric("mutual_information"), abs=1e-6)
    evidence = Evidence([run_])
    for key in ("acc", "ece", "nll", "brier", "ood_auroc", "ood_auprc", "ood_fpr95", "sev3/acc", "sev3/ece"):
        assert not isinstance(evidence.statistic(run_, key), str), (key, evidence.statistic(run_, key))


def test_backfill_writes_the_files_from_saved_predictions(tmp_path):
    from sve.members import predictive
    from sve.runs.prediction_files import write_predictions
    from sve.training.module import Predictions

    logits = torch.randn(3, 50, 4)
    labels, index = torch.arange(50) % 4, torch.arange(50)
    for name in ("val", "test", "shift/noise/2"):
        write_predictions(tmp_path / "predictions" / f"{name}.npz", Predictions(logits, labels, index), "probs", 256)
    written = prediction_files.backfill(tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == [
        "predictive/shift/noise/2.npz",
        "predictive/test.npz",
    ]
    test = prediction_files.read_predictive(tmp_path / "predictive" / "test.npz", "test")
    from sve.metrics.scores import uncertainty

    expected_information = uncertainty(logits).mutual_information.numpy()
    np.testing.assert_allclose(test.arrays["mutual_information"], expected_information, rtol=1e-6, atol=1e-7)
    expected = predictive_metrics(predictive(logits, "probs"), labels)
    assert statistic("ece", [test]).value() == pytest.approx(expected["ece"], abs=1e-12)
    assert prediction_files.backfill(tmp_path) == []  # nothing left to write
