"""Kinds of method whose members are not M models trained side by side, as base classes: the plan, the
benchmark, ``sve.wrap`` and ``merge`` ask for the kind (``isinstance``, the registry's facts), not for a flag.

- ``SampledMethod``: the members are ``num_samples`` samples of one model (stochastic passes, posterior samples).
- ``SnapshotMethod``: the members are the last ``ensemble_size`` epoch-end snapshots of one model.
- ``FittedAfterTraining``: ``after_fit`` fits something on the training split (a Laplace posterior).

A method may be of several kinds (Bayes-LoRA: sampled, and fitted after training); the kinds come before the
class it builds on (``class MCDropoutLoRA(SampledMethod, SingleLoRA)``), so that their hooks are found first.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sve.errors import InputError
from sve.methods.base import EnsembleMethod


class SampledMethod(EnsembleMethod):
    """One model trains, as one member with one head; at evaluation its members are ``num_samples`` samples of
    it. So ``ensemble_size`` is 1 and the member count is ``method.num_samples`` (what the plan and the
    benchmark set). A subclass stores ``num_samples`` and makes its samples the members while it runs."""

    fixed_ensemble_size = 1
    shared_head = True
    num_samples: int

    def num_members(self) -> int:
        return 1 if self.training else self.num_samples


class SnapshotMethod(EnsembleMethod):
    """One model trains, with one head; every epoch end copies its trainable tensors (``snapshot``), keeping the
    last ``ensemble_size``, and after ``after_fit`` those copies are the members. A subclass runs them
    (``checkpoints``, in order). With fewer epochs than ``ensemble_size`` there could not be that many members:
    such a schedule is refused before training. The snapshots are part of the module's state
    (``get_extra_state``), so a checkpoint carries them."""

    shared_head = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.checkpoints: list[dict[str, Tensor]] = []
        self.use_checkpoints = False

    @torch.no_grad()
    def snapshot(self) -> None:
        """Copies the trainable tensors; keeps the last ``ensemble_size`` copies."""
        self.checkpoints.append({n: p.detach().clone() for n, p in self.named_parameters() if p.requires_grad})
        self.checkpoints = self.checkpoints[-self.ensemble_size :]

    def check_training(self, epochs: int) -> None:
        if epochs < self.ensemble_size:
            raise InputError(
                f"{type(self).__name__} keeps the last ensemble_size epoch-end checkpoints: "
                f"ensemble_size={self.ensemble_size} needs at least {self.ensemble_size} epochs, and "
                f"this schedule trains {epochs} (trainer.max_epochs / trainer.max_steps); train longer "
                "or lower ensemble_size"
            )

    def on_train_epoch_end(self, module) -> None:
        self.snapshot()

    def after_fit(self, datamodule) -> None:
        if not self.checkpoints:
            self.snapshot()
        self.use_checkpoints = True

    def num_members(self) -> int:
        return len(self.checkpoints) if self.use_checkpoints and not self.training else 1

    def get_extra_state(self) -> dict:
        return {"checkpoints": self.checkpoints, "use_checkpoints": self.use_checkpoints}

    def set_extra_state(self, state: dict) -> None:
        self.checkpoints = [dict(c) for c in state["checkpoints"]]
        self.use_checkpoints = bool(state["use_checkpoints"])

    def report(self) -> dict:
        return {**super().report(), "checkpoints": len(self.checkpoints)}


class FittedAfterTraining(EnsembleMethod):
    """``after_fit`` fits something on the training split (``datamodule.train_dataloader()``: a Laplace
    posterior), so whoever calls it passes the data: ``run``, ``sve.wrap``'s ``finish_training(loader)``, the
    benchmark. What it fits is part of the module's state (``get_extra_state``): a checkpoint written after the
    fit carries it, and evaluation never refits."""


__all__ = ["SampledMethod", "SnapshotMethod", "FittedAfterTraining"]
