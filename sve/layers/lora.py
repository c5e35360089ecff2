"""Low-rank adaptation with one adapter per member: LoRA (Hu et al., 2022) and LoRA-Ensemble
(Muehlematter et al., 2024; Wang et al., 2023).

Member m computes y = W0 x + (alpha / r) B_m A_m x with the base weight W0 (out x in') frozen and shared,
A_m (r x in') and B_m (out x r) trainable. B_m starts at zero, so every member equals the base layer at
init; the A_m are drawn independently (nn.Linear's default init), which is where LoRA-Ensemble members
start to differ. With M = 1 this is plain LoRA.

``dropout`` > 0 drops the low-rank path's input, as peft's ``lora_dropout`` does: y = W0 x + (alpha / r)
B_m A_m dropout(x), the base layer seeing x whole. It is drawn with ``torch.nn.functional.dropout``, looked up
at call time, so the exact training draws (``sve.layers.draws``) cover it: on the member-major input each
row k*B + j gets member k's mask for example j, whichever member chunk or micro-batch runs. It is on while the
layer trains (a method keeping it on at evaluation puts the layer in training mode, as MC dropout does); 0.0,
the default, leaves the layer as it was.

All selected members run in one batched forward: the base layer sees the whole (K*B, ...) input once, and
the low-rank path is a batched matmul over members (or, for a convolution, a grouped convolution: A_m as r
filters of the full kernel size, B_m as a 1x1 convolution; see ``sve.layers.adapter``). Posterior samples
and checkpoints run through the same path as a bank of (A, B) pairs (``MemberLayer.use_bank``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sve.errors import InputError
from sve.layers.adapter import member_conv, pointwise
from sve.layers.member import MemberLayer, weight_matrix


class LoRALayer(MemberLayer):
    """Args:
    base: the layer to adapt (nn.Linear, HF Conv1D or nn.Conv1d/2d/3d); held, frozen.
    ensemble_size: number of members M (1: plain LoRA).
    rank: r.
    alpha: scaling numerator; the update is scaled by alpha / r (C.3: r = alpha = 8, i.e. scale 1).
    dropout: rate of the dropout on the low-rank path's input (peft's ``lora_dropout``; module docstring).
    init_scale: A's initial draw times this factor (1.0: nn.Linear's default init, as peft). The members' A
        differ only by their draws, so this sets how far apart the members start: LoRA-Ensemble's diversity knob,
        as sigma_init is SVE's. B still starts at zero, so every member still equals the base layer at init.
    """

    def __init__(
        self,
        base: nn.Module,
        ensemble_size: int = 1,
        rank: int = 8,
        alpha: float = 8.0,
        dropout: float = 0.0,
        init_scale: float = 1.0,
    ):
        super().__init__(base, ensemble_size)
        if rank < 1:
            raise InputError(f"rank must be a positive integer, got {rank}")
        if not 0 <= dropout < 1:
            raise InputError(f"LoRA dropout must be in [0, 1), got {dropout}")
        if not (isinstance(init_scale, (int, float)) and init_scale > 0 and math.isfinite(init_scale)):
            raise InputError(f"LoRA init_scale must be a positive number, got {init_scale!r}")
        self.init_scale = float(init_scale)
        self.base = base.requires_grad_(False)
        self.rank = rank
        self.scaling = alpha / rank
        self.dropout = float(dropout)
        self.lora_A = nn.Parameter(torch.empty(ensemble_size, rank, self.in_features))  # (M, r, in')
        self.lora_B = nn.Parameter(torch.empty(ensemble_size, self.out_features, rank))  # (M, out, r)
        self.reset(range(ensemble_size))
        self.record: list | None = None  # set by sve.methods.kfac to collect KFAC statistics

    @torch.no_grad()
    def reset(self, members) -> None:
        """Draws ``members``' adapters afresh: A as nn.Linear's default init times ``init_scale``, one independent
        draw per member, and B = 0, so each starts as the base layer (a deep ensemble re-draws each round's members)."""
        for m in members:
            nn.init.kaiming_uniform_(self.lora_A[m], a=math.sqrt(5))
            if self.init_scale != 1.0:  # 1.0 leaves the draw bit for bit as peft's
                self.lora_A[m].mul_(self.init_scale)
            self.lora_B[m].zero_()

    @property
    def base_dtype(self) -> torch.dtype:
        return weight_matrix(self.base).dtype

    def forward_members(self, x: Tensor, members: list[int]) -> Tensor:
        y = self.base(x)  # shared weight: the member-major rows pass through unchanged
        if self.dropout:  # the low-rank path only, as peft; F.dropout so that exact draws cover it
            x = F.dropout(x, self.dropout, self.training)
        return y + self.delta(x, self.pick("lora_A", members), self.pick("lora_B", members)).to(y.dtype)

    def delta(self, x: Tensor, A: Tensor, B: Tensor) -> Tensor:
        """(alpha / r) B_k A_k x for block k of x; A (K, r, in'), B (K, out, r)."""
        K = A.shape[0]
        x = x.to(A.dtype)
        if self.kind == "conv":
            h = member_conv(x, A.reshape(K, self.rank, *self.base.weight.shape[1:]), self.base)  # (K*N, r, *S')
            return self.scaling * member_conv(h, pointwise(B, self.conv_dims))  # (K*N, out, *S')
        lead = x.shape[:-1]
        xs = x.reshape(K, -1, self.in_features)  # (K, N*T, in)
        h = xs @ A.transpose(1, 2)  # (K, N*T, r)
        d = self.scaling * (h @ B.transpose(1, 2))  # (K, N*T, out)
        if self.record is not None:
            self.record.append((xs, h, d))
        return d.reshape(*lead, self.out_features)

    def member_weight(self, member: int) -> Tensor:
        """W0 + (alpha / r) B_m A_m as an (out, in') matrix."""
        A, B = self.member_tensor("lora_A")[member], self.member_tensor("lora_B")[member]
        return weight_matrix(self.base).float() + self.scaling * B.float() @ A.float()

    def member_bias(self, member: int) -> Tensor | None:
        return self.base.bias

    def extra_repr(self) -> str:
        return f"ensemble_size={self.ensemble_size}, rank={self.rank}, scaling={self.scaling}, dropout={self.dropout}"
