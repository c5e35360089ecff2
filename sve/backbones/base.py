"""What every backbone wrapper provides to the methods and data modules."""

from __future__ import annotations

from torch import Tensor, nn


class Backbone(nn.Module):
    """A pretrained network without its classification head.

    ``forward(batch)`` maps a batch dict (``pixel_values`` for images; ``input_ids`` and ``attention_mask``
    for text) to features of shape (N, feature_dim). Attributes read by the rest of the framework:

    - ``model``: the wrapped network, the tree that methods inject adapters into;
    - ``target_modules``: name patterns of the layers adapted by SVE and the adapter baselines (Sec. 4);
    - ``modality``: ``"image"`` or ``"text"``;
    - ``feature_dim``;
    - for images: ``image_size``, ``mean``, ``std``; for text: ``tokenizer``.
    """

    modality: str
    feature_dim: int
    target_modules: list[str]

    def __init__(self, model: nn.Module, target_modules: list[str]):
        super().__init__()
        self.model = model
        self.target_modules = list(target_modules)

    def forward(self, batch: dict) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"target_modules={self.target_modules}"
