"""Last-layer ensemble (the "Last-Layer Ensemble" row of Table 3, from Wang et al., 2023): M heads on one
fine-tuned backbone.

The backbone is adapted with one shared LoRA (rank 8, alpha 8, on the usual target layers) and runs once per
batch; the M heads, initialised independently, read the same features. Members therefore differ only in
their last layer, which is why this ensemble is cheap and, in Table 3, not very diverse.
"""

from __future__ import annotations

from torch import Tensor

from sve.methods.lora import LoRAEnsemble


class LastLayerEnsemble(LoRAEnsemble):
    """Args:
    rank, alpha: the shared LoRA adapter of the backbone.
    """

    display_name = "Last-Layer Ensemble"
    trains = "one shared LoRA adapter and one head per member"

    adapters_per_member = False

    def training_chunks(self, members_at_once: int | str | None = None) -> None:
        """Never split: one backbone pass serves every head."""
        return None

    def member_features(self, batch: dict, members: list[int]) -> Tensor:
        features = self.backbone(batch)  # (B, D): one backbone pass shared by all heads
        return features.unsqueeze(0).expand(len(members), *features.shape)  # (K, B, D)
