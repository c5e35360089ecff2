"""Split conformal sets from saved predictives (sve.paper.conformal_splits): the per-example statistic is the
direct computation with sve.metrics.conformal, coverage is near its level, and the metrics reach the tables and
the claims' intervals."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from sve.metrics import conformal
from sve.paper import conformal_splits
from sve.paper.bootstrap import statistic
from sve.paper.claims import judge
from sve.paper.report import conformal_table
from sve.paper.store import load_runs, load_spec, table_names
from sve.runs.prediction_files import Examples
from tests.paper.test_bootstrap import store_run


def predictive(n: int, classes: int, seed: int, sharpness: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Exchangeable examples: Dirichlet predictives, each label drawn from its own predictive (calibrated)."""
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(classes, 1.0 / sharpness), size=n)
    labels = np.array([rng.choice(classes, p=p) for p in probs])
    return probs, labels


def test_every_example_is_tested_in_exactly_splits_of_them_and_the_splits_are_fixed():
    masks = conformal_splits.split_masks(41, splits=7)
    assert masks.shape == (14, 41)
    assert (masks.sum(0) == 7).all()  # each permutation used both ways
    assert set(masks.sum(1)) == {20, 21}  # halves of an odd set
    assert (masks == conformal_splits.split_masks(41, splits=7)).all()  # same N, same splits: paired rows
    assert not (masks == conformal_splits.split_masks(41, splits=7, seed=1)).all()


@pytest.mark.parametrize("score", ["thr", "aps"])
@pytest.mark.parametrize("alpha", [0.1, 0.05])
def test_the_per_example_statistic_is_the_direct_computation(score, alpha):
    probs, labels = predictive(41, 5, seed=0)
    found = conformal_splits.per_example(probs, labels, score, alpha, splits=7)
    p, y = torch.from_numpy(probs), torch.from_numpy(labels)
    size, covered = np.zeros(41), np.zeros(41)
    for test in conformal_splits.split_masks(41, splits=7):
        cal = torch.from_numpy(~test)
        q = conformal.threshold(conformal.label_scores(p[cal], y[cal], score), alpha)
        sets = conformal.prediction_sets(p[torch.from_numpy(test)], q, score)
        size[test] += sets.sum(-1).numpy()
        covered[test] += sets.gather(-1, y[torch.from_numpy(test)][:, None]).squeeze(-1).numpy()
    np.testing.assert_allclose(found["set_size"], size / 7, rtol=0, atol=1e-12)
    np.testing.assert_allclose(found["coverage"], covered / 7, rtol=0, atol=1e-12)


def test_the_mean_over_examples_is_the_mean_over_splits_of_each_splits_set_metrics():
    probs, labels = predictive(40, 4, seed=1)  # even: every test half has 20 examples
    found = conformal_splits.per_example(probs, labels, "thr", 0.1, splits=5)
    p, y = torch.from_numpy(probs), torch.from_numpy(labels)
    per_split = []
    for test in map(torch.from_numpy, conformal_splits.split_masks(40, splits=5)):
        q = conformal.threshold(conformal.label_scores(p[~test], y[~test], "thr"), 0.1)
        per_split.append(conformal.set_metrics(conformal.prediction_sets(p[test], q, "thr"), y[test]))
    assert found["set_size"].mean() == pytest.approx(np.mean([m["mean_size"] for m in per_split]), abs=1e-12)
    assert found["coverage"].mean() == pytest.approx(np.mean([m["coverage"] for m in per_split]), abs=1e-12)


@pytest.mark.parametrize("alpha", [0.1, 0.05])
def test_coverage_is_near_its_level_and_sets_shrink_with_sharper_predictives(alpha):
    probs, labels = predictive(600, 10, seed=2)
    thr = conformal_splits.per_example(probs, labels, "thr", alpha)
    aps = conformal_splits.per_example(probs, labels, "aps", alpha)
    # at least 1 - alpha on average, and above it by at most 1 / (n_cal + 1) without ties (plus split noise)
    assert 1 - alpha - 0.005 <= thr["coverage"].mean() <= 1 - alpha + 1 / 301 + 0.005
    assert aps["coverage"].mean() >= 1 - alpha - 0.005
    assert thr["set_size"].mean() <= aps["set_size"].mean()  # THR: the smallest sets on average
    sharp = conformal_splits.per_example(*predictive(600, 10, seed=2, sharpness=4.0), "thr", alpha)
    assert sharp["set_size"].mean() < thr["set_size"].mean() - 1  # more certain and calibrated: smaller sets


def test_a_set_without_the_predictive_is_refused():
    probs, labels = predictive(20, 3, seed=0)
    examples = Examples.from_predictive("test", torch.from_numpy(probs), torch.from_numpy(labels))
    del examples.arrays["probs"]
    with pytest.raises(ValueError, match="needs the ensemble predictive"):
        statistic("set_size_90", [examples])


def test_the_claims_check_set_sizes_with_the_bootstrap_and_the_table_shows_them(tmp_path):
    """SV-Ensemble sharper than Single on the same exchangeable examples: smaller sets, held with an interval;
    reversed when the rows swap; the table cell is the per-example mean."""
    _, labels = predictive(300, 5, seed=3)
    for seed in range(3):
        rng = np.random.default_rng(10 + seed)
        onehot = np.eye(5)[labels]
        noise = rng.dirichlet(np.ones(5), size=300)
        store_run(tmp_path, "e", "single:1", seed, 0.3 * onehot + 0.7 * noise, labels)
        store_run(tmp_path, "e", "sve:4", seed, 0.6 * onehot + 0.4 * noise, labels)
    runs = load_runs(tmp_path)
    claim = {"title": "T", "paper": "P"}
    check = {"experiment": "e", "metrics": ["set_size_90", "set_size_95"]}
    spec = OmegaConf.create(
        {
            "bootstrap": {"replicates": 200},
            "claims": [
                {**claim, "checks": [{**check, "a": "sve:4", "against": ["single:1"]}]},
                {**claim, "checks": [{**check, "a": "single:1", "against": ["sve:4"]}]},
            ],
        }
    )
    (_, held), (_, reversed_) = judge(spec, runs)
    assert [v.verdict for v in held] == ["held", "held"] and all(v.no_interval is None for v in held)
    assert [v.verdict for v in reversed_] == ["reversed", "reversed"]
    low, high = held[0].interval
    assert 0 < low < held[0].differences[0].point < high

    definition = str(tmp_path / "t.yaml")
    table_spec = OmegaConf.create(
        {"name": "c", "title": "C", "of": [definition], "metrics": ["coverage_90", "set_size_90"]}
    )
    (tmp_path / "t.yaml").write_text(
        "kind: metrics\ntitle: T\nexperiments: {e: E}\nseeds: [0, 1, 2]\nmetrics: [acc]\n"
        "rows: [{method: single, members: 1}, {method: sve, members: 4}]\n"
    )
    table = conformal_table(table_spec, runs, tmp_path)
    single, sve = table.blocks[0].rows
    assert sve.cells["set_size_90"].mark == "best" and single.cells["coverage_90"].mark is None
    per_seed = [conformal_splits.run_metric(r.path.parent, "set_size_90") for r in runs if r.method == "sve"]
    assert sve.cells["set_size_90"].mean == pytest.approx(np.mean(per_seed))
    assert 89 < single.cells["coverage_90"].mean < 92 and table.missing == []


def test_the_mini_conformal_table_covers_every_table_of_the_miniature():
    """A table of the miniature left out of `of` would have no conformal block: the list cannot fall behind."""
    spec = load_spec("mini_conformal")
    tables = {n for n in table_names() if n.startswith("mini_") and load_spec(n).kind in ("metrics", "figure2")}
    assert set(spec.of) == tables
    # the disagreement's statistics exist for the few runs re-evaluated to keep it: checked by their claim
    assert set(conformal_splits.KEYS) - set(conformal_splits.NEEDS_DISAGREEMENT) <= set(spec.metrics)


def test_thr_mi_and_the_disagreement_statistics_are_their_direct_computations():
    probs, labels = predictive(40, 4, seed=4)
    information = np.random.default_rng(4).gamma(1.0, 0.05, 40)
    found = conformal_splits.per_example(probs, labels, "thr_mi", 0.1, splits=5, mutual_information=information)
    p, y, mi = torch.from_numpy(probs), torch.from_numpy(labels), torch.from_numpy(information)
    size = np.zeros(40)
    for test in map(torch.from_numpy, conformal_splits.split_masks(40, splits=5)):
        q = conformal.threshold(conformal.label_scores(p[~test], y[~test], "thr_mi", mi[~test]), 0.1)
        size[test.numpy()] += conformal.prediction_sets(p[test], q, "thr_mi", mi[test]).sum(-1).numpy()
    np.testing.assert_allclose(found["set_size"], size / 5, atol=1e-12)
    # growth: its mean is the mean size above the median disagreement minus the mean at or below it
    sizes = np.arange(40.0)
    above = information > np.median(information)
    assert conformal_splits.growth(sizes, information).mean() == pytest.approx(
        sizes[above].mean() - sizes[~above].mean()
    )
    with pytest.raises(ValueError, match="same on every example"):
        conformal_splits.growth(sizes, np.zeros(40))


def test_the_disagreement_metrics_need_the_members_information_and_reach_a_level_check(tmp_path):
    """Members that disagree where the predictive is flat: the sets are larger there (growth held with an
    interval); a run whose file has no mutual information has no cell and no verdict."""
    for seed in range(3):
        rng = np.random.default_rng(20 + seed)
        labels = rng.integers(0, 5, 300)
        flat = rng.random(300) < 0.5
        onehot = np.eye(5)[labels]
        probs = np.where(flat[:, None], 0.2 * onehot + 0.8 * rng.dirichlet(np.ones(5), 300), 0.9 * onehot + 0.02)
        probs = probs / probs.sum(-1, keepdims=True)
        information = np.where(flat, 0.3, 0.02) + rng.random(300) * 0.01
        store_run(tmp_path, "e", "sve:4", seed, probs, labels, mutual_information=information)
        store_run(tmp_path, "e", "single:1", seed, probs, labels)
    runs = load_runs(tmp_path)
    sve = [r for r in runs if r.method == "sve"][0]
    single = [r for r in runs if r.method == "single"][0]
    assert sve.metric("growth_90") > 0.5 and single.metric("growth_90") is None
    assert sve.metric("mi_saving_90") == pytest.approx(sve.metric("set_size_90") - sve.metric("mi_set_size_90"))
    examples = Examples.from_predictive("test", torch.from_numpy(probs), torch.from_numpy(labels))
    with pytest.raises(ValueError, match="needs the members' mutual_information"):
        statistic("growth_90", [examples])
    metrics = ["growth_90", "mi_saving_90"]
    spec = OmegaConf.create(
        {
            "bootstrap": {"replicates": 200},
            "claims": [
                {
                    "title": "T",
                    "paper": "P",
                    "checks": [
                        {"kind": "level", "experiment": "e", "a": "sve:4", "metrics": metrics},
                        {"kind": "level", "experiment": "e", "a": "single:1", "metrics": metrics},
                    ],
                }
            ],
        }
    )
    ((_, verdicts),) = judge(spec, runs)
    assert len(verdicts) == 2  # the single model's cells are missing: no verdict
    growth, saving = verdicts
    assert growth.verdict == "held" and growth.no_interval is None and growth.interval[0] > 0
    assert growth.comparison == "SV-Ensemble (M=4) against 0"
    assert saving.differences[0].point == pytest.approx(sve_mean(runs, "mi_saving_90"))


def sve_mean(runs, key):
    return float(np.mean([r.metric(key) for r in runs if r.method == "sve"]))
