"""Singular-value 2-D convolution: SVE/SVF for ``nn.Conv2d`` (a capability beyond the paper).

A convolution is a linear map of each receptive field: its kernel (out, in, kh, kw) is the matrix
W (out, in*kh*kw) applied to every unfolded patch. We decompose that matrix, W = U diag(s) V^T, exactly as
``SVLinear`` does for a linear layer, and give every member its own singular values. The factored forward
avoids materialising W per member:

    conv(x, W) = conv1x1(diag(s_m) conv(x, V^T as r kernels of shape (in, kh, kw)), U)

i.e. a convolution with the r right singular vectors (same stride, padding, dilation), a per-member scaling
of the r channels, and a 1x1 convolution with U. Groups > 1 and non-zero padding modes are not supported.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sve.layers.member import check_layer
from sve.layers.sv_linear import SVLinear, decompose


class SVConv2d(SVLinear):
    """An ``SVLinear`` over the unfolded kernel: U (out, r), s (M, r), Vh (r, in*kh*kw).

    It shares the parameters, initialisation (Eq. 5), non-negativity constraint, member bias and member
    protocol of ``SVLinear``; only the forward differs. Build it with ``SVConv2d.from_conv``.
    """

    @classmethod
    def from_conv(
        cls,
        conv: nn.Conv2d,
        ensemble_size: int,
        sigma_init: float = 0.0,
        member_bias: bool = True,
        svd_dtype: torch.dtype = torch.float64,
        factor_dtype: torch.dtype | None = None,
    ) -> "SVConv2d":
        check_layer(conv)  # groups=1, zero padding, numeric padding
        U, s, Vh = decompose(conv, svd_dtype, factor_dtype)  # (out, r), (r,), (r, in*kh*kw)
        return cls(conv, U, s, Vh, ensemble_size, sigma_init=sigma_init, member_bias=member_bias)

    def forward_members(self, x: Tensor, members: list[int]) -> Tensor:
        K = len(members)
        kernel = self.Vh.reshape(self.rank, self.in_channels, *self.kernel_size).to(x.dtype)
        h = F.conv2d(x, kernel, None, self.stride, self.padding, self.dilation)  # (K*B, r, H', W')
        h = h.reshape(K, -1, *h.shape[-3:])  # (K, B, r, H', W')
        h = h * self.pick("singular_values", members).to(h.dtype)[:, None, :, None, None]  # scale by s_k
        y = F.conv2d(h.flatten(0, 1), self.U.to(x.dtype)[:, :, None, None])  # (K*B, out, H', W')
        y = self.add_bias(y.reshape(K, -1, *y.shape[-3:]), members, channel_dim=-3)
        return y.reshape(*x.shape[:-3], *y.shape[-3:])  # unbatched (C, H, W) inputs keep their shape

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_features}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, rank={self.rank}, ensemble_size={self.ensemble_size}, "
            f"member_bias={self.bias_per_member}"
        )


__all__ = ["SVConv2d"]
