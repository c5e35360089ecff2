"""Checkpoint ensemble (the "Ckpt Ensemble" row of Table 3, from Yang et al., 2024): the last M epoch-end
checkpoints of one single-LoRA run, used as M members.

One model (a rank-8 LoRA on the target layers and one head) is trained as usual; each epoch end copies its
trainable tensors (LoRA factors and head; a few MB even for a 7B backbone), keeping the last M, and a
schedule of fewer than M epochs is refused before training (``sve.methods.kinds.SnapshotMethod``). After
``after_fit``, the snapshots are the members: their stacked LoRA factors become the layers' member set
(``MemberLayer.use_bank``) and their heads the member heads, so they run like any ensemble's members.
"""

from __future__ import annotations

from contextlib import ExitStack

import torch
from torch import Tensor

from sve.methods.heads import apply_heads
from sve.methods.kinds import SnapshotMethod
from sve.methods.lora import LoRAEnsemble


class CheckpointEnsemble(SnapshotMethod, LoRAEnsemble):
    """Args:
    ensemble_size: number of checkpoints kept (Table 3: 3).
    rank, alpha: the LoRA adapter.
    """

    display_name = "Ckpt Ensemble"
    trains = "one LoRA adapter and the head; its last epoch-end snapshots are the members"

    adapters_per_member = False  # one trained model, whose last M checkpoints are the members

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
