"""Every logger config writes its files, always with the CSV log beside it; a missing logger package or
launcher plugin is one line with the command that installs it."""

import importlib.util
import sqlite3
import subprocess
import sys

import pytest

from sve.errors import InputError
from sve.runs.run import run
from sve.runs.validate import check_values
from tests.conftest import ROOT, compose_cfg, config_options

TINY = ["method=sve", "ensemble_size=2", "backbone=tiny_vit", "dataset=synthetic_image"]
WRITES = {
    "csv": "csv/version_0/metrics.csv",
    "tensorboard": "tensorboard/version_0",
    "mlflow": "mlflow.db",
    "wandb": "wandb",
}
NEEDS = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}


def test_every_logger_config_is_listed_here():
    assert sorted(config_options("logger")) == sorted(WRITES)


@pytest.mark.parametrize("logger", [name for name in sorted(WRITES) if name != "wandb"])
def test_each_logger_writes_its_files_and_the_csv_log(logger, tmp_path):
    if logger in NEEDS and importlib.util.find_spec(NEEDS[logger]) is None:
        pytest.skip(f"needs {NEEDS[logger]}: pip install -e '.[loggers]'")
    run(compose_cfg([*TINY, f"logger={logger}"], tmp_path))
    written = tmp_path / WRITES[logger]
    assert written.exists() and any(written.rglob("*")) if written.is_dir() else written.stat().st_size > 0
    metrics = (tmp_path / WRITES["csv"]).read_text()  # kept beside any other logger
    assert "train/loss" in metrics.splitlines()[0]
    if logger == "tensorboard":
        assert list(written.glob("events.out.tfevents.*")), list(written.iterdir())
    if logger == "mlflow":  # the run's metrics reached the store
        with sqlite3.connect(written) as db:
            keys = {key for (key,) in db.execute("SELECT DISTINCT key FROM metrics")}
        assert {"train/loss", "val/nll"} <= keys, keys


def test_a_logger_whose_package_is_missing_is_one_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("tensorboard", "tensorboardX") else real(name, *a),
    )
    with pytest.raises(
        InputError,
        match=r"needs the tensorboard package, which is not installed: pip install "
        r"'singular-value-ensembles\[loggers\]' \(or logger=csv\)",
    ):
        check_values(compose_cfg([*TINY, "logger=tensorboard"]))


def test_a_launcher_whose_plugin_is_missing_says_what_to_install():
    if importlib.util.find_spec("hydra_plugins") and importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher"):
        pytest.skip("the submitit launcher is installed here")
    done = subprocess.run(
        [sys.executable, "-m", "sve.cli.train", "-m", "hydra/launcher=slurm", "method=sve"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: hydra/launcher=slurm needs the submitit launcher plugin, which is not "
        "installed: pip install 'singular-value-ensembles[slurm]' (in a checkout: pip "
        "install -e '.[slurm]')"
    )
