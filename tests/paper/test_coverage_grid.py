"""The coverage grid (sve.paper.coverage_grid, scripts/coverage_grid.py): its metrics of resampled sets against
independent computations, its truths against Monte Carlo, its procedures' coverage in a cell where they differ,
and the script's resumable file."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from sve.paper import bootstrap
from sve.paper import coverage_grid as grid

ROOT = Path(__file__).resolve().parents[2]


def test_ece_of_every_column_and_resample_is_the_weighted_binned_ece():
    rng = np.random.default_rng(0)
    x = rng.normal(1.5, 2.0, (2, 3, 60))
    counts = bootstrap.resample_counts(rng, 60, 5)
    full, resampled = grid._ece_columns(x, 0.7, counts)
    for d in range(2):
        for s in range(3):
            conf = 1 / (1 + np.exp(-0.7 * np.abs(x[d, s])))
            gap = (x[d, s] > 0) - conf
            bins = bootstrap.ece_bins(conf)
            for weights, found in [(np.ones(60), full[d, s]), *zip(counts, resampled[:, d, s])]:
                expected = np.abs(np.bincount(bins, weights * gap, minlength=bootstrap.N_BINS)).sum() / 60
                assert found == pytest.approx(expected, abs=1e-12)


def test_auroc_of_every_column_and_resample_is_sklearns_weighted_auroc():
    rng = np.random.default_rng(1)
    x, y = rng.normal(1.0, 1.5, (1, 2, 40)), rng.normal(0.3, 1.5, (1, 2, 40))
    w_in, w_ood = bootstrap.resample_counts(rng, 40, 4), bootstrap.resample_counts(rng, 40, 4)
    full, resampled = grid._auroc_columns(x, y, w_in, w_ood, chunk=1)
    labels = np.r_[np.ones(40), np.zeros(40)]
    for s in range(2):
        scores = np.r_[np.abs(x[0, s]), np.abs(y[0, s])]
        # exact counts in float32, divided in float32: equal to about 1e-8
        assert full[0, s] == pytest.approx(roc_auc_score(labels, scores), abs=1e-7)
        for r in range(4):
            weights = np.r_[w_in[r], w_ood[r]].astype(float)
            expected = roc_auc_score(labels, scores, sample_weight=weights)
            assert resampled[r, 0, s] == pytest.approx(expected, abs=1e-6)


def test_population_metrics_match_monte_carlo():
    """The quadratures against 400,000 simulated examples of one run (sampling sd below 1e-3 for each)."""
    rng = np.random.default_rng(2)
    mean, sd, k, mean_ood = 2.7, np.sqrt(10.0), 0.6, 0.3
    x = rng.normal(mean, sd, 400_000)
    conf = 1 / (1 + np.exp(-k * np.abs(x)))
    assert grid._population("acc", mean, sd, k, mean_ood) == pytest.approx((x > 0).mean(), abs=3e-3)
    assert grid._population("nll", mean, sd, k, mean_ood) == pytest.approx(np.logaddexp(0, -x).mean(), abs=3e-3)
    bins = bootstrap.ece_bins(conf)
    ece = np.abs(np.bincount(bins, (x > 0) - conf, minlength=bootstrap.N_BINS)).sum() / len(x)
    assert grid._population("ece", mean, sd, k, mean_ood) == pytest.approx(ece, abs=3e-3)
    inside, outside = np.abs(x[:4000]), np.abs(rng.normal(mean_ood, sd, 4000))
    auroc = roc_auc_score(np.r_[np.ones(4000), np.zeros(4000)], np.r_[inside, outside])
    assert grid._population("ood_auroc", mean, sd, k, mean_ood) == pytest.approx(auroc, abs=0.02)
    with pytest.raises(ValueError, match="not in the grid"):
        grid._population("brier", mean, sd, k, mean_ood)


def test_the_training_spread_is_the_stated_multiple_of_the_test_sets():
    """tau() sets the sd over trainings of one seed's accuracy difference to ``spread`` times its sd over test
    sets: the first from the population accuracies of drawn training effects, the second from 3,000 simulated
    test sets with no training variance."""
    cell = grid.Cell(share=0.5, spread=2.0, seeds=1, metric="acc")
    rng = np.random.default_rng(3)
    none = np.ones((1, cell.n))
    test_sd = grid.per_seed_values(replace(cell, spread=0.0), rng, 3000, none, none)[0].std()
    u = rng.normal(0.0, cell.tau(), (4000, 2))
    s = cell.sd_within
    by_training = stats.norm.cdf((cell.mu + cell.m_a + u[:, 0]) / s) - stats.norm.cdf(
        (cell.mu + cell.m_b + u[:, 1]) / s
    )
    assert by_training.std() / test_sd == pytest.approx(2.0, rel=0.1)


def test_seed_level_keeps_its_coverage_where_the_replaced_procedure_loses_it():
    """Two seeds, a quarter of the test-set noise shared, training five times the test set's spread: the regime
    where the replaced procedure's t on the spread beyond the test set's noise is not a t pivot. 600 data sets:
    a coverage of 95% falls below 93% with probability under 1%."""
    found = grid.study(grid.Cell(share=0.25, spread=5.0, seeds=2, metric="acc"), datasets=600, replicates=100, seed=5)
    coverage = {p: found["coverage"][p]["population"] for p in grid.PROCEDURES}
    assert coverage["seed_level"] >= 0.93, coverage
    assert coverage["combined"] < coverage["seed_level"] - 0.02, coverage
    assert found["width"]["seed_level"] > found["width"]["combined"]


def test_the_summary_chooses_the_highest_lowest_coverage():
    def result(metric, combined, seed_level):
        cell = {"metric": metric, "seeds": 3, "share": 0.0, "spread": 1.0, "n": 500}
        target = "at_n" if metric == "ece" else "population"
        coverage = {"combined": {target: combined}, "seed_level": {target: seed_level}}
        return {"cell": cell, "coverage": coverage}

    found = grid.summary([result("acc", 0.95, 0.96), result("ece", 0.90, 0.94)])
    assert found["chosen"] == "seed_level" and found["procedures"]["combined"]["lowest"] == 0.90
    assert found["procedures"]["combined"]["below"] == 1 and found["procedures"]["seed_level"]["below"] == 0
    assert grid.summary([result("acc", 0.95, 0.91)])["chosen"] == "combined"


def test_the_script_resumes_refuses_mixed_settings_and_writes_its_table(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "scripts"))
    import coverage_grid as script

    small = [grid.Cell(0.5, 1.0, 2, "acc", n=50), grid.Cell(0.5, 1.0, 2, "nll", n=50)]
    monkeypatch.setattr(grid, "cells", lambda: small)
    script.main(["--out", str(tmp_path), "--datasets", "30", "--replicates", "20"])
    lines = (tmp_path / "cells.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["datasets"] == 30
    script.main(["--out", str(tmp_path), "--datasets", "30", "--replicates", "20"])  # nothing left to do
    assert len((tmp_path / "cells.jsonl").read_text().splitlines()) == 2
    text = (tmp_path / "README.md").read_text()
    assert "| `seed_level` |" in text and "## accuracy" in text and "## NLL" in text
    with pytest.raises(SystemExit) as stopped:  # an InputError, ended by one_line_errors with its one line
        script.main(["--out", str(tmp_path), "--datasets", "40", "--replicates", "20"])
    assert stopped.value.code == 2 and len((tmp_path / "cells.jsonl").read_text().splitlines()) == 2


def test_the_make_target_runs_the_script_on_one_core():
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", "mini-coverage-grid"],
        cwd=ROOT,
        text=True,
        capture_output=True,
        check=True,
    ).stdout
    assert "OMP_NUM_THREADS=1" in out and "scripts/coverage_grid.py --out results/mini/diagnostics/coverage_grid" in out
