"""Checkpoint ensemble (the "Ckpt Ensemble" row of Table 3, from Yang et al., 2024): the last M epoch-end
checkpoints of one single-LoRA run, used as M members.

One model (a rank-8 LoRA on the target layers and one head) is trained as usual; ``on_train_epoch_end``
copies its trainable tensors (LoRA factors and head; a few MB even for a 7B backbone), keeping the last M.
After ``after_fit``, evaluation runs all kept checkpoints in one batched forward by substituting their
stacked LoRA factors into the LoRA layers (``LoRALayer.substitute``). With fewer epochs than M, the
ensemble has as many members as epochs (recorded in ``report()``).
"""

from __future__ import annotations

from contextlib import ExitStack

import torch
from torch import Tensor

from sve.members import check_member_logits, repeat_batch, split_members
from sve.methods.base import EnsembleMethod, mask_choices
from sve.methods.lora import inject_lora


class CheckpointEnsemble(EnsembleMethod):
    """Args:
    ensemble_size: number of checkpoints kept (Table 3: 3).
    rank, alpha: the LoRA adapter.
    target_modules: overrides the backbone's patterns.
    """

    def __init__(self, backbone, ensemble_size: int, num_classes: int, rank: int = 8, alpha: float = 8.0,
                 target_modules: list[str] | None = None, lr: float | None = None):
        super().__init__(backbone, 1, num_classes, lr)  # one trained model ...
        self.ensemble_size = ensemble_size  # ... whose last M checkpoints are the members
        self.wrapped = inject_lora(self, 1, rank, alpha, target_modules)
        self.layers = [backbone.model.get_submodule(name) for name in self.wrapped]
        self.checkpoints: list[dict[str, Tensor]] = []
        self.use_checkpoints = False
        self.log_summary(self.wrapped)

    @torch.no_grad()
    def snapshot(self) -> None:
        """Copies the trainable tensors; keeps the last ``ensemble_size`` copies."""
        self.checkpoints.append({n: p.detach().clone() for n, p in self.named_parameters() if p.requires_grad})
        self.checkpoints = self.checkpoints[-self.ensemble_size:]

    def on_train_epoch_end(self, module) -> None:
        self.snapshot()

    def after_fit(self, datamodule) -> None:
        if not self.checkpoints:
            self.snapshot()
        self.use_checkpoints = True

    def forward(self, batch: dict) -> Tensor:
        if self.training or not self.use_checkpoints:  # the live model: one member
            logits = self.heads(self.backbone(batch).unsqueeze(0))  # (1, B, C)
            return check_member_logits(mask_choices(logits, batch), 1)
        K = len(self.checkpoints)
        names = {id(layer): name for name, layer in self.backbone.model.named_modules()}
        prefix = "backbone.model."
        device = self.heads.weight.device

        def stacked(key: str) -> Tensor:  # (K, ...) from K checkpoints of a (1, ...) tensor
            return torch.cat([c[key].to(device) for c in self.checkpoints])

        with ExitStack() as stack:
            for layer in self.layers:
                key = prefix + names[id(layer)]
                stack.enter_context(layer.substitute(stacked(key + ".lora_A"), stacked(key + ".lora_B")))
            features = split_members(self.backbone(repeat_batch(batch, K)), K)  # (K, B, D)
        W, b = stacked("heads.weight"), stacked("heads.bias")  # (K, C, D), (K, C)
        logits = torch.einsum("kbd,kcd->kbc", features.to(W.dtype), W) + b[:, None]
        return check_member_logits(mask_choices(logits, batch), K)

    def report(self) -> dict:
        return {"checkpoints": len(self.checkpoints)}
