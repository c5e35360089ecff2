"""Low-rank adaptation with one adapter per member: LoRA (Hu et al., 2022) and LoRA-Ensemble
(Muehlematter et al., 2024; Wang et al., 2023).

Member m computes y = W0 x + (alpha / r) B_m A_m x with the base weight W0 (out x in') frozen and shared,
A_m (r x in') and B_m (out x r) trainable. B_m starts at zero, so every member equals the base layer at
init; the A_m are drawn independently (nn.Linear's default init), which is where LoRA-Ensemble members
start to differ. With M = 1 this is plain LoRA.

All members run in one batched forward: the base layer sees the whole (M*B, ...) input once, and the low-rank
path is a batched matmul over members (or, for a Conv2d, a grouped convolution: A_m as r filters of the full
kernel size, B_m as a 1x1 convolution; see ``sve.layers.adapter``).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from sve.layers.adapter import check_layer, member_conv2d, weight_shape
from sve.layers.sv_linear import weight_matrix
from sve.members import split_members


class LoRALayer(nn.Module):
    """Args:
    base: the layer to adapt (nn.Linear, HF Conv1D or nn.Conv2d); held, frozen.
    ensemble_size: number of members M (1: plain LoRA).
    rank: r.
    alpha: scaling numerator; the update is scaled by alpha / r (C.3: r = alpha = 8, i.e. scale 1).
    """

    def __init__(self, base: nn.Module, ensemble_size: int = 1, rank: int = 8, alpha: float = 8.0):
        super().__init__()
        check_layer(base)
        if ensemble_size < 1 or rank < 1:
            raise ValueError(f"ensemble_size and rank must be positive, got {ensemble_size} and {rank}")
        self.base = base.requires_grad_(False)
        self.ensemble_size = ensemble_size
        self.rank = rank
        self.scaling = alpha / rank
        self.out_features, self.in_features = weight_shape(base)
        A = torch.empty(ensemble_size, rank, self.in_features)
        for a in A:  # nn.Linear's default init, one independent draw per member
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))
        self.lora_A = nn.Parameter(A)  # (M, r, in')
        self.lora_B = nn.Parameter(torch.zeros(ensemble_size, self.out_features, rank))  # (M, out, r)
        self._override: tuple[Tensor, Tensor] | None = None
        self.record: list | None = None  # set by sve.methods.kfac to collect KFAC statistics

    def factors(self) -> tuple[Tensor, Tensor]:
        """(A, B) of shapes (K, r, in') and (K, out, r); K = M unless samples are substituted."""
        return self._override if self._override is not None else (self.lora_A, self.lora_B)

    @contextmanager
    def substitute(self, A: Tensor, B: Tensor):
        """Runs the layer with K given factor pairs instead of its members (posterior samples,
        checkpoints); the input must then be stacked K times."""
        self._override = (A, B)
        try:
            yield
        finally:
            self._override = None

    def forward(self, x: Tensor) -> Tensor:
        A, B = self.factors()
        y = self.base(x)  # shared weight: the member-major rows pass through unchanged
        return y + self.delta(x, A, B).to(y.dtype)

    def delta(self, x: Tensor, A: Tensor, B: Tensor) -> Tensor:
        """(alpha / r) B_k A_k x for the rows of member k."""
        K = A.shape[0]
        x = x.to(A.dtype)
        if isinstance(self.base, nn.Conv2d):
            h = member_conv2d(x, A.reshape(K, self.rank, *self.base.weight.shape[1:]), self.base)  # (K*N, r, H', W')
            return self.scaling * member_conv2d(h, B[..., None, None])  # (K*N, out, H', W')
        lead = x.shape[:-1]
        xs = split_members(x, K, type(self).__name__).reshape(K, -1, self.in_features)  # (K, N*T, in)
        h = xs @ A.transpose(1, 2)  # (K, N*T, r)
        d = self.scaling * (h @ B.transpose(1, 2))  # (K, N*T, out)
        if self.record is not None:
            self.record.append((xs, h, d))
        return d.reshape(*lead, self.out_features)

    @torch.no_grad()
    def member_weight(self, member: int) -> Tensor:
        """W0 + (alpha / r) B_m A_m as an (out, in') matrix."""
        W = weight_matrix(self.base).float()
        return W + self.scaling * self.lora_B[member].float() @ self.lora_A[member].float()

    @torch.no_grad()
    def merge(self, member: int) -> nn.Module:
        """A plain layer computing member ``member`` (nn.Conv2d for a Conv2d base, else nn.Linear)."""
        if not 0 <= member < self.ensemble_size:
            raise IndexError(f"member {member} out of range for ensemble_size={self.ensemble_size}")
        W = self.member_weight(member)
        bias = self.base.bias
        if isinstance(self.base, nn.Conv2d):
            c = self.base
            layer = nn.Conv2d(c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding, c.dilation,
                              bias=bias is not None)
            layer.weight.copy_(W.reshape_as(c.weight))
        else:
            layer = nn.Linear(self.in_features, self.out_features, bias=bias is not None)
            layer.weight.copy_(W)
        if bias is not None:
            layer.bias.copy_(bias)
        return layer.to(device=W.device, dtype=weight_matrix(self.base).dtype)

    def extra_repr(self) -> str:
        return f"ensemble_size={self.ensemble_size}, rank={self.rank}, scaling={self.scaling}"
