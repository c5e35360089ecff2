"""Singular-value convolution: SVE/SVF for ``nn.Conv1d``, ``nn.Conv2d`` and ``nn.Conv3d`` (beyond the paper).

A convolution is a linear map of each receptive field: its kernel (out, in, k1, ..., kd) is the matrix
W (out, in*k1*...*kd) applied to every unfolded patch. We decompose that matrix, W = U diag(s) V^T, exactly
as ``SVLinear`` does for a linear layer, and give every member its own singular values. The factored forward
avoids materialising W per member:

    conv(x, W) = pointwise(diag(s_m) conv(x, V^T as r kernels of shape (in, k1, ..., kd)), U)

i.e. a convolution with the r right singular vectors (same stride, padding, dilation), a per-member scaling
of the r channels, and a 1x...x1 convolution with U. In evaluation the merged kernels of the K members run as
one grouped convolution instead (``inference``, as for ``SVLinear``; N in the rules is the number of output
positions per member). Groups > 1 and non-zero padding modes are not supported. The same code serves 1, 2 and
3 spatial dimensions (``conv_dims``); ``SVConv2d`` is the name it had when it took 2-D ones only.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from sve.layers.adapter import CONVOLVE, member_conv, pointwise
from sve.layers.member import check_layer
from sve.layers.sv_linear import SVLinear, decompose_with_source
from sve.layers.svd_cache import SVDCache


class SVConv(SVLinear):
    """An ``SVLinear`` over the unfolded kernel: U (out, r), s (M, r), Vh (r, in*k1*...*kd).

    It shares the parameters, initialisation (Eq. 5), non-negativity constraint, member bias and member
    protocol of ``SVLinear``; only the forward differs. Build it with ``SVConv.from_conv``.
    """

    @classmethod
    def from_conv(
        cls,
        conv: nn.Conv1d | nn.Conv2d | nn.Conv3d,
        ensemble_size: int,
        sigma_init: float = 0.0,
        member_bias: bool = True,
        svd_dtype: torch.dtype = torch.float64,
        factor_dtype: torch.dtype | None = None,
        cache: SVDCache | None = None,
    ) -> SVConv:
        check_layer(conv)  # groups=1, zero padding
        U, s, Vh, source = decompose_with_source(conv, svd_dtype, factor_dtype, cache)  # (out, r), (r,), (r, in*k...)
        return cls(conv, U, s, Vh, ensemble_size, sigma_init=sigma_init, member_bias=member_bias, source=source)

    def factored(self, x: Tensor, members: list[int]) -> Tensor:
        K, d = len(members), self.conv_dims
        kernel = self.Vh.reshape(self.rank, self.in_channels, *self.kernel_size).to(x.dtype)
        h = CONVOLVE[d](x, kernel, None, self.stride, self.padding, self.dilation)  # (K*B, r, *S')
        h = h.reshape(K, -1, *h.shape[-(d + 1) :])  # (K, B, r, *S')
        h = h * pointwise(self.pick("singular_values", members).to(h.dtype)[:, None, :], d)  # scale by s_k
        y = CONVOLVE[d](h.flatten(0, 1), pointwise(self.U.to(x.dtype), d))  # (K*B, out, *S')
        y = self.add_bias(y.reshape(K, -1, *y.shape[-(d + 1) :]), members, channel_dim=-(d + 1))
        return y.reshape(*x.shape[: -(d + 1)], *y.shape[-(d + 1) :])  # unbatched (C, *S) inputs keep their shape

    def apply_merged(self, x: Tensor, W: Tensor, members: list[int]) -> Tensor:
        """Block k of x convolved with member k's merged kernel; W (K, out, in*k1*...*kd)."""
        K, d = len(members), self.conv_dims
        kernels = W.reshape(K, self.out_features, self.in_channels, *self.kernel_size)
        if K == 1:  # any input shape, unbatched included
            b = self.bias_rows(members, x.dtype)
            return CONVOLVE[d](x, kernels[0], None if b is None else b[0], self.stride, self.padding, self.dilation)
        y = member_conv(x, kernels, self)  # (K*B, out, *S'), one grouped convolution
        return self.add_bias(y.reshape(K, -1, *y.shape[-(d + 1) :]), members, channel_dim=-(d + 1)).reshape(y.shape)

    def tokens_per_member(self, x: Tensor, K: int) -> float:
        """Output positions per member: the rows each member's (out x in*k1*...*kd) matrix is applied to."""
        positions, sizes = 1, x.shape[-self.conv_dims :]
        if isinstance(self.padding, str):  # uneven "same" (stride 1): the output has the input's positions
            positions = math.prod(sizes)
        else:
            for size, k, s, p, d in zip(sizes, self.kernel_size, self.stride, self.padding, self.dilation):
                positions *= max((size + 2 * p - d * (k - 1) - 1) // s + 1, 0)
        return (x.shape[0] / K if x.dim() == self.conv_dims + 2 else 1) * positions

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_features}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, rank={self.rank}, ensemble_size={self.ensemble_size}, "
            f"member_bias={self.bias_per_member}, inference={self.inference}"
        )


SVConv2d = SVConv  # its name before it took 1-D and 3-D convolutions

__all__ = ["SVConv", "SVConv2d"]
