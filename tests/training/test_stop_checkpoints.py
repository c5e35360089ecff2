"""A stop never promises a resume it cannot give: SIGTERM writes a checkpoint at the next optimiser step (a
short run may never reach a step-count or epoch-end checkpoint), a checkpoint also comes every
``every_n_minutes`` of training, and the stop message says from which step the same command resumes, or that it
starts over."""

from __future__ import annotations

import os
import signal

import pytest
import pytorch_lightning as pl

from sve.errors import RunInterrupted
from sve.runs.run import interrupted, run
from sve.training.checkpoint import read_checkpoint
from tests.conftest import compose_cfg

# 6 batches, 2 to an optimiser step: 3 steps in the one epoch; no checkpoint by steps or by time.
BASE = [
    "backbone=tiny_vit",
    "method=sve",
    "ensemble_size=2",
    "+backbone.model_kwargs.drop_rate=0.2",  # random states matter too
    "callbacks=default",
    "callbacks.checkpoint.every_n_steps=null",
    "callbacks.checkpoint.every_n_minutes=null",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=6",
    "trainer.accumulate_grad_batches=2",
]


class SigtermAtBatch(pl.Callback):
    """Sends SIGTERM to this process after training batch ``batch`` (0-based), once (the marker file)."""

    def __init__(self, batch: int, marker: str):
        self.batch, self.marker = batch, marker

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx == self.batch and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGTERM)  # Lightning's handler records it; its loop stops at a batch end


def test_sigterm_between_steps_checkpoints_at_the_step_and_resumes_there_to_the_last_digit(tmp_path):
    whole = run(compose_cfg(BASE, tmp_path / "whole"))
    stop = [
        f"+callbacks.stop._target_={__name__}.SigtermAtBatch",
        "+callbacks.stop.batch=2",  # the first half of step 2
        f"+callbacks.stop.marker={tmp_path / 'stopped'}",
    ]
    with pytest.raises(RunInterrupted, match=r"at step 2; nothing was written.* resumes from step 2 \(") as caught:
        run(compose_cfg([*BASE, *stop], tmp_path / "run"))
    assert caught.value.signal_number == signal.SIGTERM
    state = read_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert state["global_step"] == 2 and tuple(state["callbacks"]["LastCheckpoint"]["position"]) == (0, 2)
    again = run(compose_cfg([*BASE, *stop], tmp_path / "run"))
    assert again["resumed_from"] and again["metrics"].pop("test/seconds") and whole["metrics"].pop("test/seconds")
    assert again["metrics"] == whole["metrics"]  # mid-epoch, at the step it stopped at


@pytest.mark.parametrize(("minutes", "written"), [(1e-9, True), (60, False)])
def test_a_checkpoint_comes_every_n_minutes_of_training(tmp_path, minutes, written):
    crash = [
        "+callbacks.crash._target_=tests.helpers.Crash",
        "+callbacks.crash.after_batches=6",  # in the last batch of step 3, before its checkpoint
        f"+callbacks.crash.marker={tmp_path / 'crashed'}",
    ]
    timed = [*BASE, f"callbacks.checkpoint.every_n_minutes={minutes}", *crash]
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(compose_cfg(timed, tmp_path / "run"))
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert last.exists() == written
    if written:
        assert read_checkpoint(last)["global_step"] == 2  # each step once a minute is due; step 3 crashed first


def test_a_stop_without_a_checkpoint_says_the_same_command_starts_over(tmp_path):
    message = str(interrupted(tmp_path, "SIGTERM", signal.SIGTERM, checkpoint=None))
    assert "starts over" in message and "resume" not in message
