"""One classification head per member, evaluated in one batched product (or one head every member shares)."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch._subclasses.fake_tensor import is_fake


class MemberHeads(nn.Module):
    """K independent linear classification heads evaluated in one einsum (one head shared by all members
    when built with a single head).

    Each member's head is initialised like an ``nn.Linear`` with its own random draw, which is itself a
    source of member diversity.
    """

    def __init__(self, ensemble_size: int, in_features: int, num_classes: int):
        super().__init__()
        if is_fake(torch.empty(0)):  # a memory plan (sve.runs.plan): shapes only, no draws, no Python loop over M
            self.weight = nn.Parameter(torch.empty(ensemble_size, num_classes, in_features))
            self.bias = nn.Parameter(torch.empty(ensemble_size, num_classes))
            return
        heads = [nn.Linear(in_features, num_classes) for _ in range(ensemble_size)]
        self.weight = nn.Parameter(torch.stack([h.weight.detach() for h in heads]))  # (M, C, D)
        self.bias = nn.Parameter(torch.stack([h.bias.detach() for h in heads]))  # (M, C)

    def forward(self, features: Tensor, members: list[int] | None = None) -> Tensor:
        """(K, B, D) -> (K, B, C); ``members`` picks the heads (a single head serves every member)."""
        W, b = self.weight, self.bias
        if W.shape[0] == 1:
            W, b = W.expand(features.shape[0], -1, -1), b.expand(features.shape[0], -1)
        elif members is not None:
            W, b = W[members], b[members]
        return apply_heads(features, W, b)


def apply_heads(features: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """Member logits (K, B, C) from features (K, B, D), one block per member, or (B, D) shared by every
    member, through K heads ``weight`` (K, C, D) and ``bias`` (K, C): one batched product, no Python loop."""
    equation = "kbd,kcd->kbc" if features.dim() == 3 else "bd,kcd->kbc"
    return torch.einsum(equation, features.to(weight.dtype), weight) + bias[:, None]
