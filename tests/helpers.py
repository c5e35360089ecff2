"""Callbacks that tests add to real runs from the command line (``+callbacks.NAME._target_=tests.helpers.X``)."""

import time

import pytorch_lightning as pl


class Pace(pl.Callback):
    """Sleeps after every training batch, so a test can kill the run mid-epoch; changes no number."""

    def __init__(self, seconds: float = 0.2):
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(self.seconds)


class Trace(pl.Callback):
    """Debug: appends step, labels, parameter sum and RNG digest per batch to ``path``."""

    def __init__(self, path: str):
        self.path = path

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        import torch

        s = sum(float(p.double().sum()) for p in pl_module.parameters() if p.requires_grad)
        r = float(torch.get_rng_state().double().sum())
        with open(self.path, "a") as f:
            f.write(f"{trainer.global_step} {batch_idx} {batch['labels'].tolist()} {s:.10f} {r}\n")


class Crash(pl.Callback):
    """Raises after the ``after_batches``-th training batch of this process (counted across fits, e.g. the
    rounds of a sequential ensemble), once: the marker file makes the next attempt run through."""

    def __init__(self, after_batches: int, marker: str, per_rank: bool = False, error: str = "RuntimeError"):
        self.after_batches = after_batches
        self.marker = marker
        self.per_rank = per_rank  # a marker per process: every rank of a process group crashes, at one batch
        self.error = error  # KeyboardInterrupt: Ctrl-C
        self.seen = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        import pathlib

        self.seen += 1
        marker = pathlib.Path(f"{self.marker}.{trainer.global_rank}" if self.per_rank else self.marker)
        if self.seen == self.after_batches and not marker.exists():
            marker.touch()
            import builtins

            raise getattr(builtins, self.error)(f"simulated crash after {self.seen} training batches")


class KillAt(pl.Callback):
    """SIGKILLs its own process at one point of training, once (the marker file makes the rerun go through):
    ``point`` is ``step:N`` (after training batch N, 0-based, before that step's checkpoint), ``epoch:N`` (at
    the start of epoch N, after the previous epoch-end checkpoint), ``validation:N`` (in epoch N's
    validation) or ``test_end:N`` (in the last batch of evaluation pass N, 0-based: Lightning stops a pass at
    SIGTERM after any other batch). ``signal`` may be ``SIGTERM`` instead."""

    def __init__(self, point: str, marker: str, signal: str = "SIGKILL"):
        self.kind, self.value = point.split(":")[0], int(point.split(":")[1])
        self.marker, self.signal = marker, signal

    def _kill(self) -> None:
        import os
        import pathlib
        import signal

        if not pathlib.Path(self.marker).exists():
            pathlib.Path(self.marker).touch()
            os.kill(os.getpid(), getattr(signal, self.signal))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.kind == "step" and trainer.global_step == self.value + 1:
            self._kill()

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self.kind == "epoch" and trainer.current_epoch == self.value:
            self._kill()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self.kind == "validation" and trainer.current_epoch == self.value and not trainer.sanity_checking:
            self._kill()

    def on_test_start(self, trainer, pl_module) -> None:
        self.passes = getattr(self, "passes", -1) + 1

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        last = batch_idx == trainer.num_test_batches[dataloader_idx] - 1
        if self.kind == "test_end" and self.passes == self.value and last:
            self._kill()


def run_main(monkeypatch, args: list[str], run) -> int:
    """Exit status of sve-train in this process with ``sve.runs.run.run`` replaced by ``run``."""
    import logging
    import sys

    import pytest

    import sve.runs.run
    from sve.cli import train

    monkeypatch.setattr(sve.runs.run, "run", run)
    monkeypatch.setattr(sys, "argv", ["sve-train", *args, "recipe=none"])  # a flag (-m) first, as users type it
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level  # Hydra configures the root logger for its jobs
    try:
        with pytest.raises(SystemExit) as caught:
            train.main()
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        root.setLevel(level)
    return caught.value.code
