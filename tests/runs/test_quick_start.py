"""A quick-start target trains on a fresh clone: ``make sst2-cpu`` writes where nothing is committed, and a
finished run is reused only for the config it was trained with, also where its directory has no
run_config.yaml (otherwise a results.json of other dataset sizes would be returned, and a user would take the
committed numbers as their own)."""

from __future__ import annotations

import subprocess

import pytest

from sve.errors import InputError
from sve.runs.run import run
from tests.conftest import ROOT, compose_cfg

TINY = ["backbone=tiny_vit", "method=sve", "ensemble_size=2", "trainer.max_epochs=1", "trainer.limit_train_batches=2"]


def test_a_finished_run_without_run_config_is_reused_only_for_its_own_config(tmp_path):
    first = run(compose_cfg(TINY, tmp_path / "run"))
    (tmp_path / "run" / "run_config.yaml").unlink()  # as a run recorded before the file existed
    with pytest.raises(InputError, match=r"results\.json\): dataset\.num_train: 64 -> 40\b"):
        run(compose_cfg([*TINY, "dataset.num_train=40"], tmp_path / "run"))
    # What only watches a run is the same run: its results are returned, nothing is trained again.
    again = run(
        compose_cfg([*TINY, "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=7"], tmp_path / "run")
    )
    assert again["metrics"] == first["metrics"] and again["wall_time_s"] == first["wall_time_s"]


def test_make_sst2_cpu_writes_apart_from_the_committed_reference_runs():
    dry = subprocess.run(["make", "-n", "sst2-cpu"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    run_dirs = [word.split("=", 1)[1] for word in dry.split() if word.startswith("hydra.run.dir=")]
    assert sorted(run_dirs) == ["outputs/sst2_minilm_cpu/single", "outputs/sst2_minilm_cpu/sve"]
    ignored = subprocess.run(["git", "check-ignore", *run_dirs], cwd=ROOT, capture_output=True, text=True)
    assert ignored.stdout.split() == run_dirs  # never committed
    for name in ("sve", "single"):  # the numbers it prints its runs beside
        assert (ROOT / "results/reference/sst2_minilm_cpu" / name / "results.json").is_file()
    assert "scripts/beside_reference.py outputs/sst2_minilm_cpu results/reference/sst2_minilm_cpu" in dry


def test_the_table_puts_a_run_beside_its_reference():
    from sve.runs.results import format_beside, read_results

    reference = read_results(ROOT / "results/reference/sst2_minilm_cpu/sve/results.json")
    mine = {**reference, "metrics": {**reference["metrics"], "test/acc": 0.5}}
    lines = format_beside(mine, reference).splitlines()
    assert lines[0].split() == ["this", "run", "reference"]
    assert next(line for line in lines if line.startswith("acc (%)")).split()[2:] == ["50.00", "78.90"]
    assert next(line for line in lines if line.startswith("train examples")).split()[2:] == ["2000", "2000"]
