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

Inputs follow the member layout of ``sve.members``: the leading dimension is M*B, member-major.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sve.members import split_members

try:  # Hugging Face's GPT-2 style layer stores its weight transposed: (in, out).
    from transformers.pytorch_utils import Conv1D
except ImportError:  # pragma: no cover - transformers is a hard dependency, but keep the layer usable alone
    Conv1D = ()


def weight_matrix(layer: nn.Module) -> Tensor:
    """The weight as an (out, in') matrix, a view (gradients reach the parameter): (out, in) for nn.Linear
    and Hugging Face Conv1D (stored transposed), (out, in*kh*kw) for nn.Conv2d (PyTorch's kernel order)."""
    if isinstance(layer, nn.Linear):
        return layer.weight
    if Conv1D and isinstance(layer, Conv1D):
        return layer.weight.t()
    if isinstance(layer, nn.Conv2d):
        return layer.weight.flatten(1)
    raise TypeError(f"expected nn.Linear, nn.Conv2d or transformers Conv1D, got {type(layer).__name__}")


def decompose(
    layer: nn.Module, svd_dtype: torch.dtype = torch.float64, factor_dtype: torch.dtype | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Thin SVD of ``weight_matrix(layer)`` computed in ``svd_dtype``: U (out, r) and Vh (r, in') cast to
    ``factor_dtype`` (default: the layer's dtype), s (r,) kept in ``svd_dtype``."""
    W = weight_matrix(layer).detach()
    factor_dtype = factor_dtype or W.dtype
    U, s, Vh = torch.linalg.svd(W.to(svd_dtype), full_matrices=False)
    return U.to(factor_dtype), s, Vh.to(factor_dtype)


class SVLinear(nn.Module):
    """M members sharing frozen singular vectors, each with its own singular values (and bias).

    Args:
        U: left singular vectors (out, r); frozen.
        s: pretrained singular values (r,).
        Vh: right singular vectors transposed (r, in); frozen.
        bias: pretrained bias (out,) or None.
        ensemble_size: number of members M.
        sigma_init: std of the multiplicative initial perturbation (Eq. 5); 0 gives M identical members.
        member_bias: train one bias per member (what the authors' public code does); otherwise the
            pretrained bias is kept shared and frozen.
    """

    def __init__(
        self,
        U: Tensor,
        s: Tensor,
        Vh: Tensor,
        bias: Tensor | None,
        ensemble_size: int,
        sigma_init: float = 0.0,
        member_bias: bool = True,
    ):
        super().__init__()
        if ensemble_size < 1:
            raise ValueError(f"ensemble_size must be a positive integer, got {ensemble_size}")
        if sigma_init < 0:
            raise ValueError(f"sigma_init must be >= 0, got {sigma_init}")
        self.ensemble_size = ensemble_size
        self.in_features = Vh.shape[1]
        self.out_features = U.shape[0]
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
        if bias is None:
            self.bias = None
        elif member_bias:
            self.bias = nn.Parameter(bias.detach().float().expand(ensemble_size, -1).clone())  # (M, out)
        else:
            self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)  # (out,), shared, frozen
        self.member_bias = member_bias and bias is not None

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
        return cls(
            U,
            s,
            Vh,
            layer.bias,
            ensemble_size=ensemble_size,
            sigma_init=sigma_init,
            member_bias=member_bias,
        )

    def forward(self, x: Tensor) -> Tensor:
        M = self.ensemble_size
        lead = x.shape[:-1]
        h = split_members(x, M, "SVLinear").reshape(M, -1, self.in_features) @ self.Vh.t()  # (M, N, r)
        h = h * self.singular_values.to(h.dtype).unsqueeze(1)  # scale member m's directions by s_m
        y = h @ self.U.t()  # (M, N, out)
        if self.bias is not None:
            b = self.bias.to(y.dtype)
            y = y + (b.unsqueeze(1) if self.member_bias else b)
        return y.reshape(*lead, self.out_features)

    @torch.no_grad()
    def constrain_(self) -> None:
        """Projects the singular values back onto s >= 0 (called after every optimiser step)."""
        self.singular_values.clamp_(min=0)

    @torch.no_grad()
    def member_weight(self, member: int) -> Tensor:
        """W_m = U diag(s_m) V^T, (out, in), in float32."""
        return (self.U.float() * self.singular_values[member]) @ self.Vh.float()

    @torch.no_grad()
    def merge(self, member: int) -> nn.Linear:
        """A plain nn.Linear computing member ``member`` (for export or single-member inference)."""
        if not 0 <= member < self.ensemble_size:
            raise IndexError(f"member {member} out of range for ensemble_size={self.ensemble_size}")
        dtype = self.U.dtype
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
        linear = linear.to(device=self.U.device, dtype=dtype)
        linear.weight.copy_(self.member_weight(member).to(dtype))
        if self.bias is not None:
            linear.bias.copy_((self.bias[member] if self.member_bias else self.bias).to(dtype))
        return linear

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, "
            f"ensemble_size={self.ensemble_size}, member_bias={self.member_bias}"
        )
