"""Singular-value linear layer: the building block of SVF and SV-Ensembles.

Paper: "Making Foundation Models Probabilistic via Singular Value Ensembles", Sec. 4.
A pretrained weight W (out x in) is decomposed once, W = U diag(s) V^T (Eq. 3). U and V are frozen; each of
the M members owns a copy of the singular values, initialised multiplicatively (Eq. 5)

    s_m = s * (1 + eps_m),   eps_m ~ N(0, sigma_init^2 I),

and member m computes y = U diag(s_m) V^T x + b_m (Eq. 4). The product is evaluated factored,
((x V) * s_m) U^T, so no (out x in) matrix is ever materialised per member: autograd then keeps only
activations of width r = min(out, in) per member instead of M weight copies (this is what keeps the memory
overhead at about 1%, Table 5).

Precision: the SVD is computed in float64 on the CPU/GPU holding the weight (``svd_dtype``), then U and V are
cast to ``factor_dtype`` (default: the layer's own dtype). In float32 the reconstruction error
|U diag(s) V^T - W| / |W| is about 1e-7 (tested); with bfloat16 factors it is about 2e-3
(scripts/sv_bf16_error.py), which is why the trainable singular values always stay in float32.

Members run through the protocol of ``sve.layers.member`` (selection, banks, layout checks, ``weight``/``merge``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sve.layers.member import MemberLayer, weight_matrix


def decompose(
    layer: nn.Module, svd_dtype: torch.dtype = torch.float64, factor_dtype: torch.dtype | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Thin SVD of ``weight_matrix(layer)`` computed in ``svd_dtype``: U (out, r) and Vh (r, in') cast to
    ``factor_dtype`` (default: the layer's dtype), s (r,) kept in ``svd_dtype``."""
    W = weight_matrix(layer).detach()
    factor_dtype = factor_dtype or W.dtype
    U, s, Vh = torch.linalg.svd(W.to(svd_dtype), full_matrices=False)
    return U.to(factor_dtype), s, Vh.to(factor_dtype)


class SVLinear(MemberLayer):
    """M members sharing frozen singular vectors, each with its own singular values (and bias).

    Build it with ``from_linear``. Per-member tensors: ``singular_values`` (M, r) and, with ``member_bias``,
    ``biases`` (M, out); otherwise the pretrained bias is kept frozen and shared as ``shared_bias``.

    Args:
        base: the pretrained layer (its geometry; its weight is given as factors).
        U: left singular vectors (out, r); frozen.
        s: pretrained singular values (r,).
        Vh: right singular vectors transposed (r, in); frozen.
        ensemble_size: number of members M.
        sigma_init: std of the multiplicative initial perturbation (Eq. 5); 0 gives M identical members.
        member_bias: train one bias per member (what the authors' public code does).
    """

    def __init__(self, base: nn.Module, U: Tensor, s: Tensor, Vh: Tensor, ensemble_size: int,
                 sigma_init: float = 0.0, member_bias: bool = True):
        super().__init__(base, ensemble_size)
        if sigma_init < 0:
            raise ValueError(f"sigma_init must be >= 0, got {sigma_init}")
        self.rank = s.shape[0]
        # Frozen parameters rather than buffers: they move with .to() and sit in the state_dict, but DDP
        # neither re-broadcasts them every step (as it does buffers) nor reduces gradients for them.
        self.U = nn.Parameter(U.detach().clone(), requires_grad=False)
        self.Vh = nn.Parameter(Vh.detach().clone(), requires_grad=False)
        self.register_buffer("pretrained_singular_values", s.detach().float().clone())
        s32 = s.detach().float()
        eps = torch.randn(ensemble_size, self.rank, device=s.device) * sigma_init
        # Non-negative from the start, as the constraint keeps them during training.
        self.singular_values = nn.Parameter((s32 * (1 + eps)).clamp_min(0))  # (M, r), always float32
        bias = base.bias
        self.bias_per_member = member_bias and bias is not None
        self.biases = (
            nn.Parameter(bias.detach().float().expand(ensemble_size, -1).clone()) if self.bias_per_member else None
        )  # (M, out)
        shared = None if bias is None or member_bias else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.shared_bias = shared  # (out,), frozen

    @classmethod
    def from_linear(
        cls,
        layer: nn.Module,
        ensemble_size: int,
        sigma_init: float = 0.0,
        member_bias: bool = True,
        svd_dtype: torch.dtype = torch.float64,
        factor_dtype: torch.dtype | None = None,
    ) -> "SVLinear":
        """Decomposes an nn.Linear (or HF Conv1D) weight with a thin SVD computed in ``svd_dtype``."""
        if isinstance(layer, nn.Conv2d):
            raise TypeError("use SVConv2d.from_conv for an nn.Conv2d")
        U, s, Vh = decompose(layer, svd_dtype, factor_dtype)  # (out, r), (r,), (r, in)
        return cls(layer, U, s, Vh, ensemble_size, sigma_init=sigma_init, member_bias=member_bias)

    @property
    def base_dtype(self) -> torch.dtype:
        return self.U.dtype

    def forward_members(self, x: Tensor, members: list[int]) -> Tensor:
        K, lead = len(members), x.shape[:-1]
        h = x.reshape(K, -1, self.in_features) @ self.Vh.t().to(x.dtype)  # (K, N, r)
        h = h * self.pick("singular_values", members).to(h.dtype).unsqueeze(1)  # scale member k's directions
        y = h @ self.U.t().to(h.dtype)  # (K, N, out)
        return self.add_bias(y, members, channel_dim=-1).reshape(*lead, self.out_features)

    def add_bias(self, y: Tensor, members: list[int], channel_dim: int) -> Tensor:
        """Adds member k's bias to block k of y (K, ..., out, ...); the channel axis is ``channel_dim``."""
        if self.biases is not None:
            b = self.pick("biases", members).to(y.dtype)  # (K, out)
        elif self.shared_bias is not None:
            b = self.shared_bias.to(y.dtype).expand(len(members), -1)
        else:
            return y
        trailing = -channel_dim - 1  # axes after the channel axis
        return y + b.reshape(len(members), *([1] * (y.dim() - 2 - trailing)), -1, *([1] * trailing))

    @torch.no_grad()
    def constrain_(self) -> None:
        """Projects the singular values back onto s >= 0 (called after every optimiser step)."""
        self.singular_values.clamp_(min=0)

    def member_weight(self, member: int) -> Tensor:
        """W_m = U diag(s_m) V^T, (out, in'), in float32."""
        return (self.U.float() * self.member_tensor("singular_values")[member]) @ self.Vh.float()

    def member_bias(self, member: int) -> Tensor | None:
        if self.biases is not None:
            return self.member_tensor("biases")[member]
        return self.shared_bias

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, "
            f"ensemble_size={self.ensemble_size}, member_bias={self.bias_per_member}"
        )


__all__ = ["SVLinear", "decompose", "weight_matrix"]
