"""The training progress bar: Lightning's Rich bar, counting epochs as a reader does (1 to max_epochs), with
its pace and time left from the whole epoch so far.

Rich estimates a task's speed over its last 30 seconds only: with steps slower than that (an LLM step takes
26-36 s) it has no estimate, and Lightning's bar showed ``0.00it/s`` and no time left. Here the pace is the
epoch's batches over its elapsed time, in seconds per batch when slower than one a second."""

from __future__ import annotations

from datetime import timedelta

from pytorch_lightning.callbacks import RichProgressBar
from rich.progress import ProgressColumn
from rich.text import Text


def pace_text(completed: float, elapsed: float | None) -> str:
    """``12.34it/s``, or ``31.2s/it`` below one batch a second; ``–s/it`` before the first batch."""
    if not completed or not elapsed:
        return "–s/it"
    rate = completed / elapsed
    return f"{rate:.2f}it/s" if rate >= 1 else f"{1 / rate:.1f}s/it"


def time_text(completed: float, total: float | None, elapsed: float | None) -> str:
    """``<elapsed> • <left>``, the time left at the pace so far (``-:--:--`` before the first batch or without
    a known total)."""
    spent = "-:--:--" if elapsed is None else str(timedelta(seconds=int(elapsed)))
    known = completed and elapsed and total is not None and total != float("inf")
    left = str(timedelta(seconds=int((total - completed) * elapsed / completed))) if known else "-:--:--"
    return f"{spent} • {left}"


class PaceColumn(ProgressColumn):
    def __init__(self, style) -> None:
        self.style = style
        super().__init__()

    def render(self, task) -> Text:
        return Text(pace_text(task.completed, task.finished_time if task.finished else task.elapsed), style=self.style)


class TimeLeftColumn(ProgressColumn):
    max_refresh = 0.5  # as Lightning's: no jitter

    def __init__(self, style) -> None:
        self.style = style
        super().__init__()

    def render(self, task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        return Text(time_text(task.completed, task.total, elapsed), style=self.style)


class EpochProgressBar(RichProgressBar):
    """Lightning's bar says "Epoch 1/1" in the second epoch of two: the current epoch counted from 0 over the
    last epoch's index. This one says "Epoch 2/2": the epoch running, counted from 1, of the epochs that will
    run. (``_get_train_description`` is the bar's own hook for that text; Lightning has no public one.) Its
    time and speed columns are ``TimeLeftColumn`` and ``PaceColumn`` (module docstring)."""

    def configure_columns(self, trainer) -> list:
        ours = {
            "CustomTimeColumn": TimeLeftColumn(style=self.theme.time),  # Lightning's: elapsed • remaining
            "ProcessingSpeedColumn": PaceColumn(style=self.theme.processing_speed),  # Lightning's: it/s
        }
        return [ours.get(type(c).__name__, c) for c in super().configure_columns(trainer)]

    def _get_train_description(self, current_epoch: int) -> str:
        text = f"Epoch {current_epoch + 1}"
        if self.trainer.max_epochs is not None and self.trainer.max_epochs >= 0:
            text += f"/{self.trainer.max_epochs}"
        if len(self.validation_description) > len(text):  # as Lightning pads it: no flicker beside "Validation"
            text = f"{text:{len(self.validation_description)}}"
        return text
