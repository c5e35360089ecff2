"""The budget measurement (sve.paper.budget): convergence along a learning curve, the curve's share of a run."""

import json

import pytest

from sve.paper.budget import convergence, curve_share, evaluation_seconds, mean_points, report
from sve.paper.store import run_dir


def curve(values):
    return [{"step": 10 * i, "val/nll": v} for i, v in enumerate(values)]


def test_a_curve_still_falling_at_its_end_is_called_so():
    state = convergence(curve([0.7, 0.5, 0.45, 0.40]))
    assert state["still_falling"] and state["verdict"] == "still falling at the end"
    flat = convergence(curve([0.7, 0.5, 0.45, 0.445]))  # the last change is under the tolerance
    assert not flat["still_falling"] and flat["verdict"] == "converged (best at the end)"
    over = convergence(curve([0.7, 0.4, 0.45, 0.5]))  # best in the middle, then overfitting
    assert over["best_step"] == 10 and over["verdict"] == "converged (best at step 10 of 30, then +0.100)"
    assert convergence(curve([0.7])) is None


def test_mean_points_keeps_the_steps_every_seed_has():
    a, b = curve([0.7, 0.5, 0.3]), curve([0.7, 0.3])
    assert mean_points([a, b]) == [{"step": 0, "val/nll": 0.7}, {"step": 10, "val/nll": pytest.approx(0.4)}]


def test_curve_share_is_the_curves_examples_at_the_runs_test_throughput():
    results = {
        "wall_time_s": 100.0,
        "metrics": {"test/seconds": 10.0, "test/examples": 1000},
        "curve": {"points": [{"step": 0, "examples": 250}, {"step": 5, "examples": 250}]},
    }
    assert curve_share(results) == pytest.approx(500 * 0.01 / 100)  # 5 s of 100
    assert curve_share({"wall_time_s": 1.0, "metrics": {}}) is None


def test_report_counts_every_run_once_and_reads_the_tuned_rows(tmp_path):
    for method, members in (("single", 1), ("sve", 4)):
        row = run_dir(tmp_path, "mini_sst2_minilm", method, members, 0).parent
        for lr in ("0.0001", "0.0003", "0.001"):
            d = row / "tune" / f"method.lr_{lr}"
            d.mkdir(parents=True)
            (d / "results.json").write_text(
                json.dumps(
                    {
                        "method": method,
                        "num_members": members,
                        "wall_time_s": 60,
                        "experiment": "mini_sst2_minilm",
                        "metrics": {},
                    }
                )
            )
        (row / "tuned.json").write_text(json.dumps({"value": "0.001", "edge": "upper" if method == "sve" else None}))
        for seed in (0, 1, 2):
            d = row / f"seed{seed}"
            d.mkdir()
            if seed == 0:
                (d / "REUSED.txt").write_text("copied")
            (d / "results.json").write_text(
                json.dumps(
                    {
                        "method": method,
                        "num_members": members,
                        "wall_time_s": 120,
                        "experiment": "mini_sst2_minilm",
                        "metrics": {},
                        "curve": {"points": curve([0.7, 0.5, 0.4])},
                    }
                )
            )
    text, record = report(tmp_path, ["mini_table2"])
    rows = {r["row"]: r for r in record["tables"]["mini_table2"]}
    assert rows["sve:4"]["runs"] == 5 and rows["sve:4"]["minutes"] == 3 * 1 + 2 * 2  # seed 0 is a tuning run's copy
    assert rows["sve:4"]["edge"] == "upper" and rows["single:1"]["convergence"]["still_falling"]
    assert record["core_hours"] == pytest.approx(14 / 60)
    # Tuning: 3 runs of 1 min per row; the seeds alone: 3 seeds at the row's mean of 1.4 min (3 x 1 + 2 x 2 over 5).
    assert record["tuning_core_hours"] == pytest.approx(6 / 60)
    assert record["seeds_only_core_hours"] == pytest.approx(2 * 3 * 7 / 5 / 60)
    assert "the seeds alone would take about 0.1 h of runs (0.1 h of wall time" in text
    assert "| `mini_sst2_minilm` | SV-Ensemble (M=4) | 5 | 1.4 | – | 0.001 (edge: upper) | 0.700 → 0.400 (20)" in text
    # The time is what retraining costs, measured: no target to hold it against, nothing about shrinking subsets.
    assert not {"budget_hours", "fraction_to_fit"} & set(record)
    assert "budget of" not in text and "training subsets" not in text


def test_evaluation_seconds_are_the_test_split_and_the_curve_at_its_throughput():
    results = {
        "wall_time_s": 100.0,
        "metrics": {"test/seconds": 10.0, "test/examples": 1000},
        "curve": {"points": [{"step": 0, "examples": 500}]},
    }
    assert evaluation_seconds(results) == pytest.approx(10 + 5)  # the test split, and the curve at its throughput
    assert evaluation_seconds({"wall_time_s": 5.0, "metrics": {}}) == 0.0
