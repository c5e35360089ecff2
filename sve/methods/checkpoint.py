"""Checkpoint ensemble (the "Ckpt Ensemble" row of Table 3, from Yang et al., 2024): the last M epoch-end
checkpoints of one single-LoRA run, used as M members.

One model (a rank-8 LoRA on the target layers and one head) is trained as usual; ``on_train_epoch_end``
copies its trainable tensors (LoRA factors and head; a few MB even for a 7B backbone), keeping the last M.
After ``after_fit``, the snapshots are the members: their stacked LoRA factors become the layers' member set
(``MemberLayer.use_bank``) and their heads the member heads, so they run like any ensemble's members. With
fewer epochs than M the ensemble could not have M members: such a schedule is refused before training.
The snapshots are part of the module's state (``get_extra_state``), so a checkpoint carries them.
"""

from __future__ import annotations

from contextlib import ExitStack

import torch
from torch import Tensor

from sve.errors import InputError
from sve.methods.heads import apply_heads
from sve.methods.lora import LoRAEnsemble


class CheckpointEnsemble(LoRAEnsemble):
    """Args:
    ensemble_size: number of checkpoints kept (Table 3: 3).
    rank, alpha: the LoRA adapter.
    """

    display_name = "Ckpt Ensemble"
    epoch_snapshots = True
    trains = "one LoRA adapter and the head; its last epoch-end snapshots are the members"

    adapters_per_member = False  # one trained model ...
    shared_head = True  # ... whose last M checkpoints are the members

    def __init__(self, backbone, ensemble_size: int, num_classes: int, **kwargs):
        super().__init__(backbone, ensemble_size, num_classes, **kwargs)
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
                f"method=checkpoint_ensemble keeps the last ensemble_size epoch-end checkpoints: "
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

    def stacked(self, key: str) -> Tensor:
        """(K, ...) from the K snapshots of a (1, ...) tensor."""
        device = self.heads.weight.device
        return torch.cat([c[key].to(device) for c in self.checkpoints])

    def forward(self, batch: dict) -> Tensor:
        if self.training or not self.use_checkpoints:  # the live model: one member
            return super().forward(batch)
        with ExitStack() as stack:
            for name, layer in self.backbone.model.named_modules():
                if name in self.wrapped:
                    key = f"backbone.model.{name}"
                    stack.enter_context(
                        layer.use_bank(lora_A=self.stacked(key + ".lora_A"), lora_B=self.stacked(key + ".lora_B"))
                    )
            return super().forward(batch)

    def member_logits(self, batch: dict, members: list[int]) -> Tensor:
        if not self.use_checkpoints or self.training:
            return super().member_logits(batch, members)
        features = self.member_features(batch, members)  # (K, B, D)
        W, b = self.stacked("heads.weight")[members], self.stacked("heads.bias")[members]  # (K, C, D), (K, C)
        return apply_heads(features, W, b)

    def get_extra_state(self) -> dict:
        return {"checkpoints": self.checkpoints, "use_checkpoints": self.use_checkpoints}

    def set_extra_state(self, state: dict) -> None:
        self.checkpoints = [dict(c) for c in state["checkpoints"]]
        self.use_checkpoints = bool(state["use_checkpoints"])

    def report(self) -> dict:
        return {**super().report(), "checkpoints": len(self.checkpoints)}
