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

from sve.layers.sv_linear import SVLinear, decompose
from sve.members import split_members


class SVConv2d(SVLinear):
    """An ``SVLinear`` over the unfolded kernel: U (out, r), s (M, r), Vh (r, in*kh*kw).

    It shares the parameters, initialisation (Eq. 5), non-negativity constraint and member bias of
    ``SVLinear``; only the forward and ``merge`` differ. Build it with ``SVConv2d.from_conv``.
    """

    def __init__(self, U, s, Vh, bias, ensemble_size, conv: nn.Conv2d, sigma_init=0.0, member_bias=True):
        super().__init__(U, s, Vh, bias, ensemble_size, sigma_init=sigma_init, member_bias=member_bias)
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.stride = conv.kernel_size, conv.stride
        self.padding, self.dilation = conv.padding, conv.dilation

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
        if conv.groups != 1 or conv.padding_mode != "zeros":
            raise ValueError(
                f"SVConv2d supports groups=1 and padding_mode='zeros'; got groups={conv.groups}, "
                f"padding_mode={conv.padding_mode!r}"
            )
        if isinstance(conv.padding, str):
            raise ValueError(f"SVConv2d needs numeric padding, got padding={conv.padding!r}")
        U, s, Vh = decompose(conv, svd_dtype, factor_dtype)  # (out, r), (r,), (r, in*kh*kw)
        return cls(U, s, Vh, conv.bias, ensemble_size, conv, sigma_init=sigma_init, member_bias=member_bias)

    def forward(self, x: Tensor) -> Tensor:
        M = self.ensemble_size
        split_members(x, M, "SVConv2d")  # validates the member-major layout
        kernel = self.Vh.reshape(self.rank, self.in_channels, *self.kernel_size).to(x.dtype)
        h = F.conv2d(x, kernel, None, self.stride, self.padding, self.dilation)  # (M*B, r, H', W')
        h = h.reshape(M, -1, *h.shape[1:])  # (M, B, r, H', W')
        h = h * self.singular_values.to(h.dtype)[:, None, :, None, None]  # scale member m's directions by s_m
        y = F.conv2d(h.flatten(0, 1), self.U.to(x.dtype)[:, :, None, None])  # (M*B, out, H', W')
        if self.bias is not None:
            b = self.bias.to(y.dtype)
            if self.member_bias:  # (M, out) -> one bias per member's block of rows
                y = (y.reshape(M, -1, *y.shape[1:]) + b[:, None, :, None, None]).flatten(0, 1)
            else:
                y = y + b[:, None, None]
        return y

    @torch.no_grad()
    def merge(self, member: int) -> nn.Conv2d:
        """A plain nn.Conv2d computing member ``member``."""
        if not 0 <= member < self.ensemble_size:
            raise IndexError(f"member {member} out of range for ensemble_size={self.ensemble_size}")
        dtype = self.U.dtype
        conv = nn.Conv2d(
            self.in_channels, self.out_channels, self.kernel_size, self.stride, self.padding, self.dilation,
            bias=self.bias is not None,
        ).to(device=self.U.device, dtype=dtype)  # fmt: skip
        conv.weight.copy_(self.member_weight(member).reshape(conv.weight.shape).to(dtype))
        if self.bias is not None:
            conv.bias.copy_((self.bias[member] if self.member_bias else self.bias).to(dtype))
        return conv

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, rank={self.rank}, ensemble_size={self.ensemble_size}, "
            f"member_bias={self.member_bias}"
        )


__all__ = ["SVConv2d"]
