"""SV-Ensemble with LoRA (SVE + LoRA): per-member singular values plus a low-rank update, on the same layers.

Beyond the paper: its Sec. 6 names the combination as future work ("SV-Ensemble excels in calibration and
parameter efficiency, while LoRA-Ensemble provides additional expressivity"). Two choices define a variant:

- **Where the update lives** (``space``):
  ``weight``: W_m = U diag(s_m) V^T + c B_m A_m, with A_m (q x in') and B_m (out x q): LoRA on top of the
  member's SVE weight, free to leave the span of U and V.
  ``basis``: W_m = U (diag(s_m) + c B_m A_m) V^T, with A_m (q x r) and B_m (r x q): a rank-q update of the
  r x r core in the pretrained singular basis, so the member keeps the pretrained singular vectors'
  span and only mixes its directions (for a square weight the two spans coincide; for a rectangular one
  the update cannot reach outside the r-dimensional column and row spaces).
- **Who owns an update** (``members``): ``per_member`` (one (A, B) per member, as in LoRA-Ensemble: the
  independent draws of A add diversity) or ``shared`` (one (A, B) for all members: the members differ only by
  their singular values, as in SVE, and share the extra expressivity).

c = alpha / q. B starts at zero, so at init every member is exactly its SVE member (and, with sigma_init = 0,
the pretrained layer). The factored forward never forms a member weight: ``weight`` adds c (x A^T) B^T to
the SVE output; ``basis`` adds c (h A^T) B^T to the scaled core activations h * s_m, h = x V. Merged weights
(evaluation) include the update, so the cached, merged and factored paths agree.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from sve.errors import InputError
from sve.layers.adapter import CONVOLVE, member_conv, pointwise
from sve.layers.sv_conv import SVConv
from sve.layers.sv_linear import SVLinear

SPACES = ("weight", "basis")
OWNERS = ("per_member", "shared")


class LoRATerm:
    """What the SV-LoRA layers add to an SV layer (``SVLinear`` or ``SVConv``): the update's tensors, their
    per-member view, and the update inside the merged weights. Mixed in before the SV layer class."""

    def add_lora(self, rank: int, alpha: float, space: str = "weight", members: str = "per_member") -> None:
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise InputError(f"method.lora_rank={rank!r} is not valid; expected a positive integer")
        if space not in SPACES:
            raise InputError(f"method.lora_space={space!r} is not valid; choose one of {list(SPACES)}")
        if members not in OWNERS:
            raise InputError(f"method.lora_members={members!r} is not valid; choose one of {list(OWNERS)}")
        self.lora_rank, self.lora_space, self.lora_owners = rank, space, members
        self.lora_scaling = alpha / rank
        adapters = self.ensemble_size if members == "per_member" else 1
        n_in, n_out = (self.rank, self.rank) if space == "basis" else (self.in_features, self.out_features)
        A = torch.empty(adapters, rank, n_in, device=self.U.device)
        for a in A:  # nn.Linear's default init, one independent draw per adapter (as LoRALayer)
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))
        self.lora_A = nn.Parameter(A)  # (L, q, in') or (L, q, r); float32 like the singular values
        self.lora_B = nn.Parameter(torch.zeros(adapters, n_out, rank, device=self.U.device))  # (L, out|r, q)
        self.clear_cache()

    def lora_pair(self, members: list[int]) -> tuple[Tensor, Tensor]:
        """(A, B) of ``members``, (K, q, .) and (K, ., q): the one shared update repeated, or each member's."""
        if self.lora_A.shape[0] == 1:
            K = len(members)
            return self.lora_A.expand(K, -1, -1), self.lora_B.expand(K, -1, -1)
        return self.pick("lora_A", members), self.pick("lora_B", members)

    def merge_inputs(self) -> tuple[Tensor, ...]:
        return (*super().merge_inputs(), self.lora_A, self.lora_B)

    def merge_weights(self, members: list[int], dtype: torch.dtype) -> Tensor:
        """(K, out, in') merged member weights with the update, computed at least in float32."""
        compute = torch.promote_types(torch.float32, dtype)
        A, B = (t.to(compute) for t in self.lora_pair(members))
        if self.lora_space == "weight":
            return (super().merge_weights(members, compute) + self.lora_scaling * B @ A).to(dtype)
        s = self.pick("singular_values", members).to(compute)
        core = torch.diag_embed(s) + self.lora_scaling * B @ A  # (K, r, r)
        return (self.U.to(compute) @ core @ self.Vh.to(compute)).to(dtype)

    def lora_repr(self) -> str:
        return (
            f", lora_rank={self.lora_rank}, lora_space={self.lora_space}, lora_members={self.lora_owners}, "
            f"lora_scaling={self.lora_scaling}"
        )


class SVLoRALinear(LoRATerm, SVLinear):
    """``SVLinear`` plus the update of ``LoRATerm``; build with ``from_linear`` then ``add_lora``."""

    def factored(self, x: Tensor, members: list[int]) -> Tensor:
        A, B = self.lora_pair(members)
        K, lead = len(members), x.shape[:-1]
        xs = x.reshape(K, -1, self.in_features)  # (K, N, in)
        h = xs @ self.Vh.t().to(x.dtype)  # (K, N, r)
        core = h * self.pick("singular_values", members).to(h.dtype).unsqueeze(1)
        if self.lora_space == "basis":
            core = core + self.lora_scaling * (h @ A.transpose(1, 2).to(h.dtype)) @ B.transpose(1, 2).to(h.dtype)
        y = core @ self.U.t().to(h.dtype)  # (K, N, out)
        if self.lora_space == "weight":
            y = y + self.lora_scaling * (xs @ A.transpose(1, 2).to(xs.dtype)) @ B.transpose(1, 2).to(xs.dtype)
        return self.add_bias(y, members, channel_dim=-1).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + self.lora_repr()


class SVLoRAConv(LoRATerm, SVConv):
    """``SVConv`` plus the update: in ``weight`` space A_m is q filters of the full kernel and B_m a pointwise
    convolution (as ``LoRALayer`` reads a kernel); in ``basis`` space both mix the r singular channels."""

    def factored(self, x: Tensor, members: list[int]) -> Tensor:
        A, B = self.lora_pair(members)
        K, d = len(members), self.conv_dims
        axes = {1: "l", 2: "hw", 3: "dhw"}[d]  # the spatial axes, by letter, for the einsums
        kernel = self.Vh.reshape(self.rank, self.in_channels, *self.kernel_size).to(x.dtype)
        h = CONVOLVE[d](x, kernel, None, self.stride, self.padding, self.dilation)  # (K*B, r, *S')
        h = h.reshape(K, -1, *h.shape[-(d + 1) :])  # (K, B, r, *S')
        core = h * pointwise(self.pick("singular_values", members).to(h.dtype)[:, None, :], d)
        if self.lora_space == "basis":
            low = torch.einsum(f"kbr{axes},kqr->kbq{axes}", h, A.to(h.dtype))
            core = core + self.lora_scaling * torch.einsum(f"kbq{axes},koq->kbo{axes}", low, B.to(h.dtype))
        y = CONVOLVE[d](core.flatten(0, 1), pointwise(self.U.to(x.dtype), d))  # (K*B, out, *S')
        if self.lora_space == "weight":
            filters = A.to(x.dtype).reshape(K, self.lora_rank, self.in_channels, *self.kernel_size)
            low = member_conv(x if x.dim() == d + 2 else x.unsqueeze(0), filters, self)  # (K*B, q, *S')
            y = y + self.lora_scaling * member_conv(low, pointwise(B.to(x.dtype), d)).reshape(y.shape)
        y = self.add_bias(y.reshape(K, -1, *y.shape[-(d + 1) :]), members, channel_dim=-(d + 1))
        return y.reshape(*x.shape[: -(d + 1)], *y.shape[-(d + 1) :])  # unbatched (C, *S) inputs keep their shape

    def extra_repr(self) -> str:
        return super().extra_repr() + self.lora_repr()


SVLoRAConv2d = SVLoRAConv  # its name before it took 1-D and 3-D convolutions

__all__ = ["SVLoRALinear", "SVLoRAConv", "SVLoRAConv2d", "SPACES", "OWNERS"]
