"""Top-r SV-Ensemble: per-member singular values on the top r singular directions only, the rest frozen.

An option beyond the paper, after SVFit's observation that the top singular directions carry most of a
pretrained matrix. The weight is split once, exactly,

    W = W_res + U_r diag(s_r) V_r^T,   W_res = W - U_r diag(s_r) V_r^T (frozen, shared),

and member m computes y = W_res x + U_r diag(s_m) V_r^T x + b_m with its own s_m (r values, initialised as in
Eq. 5). At init with sigma_init = 0 every member is the pretrained layer (up to the rounding of W_res). The
forward is one shared weight plus a rank-r member term with shared U_r, V_r: the shared product runs once
for all members' rows, the member term costs r (in + out) per token, and U_r, V_r take r (in + out) numbers
instead of the full-rank factors' min(in, out) (in + out). The paper's SVE is full rank (``method=sve``); this
is ``method=sve_top`` and never replaces it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sve.errors import InputError
from sve.layers.adapter import CONVOLVE
from sve.layers.member import check_layer, weight_matrix
from sve.layers.sv_conv import SVConv
from sve.layers.sv_linear import SVLinear, decompose_with_source
from sve.layers.svd_cache import SVDCache


def split_top(
    layer: nn.Module, rank: int, svd_dtype: torch.dtype, factor_dtype: torch.dtype | None, cache: SVDCache | None
) -> tuple[Tensor, Tensor, Tensor, Tensor, str | None]:
    """(U_r, s_r, Vh_r, W_res, source) of ``layer``'s weight matrix; W_res computed in ``svd_dtype``, stored in
    the weight's dtype; source: the factors' (``decompose_with_source``) with the rank."""
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise InputError(f"method.top_rank={rank!r} is not valid; expected a positive integer")
    W = weight_matrix(layer).detach()
    U, s, Vh, source = decompose_with_source(layer, svd_dtype, factor_dtype, cache)
    r = min(rank, s.shape[0])  # a layer narrower than the rank keeps all its directions (W_res = 0)
    U, s, Vh = U[:, :r], s[:r], Vh[:r]
    residual = W.to(svd_dtype) - (U.to(svd_dtype) * s.to(svd_dtype)) @ Vh.to(svd_dtype)
    return U, s, Vh, residual.to(W.dtype), source and f"{source} top {r}"


class TopRankTerm:
    """What the top-r layers add to an SV layer: the frozen residual weight in every path."""

    def set_residual(self, residual: Tensor) -> None:
        # A frozen parameter, as U and V: it moves with .to() and sits in the state dict, and DDP leaves it alone.
        self.residual = nn.Parameter(residual.detach().clone(), requires_grad=False)  # (out, in')
        if "U" in self.factor_sources:  # computed from the same SVD as U and V^T
            self.factor_sources["residual"] = self.factor_sources["U"]
        self.clear_cache()

    def merge_inputs(self) -> tuple[Tensor, ...]:
        return (*super().merge_inputs(), self.residual)

    def merge_weights(self, members: list[int], dtype: torch.dtype) -> Tensor:
        compute = torch.promote_types(torch.float32, dtype)
        return (super().merge_weights(members, compute) + self.residual.to(compute)).to(dtype)


class SVTopLinear(TopRankTerm, SVLinear):
    """``SVLinear`` on the top r directions plus the frozen residual; build with ``from_linear_top``."""

    @classmethod
    def from_linear_top(
        cls,
        layer: nn.Module,
        rank: int,
        ensemble_size: int,
        sigma_init: float = 0.0,
        member_bias: bool = True,
        svd_dtype: torch.dtype = torch.float64,
        factor_dtype: torch.dtype | None = None,
        cache: SVDCache | None = None,
    ) -> SVTopLinear:
        U, s, Vh, residual, source = split_top(layer, rank, svd_dtype, factor_dtype, cache)
        sv = cls(layer, U, s, Vh, ensemble_size, sigma_init=sigma_init, member_bias=member_bias, source=source)
        sv.set_residual(residual)
        return sv

    def factored(self, x: Tensor, members: list[int]) -> Tensor:
        # The shared product once for every member's rows; the member term (with its bias) beside it.
        return F.linear(x, self.residual.to(x.dtype)) + super().factored(x, members)


class SVTopConv(TopRankTerm, SVConv):
    """``SVConv`` on the top r directions plus the frozen residual kernel; build with ``from_conv_top``."""

    @classmethod
    def from_conv_top(
        cls,
        conv: nn.Module,
        rank: int,
        ensemble_size: int,
        sigma_init: float = 0.0,
        member_bias: bool = True,
        svd_dtype: torch.dtype = torch.float64,
        factor_dtype: torch.dtype | None = None,
        cache: SVDCache | None = None,
    ) -> SVTopConv:
        check_layer(conv)  # groups=1, zero padding
        U, s, Vh, residual, source = split_top(conv, rank, svd_dtype, factor_dtype, cache)
        sv = cls(conv, U, s, Vh, ensemble_size, sigma_init=sigma_init, member_bias=member_bias, source=source)
        sv.set_residual(residual)
        return sv

    def factored(self, x: Tensor, members: list[int]) -> Tensor:
        kernel = self.residual.reshape(self.out_features, self.in_channels, *self.kernel_size).to(x.dtype)
        shared = CONVOLVE[self.conv_dims](x, kernel, None, self.stride, self.padding, self.dilation)
        return shared + super().factored(x, members)


SVTopConv2d = SVTopConv  # its name before it took 1-D and 3-D convolutions

__all__ = ["SVTopLinear", "SVTopConv", "SVTopConv2d", "split_top"]
