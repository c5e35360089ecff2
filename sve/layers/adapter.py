"""Per-member convolution shared by the adapter layers (LoRA, BatchEnsemble, BLoB).

Every adapter *holds* its base layer (as peft does) and sees the base weight as one matrix (out, in')
(``sve.layers.member.weight_matrix``): a convolution's kernel flattened in PyTorch's (in, k1, ..., kd) order,
so a rank-r update of that matrix is a convolution with r filters of the full kernel size followed by a 1x...x1
convolution (the same reading as the SV layer's). K members' convolutions run as one grouped convolution
with K groups, so members never loop in Python. Convolutions of 1, 2 and 3 dimensions alike.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

CONVOLVE = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}  # by the number of spatial axes


def pointwise(weight: Tensor, dims: int) -> Tensor:
    """A (..., out, in) matrix as the kernel of a 1x...x1 convolution of ``dims`` spatial axes."""
    return weight.reshape(*weight.shape, *([1] * dims))


def member_conv(x: Tensor, weight: Tensor, conv: nn.Module | None = None) -> Tensor:
    """Block k of x convolved with kernel k, in one grouped convolution.

    Args:
        x: (K*B, in, *spatial), member-major (K = weight.shape[0]), or (in, *spatial) when K = 1.
        weight: (K, out, in, *kernel_size).
        conv: a layer whose stride, padding and dilation to use; None gives a plain (pointwise-style) convolution.
    """
    K, out = weight.shape[:2]
    dims = weight.dim() - 3
    convolve = CONVOLVE[dims]
    kwargs = dict(stride=conv.stride, padding=conv.padding, dilation=conv.dilation) if conv is not None else {}
    if K == 1:
        return convolve(x, weight[0], **kwargs)
    xs = x.reshape(K, -1, *x.shape[-(dims + 1) :])  # (K, B, in, *spatial)
    B = xs.shape[1]
    grouped = xs.transpose(0, 1).reshape(B, -1, *xs.shape[-dims:])  # (B, K*in, *spatial): groups are members
    y = convolve(grouped, weight.reshape(K * out, *weight.shape[2:]), groups=K, **kwargs)  # (B, K*out, *spatial')
    return y.reshape(B, K, out, *y.shape[-dims:]).transpose(0, 1).reshape(K * B, out, *y.shape[-dims:])
