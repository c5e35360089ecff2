"""No wrong numbers: unique locked run directories, divergence and non-finite metrics as errors, every config
value and data file checked before work, sweeps that survive and list their failures."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys

import pytest

from sve.errors import InputError
from sve.runs.results import write_json
from sve.runs.run import run
from tests.conftest import ROOT, compose_cfg

TINY = ["backbone=tiny_vit", "dataset=synthetic_image"]


def test_runs_started_together_get_their_own_directories(tmp_path):
    cmd = [sys.executable, str(ROOT / "train.py"), *TINY, "trainer=debug", "callbacks=none"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
    for proc in procs:
        assert proc.wait(timeout=600) == 0, proc.stdout.read()[-2000:]
    written = sorted(tmp_path.glob("outputs/synthetic_image/sve/tiny_vit/*/results.json"))
    assert len(written) == 2, written  # two directories, two results
    assert not list(tmp_path.rglob(".lock"))  # released at the end


def test_a_directory_held_by_a_live_run_is_refused_and_a_dead_runs_lock_taken_over(tmp_path):
    lock = tmp_path / ".lock"
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))  # this process: alive
    with pytest.raises(InputError, match="in use by another run"):
        run(compose_cfg(TINY, tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid}))
    run(compose_cfg(TINY, tmp_path))
    assert (tmp_path / "results.json").exists() and not lock.exists()


def test_a_finished_run_is_skipped(tmp_path):
    first = run(compose_cfg(TINY, tmp_path))
    stamp = (tmp_path / "results.json").stat().st_mtime_ns
    assert run(compose_cfg(TINY, tmp_path))["wall_time_s"] == first["wall_time_s"]
    assert (tmp_path / "results.json").stat().st_mtime_ns == stamp


def test_divergence_stops_the_run_and_writes_no_results(tmp_path):
    cfg = compose_cfg(
        [*TINY, "method=single", "method.lr=1e6", "trainer.limit_train_batches=10", "trainer.gradient_clip_val=null"],
        tmp_path,
    )
    with pytest.raises(FloatingPointError, match=r"non-finite loss .* at step \d+ .*last finite loss: \S+ at step \d+"):
        run(cfg)
    assert not (tmp_path / "results.json").exists()


def test_non_finite_numbers_never_reach_results_json(tmp_path):
    with pytest.raises(ValueError, match="non-finite"):
        write_json(tmp_path / "results.json", {"metrics": {"test/nll": math.nan}})
    assert not list(tmp_path.iterdir())
    write_json(tmp_path / "results.json", {"metrics": {"test/nll": 0.5}})
    assert json.loads((tmp_path / "results.json").read_text())["metrics"]["test/nll"] == 0.5


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("ensemble_size=abc", "ensemble_size='abc' is not valid; expected a positive integer"),
        ("ensemble_size=0", "ensemble_size=0 is not valid"),
        ("seed=-1", r"seed=-1 is not valid; expected an integer from 0 to 4294967295"),
        ("trainer.max_epochs=-1", r"trainer.max_epochs=-1 trains until trainer.max_steps, which is not set"),
        ("trainer.limit_train_batches=0", r"trainer.limit_train_batches=0 is not valid.*would train nothing"),
        ("trainer.limit_train_batches=0.0", r"trainer.limit_train_batches=0.0 is not valid"),
        ("seed=4294967296", "seed=4294967296 is not valid"),
        ("sigma_init=0.6", r"sigma_init=0.6 is not valid; expected a number in \[0, 0.43\)"),
        ("optimizer.lr=-1", "optimizer.lr=-1 is not valid"),
        ("dataset.batch_size=0", "dataset.batch_size=0 is not valid"),
        ("trainer.max_epochs=0", "trainer.max_epochs=0 is not valid"),
        ("aggregate=vote", "aggregate='vote' is not valid"),
        ("ckpt_path=/nonexistent.ckpt", "ckpt_path='/nonexistent.ckpt' is not valid"),
    ],
)
def test_invalid_config_values_are_named_before_work(override, message, tmp_path):
    with pytest.raises(InputError, match=message):
        run(compose_cfg([*TINY, override], tmp_path))
    assert not list(tmp_path.iterdir())  # nothing started


@pytest.mark.parametrize(
    ("overrides", "gpus", "message"),
    [
        (["trainer=gpu"], 0, "trainer.accelerator=gpu .* torch finds no CUDA GPU here.*use trainer=cpu"),
        (["trainer=ddp"], 0, "no CUDA GPU here.*trainer=ddp_sim"),
        (["trainer=gpu", "trainer.devices=4"], 2, r"trainer.devices=4 but 2 GPU\(s\) are visible"),
        (["trainer=gpu", "trainer.devices=[0,3]"], 2, r"names GPU\(s\) \[3\] that are not here"),
    ],
)
def test_gpus_that_are_not_there_are_named_before_work(overrides, gpus, message, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    with pytest.raises(InputError, match=message):
        run(compose_cfg([*TINY, *overrides], tmp_path))
    assert not list(tmp_path.iterdir())  # nothing started


def test_command_line_error_is_a_message_not_a_traceback(tmp_path):
    done = subprocess.run(
        [sys.executable, "train.py", "ensemble_size=abc", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "ensemble_size='abc' is not valid" in done.stderr and "Traceback" not in done.stderr


def sst2_dir(tmp_path, train_rows: list[str], dev_rows=("a fine film\t1",)):
    root = tmp_path / "sst2"
    root.mkdir()
    (root / "train.tsv").write_text("\n".join(["sentence\tlabel", *train_rows]) + "\n")
    (root / "dev.tsv").write_text("\n".join(["sentence\tlabel", *dev_rows]) + "\n")
    return root


GOOD = ["a good movie\t1", "a bad plot\t0", "great\t1", "dull\t0"]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (GOOD + ["fine\tpositive"], r"train.tsv, line 6: label 'positive' is not valid; expected an integer in 0..1"),
        (GOOD[:2] + ["no label at all"], r"train.tsv, line 4: label None is not valid"),
        (GOOD + ["too high\t2"], r"train.tsv, line 6: label '2' is not valid"),
    ],
)
def test_bad_tsv_rows_name_file_and_line_before_training(rows, message, tmp_path):
    cfg = compose_cfg(
        ["backbone=tiny_bert", "dataset=sst2", f"dataset.root={sst2_dir(tmp_path, rows)}", "dataset.val_holdout=1"],
        tmp_path / "run",
    )
    with pytest.raises(InputError, match=message):
        run(cfg)
    assert not (tmp_path / "run" / "csv").exists()  # no training started


def test_validation_holdout_as_large_as_the_training_file(tmp_path):
    cfg = compose_cfg(
        ["backbone=tiny_bert", "dataset=sst2", f"dataset.root={sst2_dir(tmp_path, GOOD)}", "dataset.val_holdout=4"],
        tmp_path / "run",
    )
    with pytest.raises(ValueError, match=r"dataset.val_holdout=4 is not valid: .* between 1 and 3 .* 4 sentences"):
        run(cfg)


def test_wandb_without_network_says_how_to_log_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: (_ for _ in ()).throw(OSError("unreachable")))
    with pytest.raises(InputError, match="logger.offline=true"):
        run(compose_cfg([*TINY, "logger=wandb"], tmp_path))


def test_a_method_that_cannot_run_on_the_backbone_fails_at_start(tmp_path):
    cfg = compose_cfg(
        ["backbone=resnet20_cifar", "backbone.pretrained=false", "dataset=synthetic_image", "method=mc_dropout"],
        tmp_path,
    )
    with pytest.raises(Exception, match="no dropout site"):  # raised while building, wrapped by Hydra
        run(cfg)
    assert not (tmp_path / "csv").exists()


def test_sweep_goes_on_past_a_failure_lists_it_and_skips_finished_runs_when_rerun(tmp_path):
    cmd = [
        sys.executable,
        "train.py",
        "-m",
        "sigma_init=0.01,0.9",
        *TINY,
        "trainer=debug",
        "callbacks=none",
        f"hydra.sweep.dir={tmp_path}",
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    states = {r["run"]: r for r in summary["runs"]}
    assert states["sve_m4_seed0_sigma_init=0.01"]["state"] == "finished"
    failed = states["sve_m4_seed0_sigma_init=0.9"]
    assert failed["state"] == "failed" and "sigma_init=0.9" in failed["error"]
    # A user error is logged as one line naming the value; a traceback is for bugs.
    assert "the sweep goes on: sigma_init=0.9 is not valid" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    stamp = (tmp_path / "sve_m4_seed0_sigma_init=0.01" / "results.json").stat().st_mtime_ns
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 1 and "has finished, skipping" in again.stdout + again.stderr
    assert (tmp_path / "sve_m4_seed0_sigma_init=0.01" / "results.json").stat().st_mtime_ns == stamp


def test_sigterm_stops_the_whole_sweep_with_143_and_says_how_to_finish_it(tmp_path, monkeypatch, capsys):
    # A scheduler's stop (SIGTERM) ends the run in progress with RunInterrupted; the sweep must stop there
    # too, not record it as failed and start training the next run.
    from sve.errors import RunInterrupted
    from tests.helpers import run_main

    started = []

    def stopped(cfg):
        started.append(int(cfg.seed))
        raise RunInterrupted(f"run in {cfg.paths.output_dir} stopped by SIGTERM")

    code = run_main(monkeypatch, ["-m", "seed=0,1,2", f"hydra.sweep.dir={tmp_path}"], stopped)
    assert code == 128 + 15 and started == [0]
    assert f"hydra.sweep.dir={tmp_path}" in capsys.readouterr().err
    assert (tmp_path / "sve_m4_seed0").is_dir()
    assert not (tmp_path / "sve_m4_seed0" / "failed.json").exists()  # incomplete: the rerun resumes it


def test_slurm_launcher_config_composes(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")
    done = subprocess.run(
        [
            sys.executable,
            "train.py",
            "hydra/launcher=slurm",
            "hydra.launcher.partition=gpu",
            "hydra.launcher.gpus_per_node=4",
            "--cfg",
            "hydra",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "SlurmLauncher" in done.stdout and "partition: gpu" in done.stdout
    assert "gpus_per_node: 4" in done.stdout and "tasks_per_node: ${.gpus_per_node}" in done.stdout


def test_a_slurm_job_has_one_directory_and_a_requeued_job_takes_its_own_lock_back(tmp_path, monkeypatch):
    from sve.runs.rundir import claim, run_id

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    assert run_id() == "job4242"  # the same name on every node and after a requeue: the checkpoint is found
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert run_id() == "job77_3"
    assert run_id("sweep") != run_id() and not run_id("sweep").startswith("job")  # sweeps never share
    # The first attempt died on another node, holding the lock; the requeued attempt (same job) takes it.
    (tmp_path / ".lock").write_text(json.dumps({"host": "node-that-died", "pid": 1, "slurm_job": "4242"}))
    with claim(tmp_path):
        assert json.loads((tmp_path / ".lock").read_text())["slurm_job"] == "4242"
    # Another job's lock on another host is respected.
    (tmp_path / ".lock").write_text(json.dumps({"host": "elsewhere", "pid": 1, "slurm_job": "9999"}))
    with pytest.raises(InputError, match="in use by another run"):
        with claim(tmp_path):
            pass


def test_git_commit_is_dirty_for_code_changes_not_for_results(tmp_path):
    import subprocess

    from sve.runs.results import git_commit

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "results").mkdir()
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "results" / "table.md").write_text("| a |\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    clean = git_commit(tmp_path)
    assert clean and not clean.endswith("-dirty")
    (tmp_path / "results" / "table.md").write_text("| b |\n")  # a table rebuilt by a running sweep
    assert git_commit(tmp_path) == clean
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_commit(tmp_path) == clean + "-dirty"


def test_lightnings_refusal_of_a_trainer_setting_is_one_line(capsys):
    # e.g. +trainer.limit_train_batches=0.01 on 8 batches: Lightning names the setting and the fix itself.
    from lightning_fabric.utilities.exceptions import MisconfigurationException

    from sve.errors import one_line_errors

    with pytest.raises(SystemExit) as stop, one_line_errors():
        raise MisconfigurationException("You requested to check 0.01 of the `train_dataloader` but 0.01 * 8 < 1")
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "0.01 * 8 < 1" in err and "Traceback" not in err
