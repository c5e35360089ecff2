"""A run's learning curve: the ensemble's validation metrics at fixed optimiser steps during training.

A budget is only fair to every method if each one has converged within it, and a learning rate is only
tuned if its curve is not still falling; the curve shows both. ``LearningCurve`` (``callbacks.curve`` in
``configs/callbacks/default.yaml``) evaluates the validation predictive (acc, ECE, NLL, Brier; the same
metrics and the same predictive as the final evaluation) before the first step, at ``points`` steps spread
evenly over the planned training (or every ``every_n_steps``) and after the last step. The points go into
``results.json`` under ``curve`` (``sve.runs.run``), and into every checkpoint, so a resumed run's curve is the
uninterrupted run's.

It evaluates by itself rather than through Lightning's validation loop, for three reasons: its steps are
optimiser steps counted over the whole run (Lightning's ``val_check_interval`` counts batches and restarts
its schedule with resumed mid-epoch positions); it can use a prefix of the validation split
(``val_batches``) to keep the cost to a few percent of training; and it restores the random state it found,
so a run with a curve trains exactly as one without (its draws are seeded per batch, ``EnsembleModule.draws``).
"""

from __future__ import annotations

import torch
from pytorch_lightning import Callback

from sve.metrics.scores import classification_metrics
from sve.training.loops import limited_batches, progress, stop_if_asked


class LearningCurve(Callback):
    """Validation metrics at fixed optimiser steps (module docstring).

    Args:
        points: evaluations spread evenly over the planned optimiser steps, besides the one before the first
            step and the one after the last (null: only ``every_n_steps``).
        every_n_steps: evaluate every this many optimiser steps (null: only ``points``).
        val_batches: evaluate on the first this many validation batches (null: the whole split); the batches
            are fixed (``sve.data.sampling``), so every point scores the same examples. Never more than
            ``trainer.limit_val_batches`` lets Lightning's validation run (``trainer=debug``: 2), unless that is 0
            (Lightning's validation off; the curve then validates by itself).

    Each point shows a progress bar when the trainer does, and stops at the batch in which the run received
    SIGTERM (``sve.training.loops``).
    """

    def __init__(self, points: int | None = 4, every_n_steps: int | None = None, val_batches: int | None = None):
        for key, value in (("points", points), ("every_n_steps", every_n_steps), ("val_batches", val_batches)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"callbacks.curve.{key}={value!r} is not valid; expected a positive integer or null")
        self.points = points
        self.every_n_steps = every_n_steps
        self.val_batches = val_batches
        self.curve: list[dict] = []  # {"step", "epoch", "examples", "val/acc", ...}, in step order
        self.steps: set[int] = set()
        self.total_steps = 0

    def planned_steps(self, total: int) -> set[int]:
        """The optimiser steps evaluated in a run of ``total`` steps: 0, the last, and the schedule between."""
        steps = {0, total}
        if self.points:
            steps |= {round(total * (i + 1) / (self.points + 1)) for i in range(self.points)}
        if self.every_n_steps:
            steps |= set(range(self.every_n_steps, total, self.every_n_steps))
        return steps

    def on_train_start(self, trainer, pl_module) -> None:
        self.total_steps = int(trainer.estimated_stepping_batches)
        self.steps = self.planned_steps(self.total_steps)
        if trainer.global_step == 0:  # a resumed run has its earlier points from the checkpoint
            self.evaluate(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # Checkpoint callbacks run after this one (Lightning calls them last): a checkpoint written at this
        # step holds this step's point.
        stepped = (batch_idx + 1) % trainer.accumulate_grad_batches == 0
        if stepped and trainer.global_step in self.steps and not self.has(trainer.global_step):
            self.evaluate(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if not self.has(trainer.global_step):  # a run stopped before its planned total (max_steps, a test)
            self.evaluate(trainer, pl_module)

    def has(self, step: int) -> bool:
        return bool(self.curve) and self.curve[-1]["step"] == step

    @torch.no_grad()
    def evaluate(self, trainer, pl_module) -> None:
        datamodule = trainer.datamodule
        metrics = classification_metrics().to(pl_module.device)  # synced over processes on compute
        was_training = pl_module.training
        examples = 0
        # Creating a DataLoader iterator draws from the global generator; dropout layers draw too: the state
        # is put back so that training continues with exactly the numbers it would have drawn.
        with torch.random.fork_rng(devices=[pl_module.device] if pl_module.device.type == "cuda" else []):
            pl_module.eval()
            loader = datamodule.val_dataloader()
            total = self.batches(len(loader), trainer.limit_val_batches)
            shown = trainer.progress_bar_callback is not None
            bar = progress(total, f"learning curve, step {trainer.global_step}", shown)
            try:
                for _, batch in zip(range(total), loader):
                    probs, labels = pl_module.val_predictive(trainer.strategy.batch_to_device(batch))
                    if labels.numel():
                        metrics.update(probs, labels)
                        examples += int(labels.numel())
                    bar.update()
                    stop_if_asked(trainer)
            finally:
                bar.close()
                pl_module.train(was_training)
        values = {f"val/{k}": float(v) for k, v in metrics.compute().items()}
        if trainer.world_size > 1:  # each process scored its own batches
            examples = int(trainer.strategy.reduce(torch.tensor(examples, device=pl_module.device), reduce_op="sum"))
        self.curve.append(
            {"step": int(trainer.global_step), "epoch": round(self.epoch(trainer), 4), "examples": examples, **values}
        )

    def batches(self, available: int, limit: int | float | None) -> int:
        """The validation batches a point scores: ``val_batches``, within Lightning's ``limit_val_batches``
        (0 turns Lightning's validation off, not the curve's)."""
        count = available if self.val_batches is None else min(available, self.val_batches)
        return count if limit == 0 else min(count, limited_batches(available, limit))

    def epoch(self, trainer) -> float:
        """Epochs done at the current step, as a fraction (the x axis a reader of a curve may prefer)."""
        per_epoch = max(1, self.total_steps // max(1, trainer.max_epochs or 1))
        return trainer.global_step / per_epoch

    # What Lightning stores under checkpoint["callbacks"]["LearningCurve"]: a resumed run keeps its points.
    def state_dict(self) -> dict:
        return {"curve": list(self.curve)}

    def load_state_dict(self, state: dict) -> None:
        self.curve = list(state.get("curve", []))

    def record(self) -> dict:
        """What ``results.json`` holds under ``curve``."""
        return {
            "points": self.curve,
            "schedule": {"points": self.points, "every_n_steps": self.every_n_steps, "val_batches": self.val_batches},
            "total_steps": self.total_steps,
        }
