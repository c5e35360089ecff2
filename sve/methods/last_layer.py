"""Last-layer ensemble (the "Last-Layer Ensemble" row of Table 3, from Wang et al., 2023): M heads on one
fine-tuned backbone.

The backbone is adapted with one shared LoRA (rank 8, alpha 8, on the usual target layers) and runs once per
batch; the M heads, initialised independently, read the same features. Members therefore differ only in
their last layer, which is why this ensemble is cheap and, in Table 3, not very diverse.
"""

from __future__ import annotations

from torch import Tensor

from sve.members import check_member_logits
from sve.methods.base import EnsembleMethod, mask_choices
from sve.methods.lora import inject_lora


class LastLayerEnsemble(EnsembleMethod):
    """Args:
    rank, alpha: the shared LoRA adapter of the backbone.
    target_modules: overrides the backbone's patterns.
    """

    def __init__(self, backbone, ensemble_size: int, num_classes: int, rank: int = 8, alpha: float = 8.0,
                 target_modules: list[str] | None = None, lr: float | None = None):
        super().__init__(backbone, ensemble_size, num_classes, lr)
        self.wrapped = inject_lora(self, 1, rank, alpha, target_modules)
        self.log_summary(self.wrapped)

    def forward(self, batch: dict) -> Tensor:
        M = self.ensemble_size
        features = self.backbone(batch)  # (B, D): one backbone pass shared by all heads
        logits = self.heads(features.unsqueeze(0).expand(M, *features.shape))  # (M, B, C)
        return check_member_logits(mask_choices(logits, batch), M)
