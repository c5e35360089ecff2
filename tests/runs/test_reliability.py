"""No silent outcomes: a killed or stopped run ends non-zero and resumes to the last digit, a run
directory refuses another config, unknown keys and impossible member counts are refused before any work,
divergence names its step and learning rate, and every user error is one line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from sve.errors import InputError, TrainingDiverged
from sve.runs.run import run
from tests.conftest import ROOT, compose_cfg

# SVE with dropout (random states matter as well as weights), 6 steps per epoch, 3 epochs, validation every
# epoch, a checkpoint every 2 steps: a kill between two checkpoints redoes steps.
RUN = [
    "backbone=tiny_vit",
    "dataset=synthetic_image",
    "method=sve",
    "ensemble_size=2",
    "trainer=cpu",
    "trainer.max_epochs=3",
    "callbacks=default",
    "callbacks.checkpoint.every_n_steps=2",
    "+backbone.model_kwargs.drop_rate=0.2",
    "dataset.num_train=48",
    "dataset.num_val=8",
    "dataset.num_test=32",
    "method.lr=3e-2",
    "trainer.log_every_n_steps=1",
    "+trainer.enable_progress_bar=false",
]


POINTS = [
    ("step:8", "SIGKILL"),  # epoch 1, batch 3: the last checkpoint is step 7's, step 8 is trained again
    ("epoch:2", "SIGKILL"),  # at the epoch boundary, after epoch 1's end checkpoint
    ("validation:1", "SIGKILL"),  # in epoch 1's validation, before its epoch-end checkpoint
    ("step:3", "SIGTERM"),  # stopped from outside: exit 143, no results, resumes like a kill
]


def metrics(run_dir) -> dict:
    results = json.loads((run_dir / "results.json").read_text())
    return {k: v for k, v in results["metrics"].items() if k != "test/seconds"}


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """The uninterrupted run, then for every point a run interrupted there and the same run started again,
    each in a process of its own (forked by tests.fork_runs, so the imports are paid once)."""
    root = tmp_path_factory.mktemp("interrupted")
    plan = [{"dir": str(root / "whole"), "overrides": RUN}]
    for point, sig in POINTS:
        name = f"{point.replace(':', '')}_{sig}"
        kill = [
            "+callbacks.kill._target_=tests.helpers.KillAt",
            f"+callbacks.kill.point={point}",
            f"+callbacks.kill.marker={root / name / 'killed'}",
            f"+callbacks.kill.signal={sig}",
        ]
        plan += [{"dir": str(root / name / "run"), "overrides": RUN + kill}] * 2
    (root / "plan.json").write_text(json.dumps(plan))
    done = subprocess.run(
        [sys.executable, "-m", "tests.fork_runs", str(root / "plan.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return root, json.loads((root / "plan.json").read_text()), done.stderr


@pytest.mark.parametrize(("point", "sig"), POINTS)
def test_interrupted_run_ends_non_zero_and_resumes_to_the_last_digit(point, sig, interrupted):
    root, plan, stderr = interrupted
    first, second = (spec for spec in plan if spec["dir"] == str(root / f"{point.replace(':', '')}_{sig}" / "run"))
    assert plan[0]["status"] == 0, stderr[-3000:]
    assert first["status"] == (-signal.SIGKILL if sig == "SIGKILL" else 128 + signal.SIGTERM), stderr[-3000:]
    assert second["status"] == 0, stderr[-3000:]  # the same command: it found its checkpoint and went on
    run_dir = Path(second["dir"])
    assert json.loads((run_dir / "results.json").read_text())["resumed_from"] == str(
        run_dir / "checkpoints" / "last.ckpt"
    )
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert all(float(v.min()) >= 0 for k, v in state.items() if k.endswith("singular_values"))  # projected
    assert metrics(run_dir) == metrics(Path(plan[0]["dir"]))  # every metric, to the last digit
    assert curve(run_dir) == curve(Path(plan[0]["dir"]))  # and the learning curve, points before the kill included


def curve(run_dir) -> list[dict]:
    return json.loads((run_dir / "results.json").read_text())["curve"]["points"]


def test_sigterm_ends_train_py_with_143_and_one_line(tmp_path):
    # train.py itself (the runs above are forked from one interpreter): exit 143, one line, no results.
    kill = [
        "+callbacks.kill._target_=tests.helpers.KillAt",
        "+callbacks.kill.point=step:2",
        f"+callbacks.kill.marker={tmp_path / 'killed'}",
        "+callbacks.kill.signal=SIGTERM",
    ]
    cmd = [sys.executable, "train.py", *RUN, "trainer.max_epochs=1", f"hydra.run.dir={tmp_path / 'run'}", *kill]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: run in {tmp_path / 'run'} stopped by SIGTERM")
    run_dir = tmp_path / "run"
    assert not (run_dir / "results.json").exists() and (run_dir / "checkpoints" / "last.ckpt").exists()


# A command run in a process of its own whose validation and test batches take SLOW_BATCH seconds each when
# SVE_TEST_SLOW names a marker file (one byte appended as each such batch starts): scoring long enough to be
# stopped in it, and the bytes count the batches it scored after the signal.
SLOW_BATCH = 1.0
SLOWED = """
import os, pathlib, sys, time
from sve.training.module import EnsembleModule
marker = pathlib.Path(os.environ["SVE_TEST_SLOW"])
def slowed(method):
    def slow(self, *args, **kwargs):
        with marker.open("ab") as f:
            f.write(b"x")
        time.sleep({pause})
        return method(self, *args, **kwargs)
    return slow
EnsembleModule.val_predictive = slowed(EnsembleModule.val_predictive)
EnsembleModule.test_step = slowed(EnsembleModule.test_step)
from sve.cli.{command} import main
main()
"""


def stopped_in_scoring(command: str, args: list[str], marker: Path) -> tuple[int, int, str]:
    """(exit status, slowed batches started after SIGTERM, stderr) of ``command`` (train or evaluate) stopped
    once it scores its first slowed batch. Batches, not seconds: the seconds to exit include the interpreter's
    teardown, which a loaded machine stretches past any fixed bound (10-13 s seen with a sweep beside the suite),
    while a run that ignored the signal would go on through every batch of the pass."""
    import os
    import time

    code = SLOWED.format(pause=SLOW_BATCH, command=command)
    process = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "SVE_TEST_SLOW": str(marker)},
    )
    try:
        deadline = time.monotonic() + 300
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), process.communicate(timeout=60)[1][-3000:]
        started = max(marker.stat().st_size, 1)  # the first batch's byte, even if not yet on disk
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
        return process.returncode, marker.stat().st_size - started, stderr
    finally:
        process.kill()


def test_sigterm_in_a_learning_curve_point_ends_the_run_within_seconds_and_it_resumes(tmp_path):
    # trainer=debug on ARC-Easy: a curve point scored the whole validation split (570 questions) before the run
    # looked at the signal again; SIGTERM took more than 60 s. Here a point is 20 batches of 1 s.
    overrides = [
        "backbone=tiny_vit",
        "dataset=synthetic_image",
        "method=sve",
        "ensemble_size=2",
        "trainer=cpu",
        "trainer.max_epochs=1",
        "+trainer.limit_train_batches=2",
        "+trainer.limit_val_batches=0",
        "callbacks=default",
        "dataset.num_val=160",
        "+trainer.enable_progress_bar=false",
    ]
    run_dir = tmp_path / "run"
    status, batches, stderr = stopped_in_scoring(
        "train", [*overrides, f"hydra.run.dir={run_dir}"], tmp_path / "scoring"
    )
    assert status == 128 + signal.SIGTERM, stderr[-3000:]
    assert batches <= 1, batches  # the batch in progress at most, not the point's other 19
    assert stderr.strip().splitlines()[-1].startswith(f"error: run in {run_dir} stopped by SIGTERM")
    assert not (run_dir / "results.json").exists()
    assert run(compose_cfg(overrides, run_dir))["curve"]["points"][0]["examples"] == 160  # the same command goes on


def test_sigterm_ends_a_re_evaluation_with_143_not_0(tmp_path):
    # Lightning's stop is a SystemExit without a code: unhandled, sve-eval stopped in scoring exits 0, as if finished.
    run_dir = tmp_path / "run"
    run(
        compose_cfg(
            ["backbone=tiny_vit", "method=sve", "ensemble_size=2", "callbacks=default", "dataset.num_test=200"], run_dir
        )
    )
    args = [f"run_dir={run_dir}", "trainer.limit_test_batches=null"]
    status, batches, stderr = stopped_in_scoring("evaluate", args, tmp_path / "scoring")
    assert status == 128 + signal.SIGTERM and batches <= 1, (status, batches, stderr[-3000:])
    assert stderr.strip().splitlines()[-1].startswith(f"error: evaluation of {run_dir} stopped by SIGTERM")
    from sve.runs.reevaluate import evaluate_run

    assert evaluate_run(run_dir, ["trainer.limit_test_batches=null"])["metrics"]["test/examples"] == 200


def test_sigterm_in_the_last_batch_of_an_evaluation_set_stops_before_the_next(tmp_path):
    # Lightning looks at the signal after every test batch but a pass's last, and forgets it at its next call:
    # unless the run checks between sets, it goes on through every set after it and writes results.json.
    from sve.errors import RunInterrupted

    overrides = [
        "backbone=tiny_vit",
        "method=sve",
        "ensemble_size=2",
        "callbacks=default",
        "+callbacks.kill._target_=tests.helpers.KillAt",
        "+callbacks.kill.point=test_end:0",
        f"+callbacks.kill.marker={tmp_path / 'killed'}",
        "+callbacks.kill.signal=SIGTERM",
    ]
    with pytest.raises(RunInterrupted, match="stopped by SIGTERM"):
        run(compose_cfg(overrides, tmp_path / "run"))
    assert not (tmp_path / "run" / "results.json").exists()
    resumed = run(compose_cfg(overrides, tmp_path / "run"))
    assert resumed["resumed_from"] == str(tmp_path / "run" / "checkpoints" / "last.ckpt")


def crashed_run(tmp_path, *extra):
    """A run that crashed after 4 training batches (its checkpoint holds step 3)."""
    overrides = [
        "backbone=tiny_vit",
        "method=sve",
        "ensemble_size=2",
        "callbacks=default",
        "callbacks.checkpoint.every_n_steps=1",
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=4",
        *extra,
    ]
    crash = [
        "+callbacks.crash._target_=tests.helpers.Crash",
        "+callbacks.crash.after_batches=3",
        f"+callbacks.crash.marker={tmp_path / 'crashed'}",
    ]
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(compose_cfg([*overrides, *crash], tmp_path / "run"))
    return overrides + crash


def test_ctrl_c_stops_the_run_saying_that_the_same_command_resumes_it(tmp_path):
    import signal

    from sve.errors import RunInterrupted

    overrides = [
        "backbone=tiny_vit",
        "method=sve",
        "ensemble_size=2",
        "callbacks=default",
        "callbacks.checkpoint.every_n_steps=1",
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=4",
        "+callbacks.crash._target_=tests.helpers.Crash",
        "+callbacks.crash.after_batches=3",
        f"+callbacks.crash.marker={tmp_path / 'interrupted'}",
        "+callbacks.crash.error=KeyboardInterrupt",
    ]
    handler = signal.getsignal(signal.SIGINT)
    # The message says where the same command resumes: step 2's checkpoint (the crash came before step 3's).
    said = r"stopped by Ctrl-C at step 3; nothing was written.*same command again: it resumes from step 2 \("
    with pytest.raises(RunInterrupted, match=said) as stop:
        run(compose_cfg(overrides, tmp_path / "run"))
    assert stop.value.signal_number == signal.SIGINT and not (tmp_path / "run" / "results.json").exists()
    assert signal.getsignal(signal.SIGINT) is handler  # Lightning's shutdown had set Ctrl-C to be ignored
    assert run(compose_cfg(overrides, tmp_path / "run"))["resumed_from"]


def test_a_run_directory_refuses_another_config(tmp_path):
    overrides = crashed_run(tmp_path)
    assert (tmp_path / "run" / "run_config.yaml").exists()
    with pytest.raises(InputError, match=r"started with another config .*optimizer\.lr: 0\.001 -> 0\.5"):
        run(compose_cfg([*overrides, "optimizer.lr=0.5"], tmp_path / "run"))
    with pytest.raises(InputError, match=r"ensemble_size: 2 -> 3.*resume_with_changes=true"):
        run(compose_cfg([*overrides, "ensemble_size=3"], tmp_path / "run"))
    # Watching differently is no change: more frequent checkpoints, another logger setting.
    results = run(
        compose_cfg(
            [*overrides, "callbacks.checkpoint.every_n_steps=2", "trainer.log_every_n_steps=3"], tmp_path / "run"
        )
    )
    assert results["resumed_from"] and results["config_changes_on_resume"] == []
    # A finished run is not returned for another config either.
    with pytest.raises(InputError, match=r"seed: 0 -> 1.*skip_finished=false"):
        run(compose_cfg([*overrides, "seed=1"], tmp_path / "run"))


def test_a_finished_run_started_again_with_skip_finished_false_and_other_values_is_refused_or_recorded(tmp_path):
    # skip_finished=false resumes the finished run's last.ckpt (its trained model); with other values, unless refused
    # or recorded, results.json would say optimizer.lr=0.5, config_changes_on_resume [], for a model trained (and
    # not trained again) with 0.001.
    base = ["backbone=tiny_vit", "method=sve", "ensemble_size=2", "callbacks=default", "trainer.max_epochs=1"]
    first = run(compose_cfg(base, tmp_path / "run"))
    again = [*base, "optimizer.lr=0.5", "skip_finished=false"]
    with pytest.raises(InputError, match=r"optimizer\.lr: 0\.001 -> 0\.5.*another directory") as refused:
        run(compose_cfg(again, tmp_path / "run"))
    assert "skip_finished=false to run it again" not in str(refused.value)  # the advice that led here
    results = run(compose_cfg([*again, "resume_with_changes=true"], tmp_path / "run"))
    assert results["config_changes_on_resume"] == [["optimizer.lr", 0.001, 0.5]]
    assert results["metrics"]["test/nll"] == first["metrics"]["test/nll"]  # the same model: nothing trained again


def test_a_start_that_left_no_work_does_not_bind_its_directory(tmp_path):
    # A wrong data path fails before the first checkpoint; the corrected command in the same directory runs.
    base = [
        "backbone=tiny_vit",
        "method=sve",
        "ensemble_size=2",
        "callbacks=default",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
    ]
    with pytest.raises(InputError, match="absent"):
        run(compose_cfg([*base, "dataset=image_folder", f"dataset.root={tmp_path / 'absent'}"], tmp_path / "run"))
    assert (tmp_path / "run" / "run_config.yaml").exists() and not (tmp_path / "run" / "checkpoints").exists()
    results = run(compose_cfg([*base, "optimizer.lr=0.002"], tmp_path / "run"))
    assert results["config_changes_on_resume"] == [] and results["resumed_from"] is None
    assert yaml.safe_load((tmp_path / "run" / "run_config.yaml").read_text())["optimizer"]["lr"] == 0.002
    # Once it holds a checkpoint (and here results), the directory is bound again.
    with pytest.raises(InputError, match=r"started with another config .*optimizer\.lr: 0\.002 -> 0\.003"):
        run(compose_cfg([*base, "optimizer.lr=0.003"], tmp_path / "run"))


def test_resume_with_changes_continues_and_records_them(tmp_path):
    overrides = crashed_run(tmp_path)
    results = run(
        compose_cfg([*overrides, "trainer.gradient_clip_val=0.5", "resume_with_changes=true"], tmp_path / "run")
    )
    assert results["config_changes_on_resume"] == [["trainer.gradient_clip_val", 1.0, 0.5]]


def test_a_checkpoint_of_another_shape_or_kind_is_refused_in_one_line(tmp_path, monkeypatch):
    crashed_run(tmp_path)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    base = ["backbone=tiny_vit", "method=sve", "callbacks=default", "trainer.max_epochs=2"]
    with monkeypatch.context() as patch:  # refused before the model (its download, its SVD) is built
        patch.setattr("sve.runs.run.build", lambda cfg: pytest.fail("built the model before checking the checkpoint"))
        with pytest.raises(InputError, match=r"written by a run with another config: ensemble_size: 2 -> 3"):
            run(compose_cfg([*base, "ensemble_size=3", f"ckpt_path={last}"], tmp_path / "other"))
    # Without the config in it (a checkpoint from elsewhere), the tensors' shapes name the difference.
    state = torch.load(last, weights_only=True)
    state["callbacks"]["LastCheckpoint"]["run_config"] = None
    foreign = tmp_path / "foreign.ckpt"
    torch.save(state, foreign)
    with pytest.raises(
        InputError,
        match=r"another model: \d+ tensor\(s\) of another shape, e.g. \S+singular_values "
        r"\[2, \d+\] \(model \[3, \d+\]\)",
    ):
        run(compose_cfg([*base, "ensemble_size=3", f"ckpt_path={foreign}"], tmp_path / "other2"))
    # final.ckpt holds weights for evaluate.py, not a training state.
    done = run(
        compose_cfg(["backbone=tiny_vit", "method=sve", "ensemble_size=2", "callbacks=default"], tmp_path / "done")
    )
    assert done["num_members"] == 2
    final = tmp_path / "done" / "checkpoints" / "final.ckpt"
    with pytest.raises(InputError, match=r"final.ckpt holds the trained weights only.*evaluate.py"):
        run(compose_cfg([*base, "ensemble_size=2", f"ckpt_path={final}"], tmp_path / "other3"))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("+ensembel_size=2", r"ensembel_size: no such option \(did you mean ensemble_size\?\)"),
        (
            "+trainer.limt_train_batches=3",
            r"trainer.limt_train_batches: no such option \(did you mean limit_train_batches",
        ),
        ("+method.sigma_int=0.1", r"method.sigma_int: no such option \(did you mean sigma_init\?\). sve.methods.SVE"),
        ("+dataset.trian_size=3", r"dataset.trian_size: no such option \(did you mean train_size\?\)"),
        ("+optimizer.betas2=[0.9,0.99]", r"optimizer.betas2: no such option \(did you mean betas\?\)"),
        ("+callbacks.checkpoint.every_n_step=3", r"callbacks.checkpoint.every_n_step: .*every_n_steps"),
        ("+logger.versoin=1", r"logger.versoin: no such option"),
        ("+backbone.model_kwargs.dropp_rate=0.1", None),  # a plain dict passed on whole: timm's to judge
    ],
)
def test_keys_the_code_does_not_read_are_refused(override, message, tmp_path):
    cfg = compose_cfg([override, "trainer.max_epochs=1", "callbacks=default"], tmp_path)
    if message is None:
        from sve.runs.validate import check_known_keys

        check_known_keys(cfg)
        return
    with pytest.raises(InputError, match=message):
        run(cfg)
    assert not (tmp_path / "results.json").exists() and not (tmp_path / "checkpoints").exists()


def test_a_method_that_cannot_build_its_members_is_refused_before_training(tmp_path):
    cfg = compose_cfg(
        ["method=checkpoint_ensemble", "ensemble_size=4", "trainer.max_epochs=2", "callbacks=default"], tmp_path
    )
    with pytest.raises(InputError, match=r"ensemble_size=4 needs at least 4 epochs.*trains 2"):
        run(cfg)
    assert not (tmp_path / "checkpoints").exists()
    cfg = compose_cfg(
        [
            "method=checkpoint_ensemble",
            "ensemble_size=4",
            "trainer.max_epochs=9",
            "+trainer.max_steps=6",
            "trainer.limit_train_batches=3",
        ],
        tmp_path / "steps",
    )
    with pytest.raises(InputError, match=r"trains 2 \(trainer.max_epochs / trainer.max_steps\)"):
        run(cfg)


def test_sve_warns_when_a_pretrained_head_and_no_noise_make_members_identical(monkeypatch):
    from sve.backbones.timm_vit import TimmBackbone
    from sve.runs.run import build

    monkeypatch.setattr(
        TimmBackbone, "initial_head", lambda self, task, C: (torch.zeros(C, self.feature_dim), torch.zeros(C))
    )
    with pytest.warns(UserWarning, match=r"sigma_init=0, so the 4 members start as one model.*sigma_init > 0"):
        build(compose_cfg(["method=sve", "sigma_init=0"]))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        build(compose_cfg(["method=sve", "sigma_init=0.01"]))  # the noise tells them apart
        build(compose_cfg(["method=svf", "ensemble_size=1"]))  # one member by design


def test_divergence_names_the_step_and_learning_rate(tmp_path):
    # Huge but finite weights: the loss of the next step, or the weights themselves, stop the run.
    cfg = compose_cfg(["method=single", "method.lr=1e20", "trainer.gradient_clip_val=null"], tmp_path)
    with pytest.raises(TrainingDiverged, match=r"diverged: .* step \d+ \(epoch 0\) with learning rate \d\S*e\+(19|20)"):
        run(cfg)
    assert not (tmp_path / "results.json").exists()


def test_divergence_names_the_configured_learning_rate_beside_the_scheduled_one(tmp_path):
    # Found at the last step of a cosine schedule, whose rate is 0 there: the message said "learning rate 0",
    # not the configured 1e6 that caused it.
    with pytest.raises(
        TrainingDiverged,
        match=r"after optimiser step 3 \(epoch 0\) with learning rate 0 \(scheduled "
        r"at this step; configured 1e\+06\)",
    ):
        run(compose_cfg(["optimizer.lr=1e6"], tmp_path))


def test_non_finite_inputs_are_the_data_s_fault(tmp_path, monkeypatch):
    from sve.data.synthetic import SyntheticImageData

    collate = SyntheticImageData.collate

    def poisoned(self, examples):
        batch = collate(self, examples)
        batch["pixel_values"][0, 0, 0, 0] = float("nan")
        return batch

    monkeypatch.setattr(SyntheticImageData, "collate", poisoned)
    with pytest.raises(InputError, match=r"training batch of step 0 .* non-finite input values \(pixel_values: 1 NaN"):
        run(compose_cfg(["method=single"], tmp_path))


def test_user_errors_are_one_line_and_a_debug_flag_shows_the_traceback(tmp_path, monkeypatch, capsys):
    cmd = [sys.executable, "train.py", "trainer=debug", "+ensembel_size=2", f"hydra.run.dir={tmp_path / 'a'}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and done.stderr.strip().splitlines()[-1].startswith(
        "error: ensembel_size: no such option (did you mean ensemble_size?)"
    )
    from sve.errors import one_line_errors

    with pytest.raises(SystemExit) as exit_, one_line_errors():
        raise InputError("dataset.root=/x: no such directory")
    assert exit_.value.code == 2 and capsys.readouterr().err.startswith("error: dataset.root=/x: no such directory")
    monkeypatch.setenv("SVE_DEBUG", "1")  # the traceback, then the same line
    with pytest.raises(SystemExit), one_line_errors():
        raise InputError("dataset.root=/x: no such directory")
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1] == "error: dataset.root=/x: no such directory"
    monkeypatch.delenv("SVE_DEBUG")
    with pytest.raises(KeyError), one_line_errors():  # a bug keeps its traceback, flag or not
        raise KeyError("bug")
    # A value a class checks when Hydra builds it (InstantiationException around the class's InputError)
    from sve.runs.run import build

    for override, line in (
        ("method.members_at_once=0", "error: method.members_at_once=0 is not valid; choose"),
        ("aggregate=mean", "error: aggregate='mean' is not valid; choose one of"),
    ):
        with pytest.raises(SystemExit) as exit_, one_line_errors():
            build(compose_cfg([override], tmp_path / "b"))
        assert exit_.value.code == 2 and capsys.readouterr().err.startswith(line), override
    # A run directory that cannot be written: one line before Hydra's log file would fail on it.
    (tmp_path / "file").write_text("")
    cmd = [sys.executable, "train.py", "trainer=debug", f"hydra.run.dir={tmp_path / 'file' / 'run'}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: the run directory {tmp_path / 'file' / 'run'} is not writable")
    )
