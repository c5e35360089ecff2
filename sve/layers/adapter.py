"""Per-member convolution shared by the adapter layers (LoRA, BatchEnsemble, BLoB).

Every adapter *holds* its base layer (as peft does) and sees the base weight as one matrix (out, in')
(``sve.layers.member.weight_matrix``): a Conv2d's kernel flattened in PyTorch's (in, kh, kw) order, so a
rank-r update of that matrix is a convolution with r filters of the full kernel size followed by a 1x1
convolution (the same reading as the SV layer's). K members' convolutions run as one grouped convolution
with K groups, so members never loop in Python.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


def member_conv2d(x: Tensor, weight: Tensor, conv: nn.Module | None = None) -> Tensor:
    """Block k of x convolved with kernel k, in one grouped convolution.

    Args:
        x: (K*B, in, H, W), member-major (K = weight.shape[0]), or (in, H, W) when K = 1.
        weight: (K, out, in, kh, kw).
        conv: a layer whose stride, padding and dilation to use; None gives a plain (1x1-style) convolution.
    """
    K, out = weight.shape[:2]
    kwargs = dict(stride=conv.stride, padding=conv.padding, dilation=conv.dilation) if conv is not None else {}
    if K == 1:
        return F.conv2d(x, weight[0], **kwargs)
    xs = x.reshape(K, -1, *x.shape[-3:])  # (K, B, in, H, W)
    B = xs.shape[1]
    grouped = xs.transpose(0, 1).reshape(B, -1, *xs.shape[-2:])  # (B, K*in, H, W): groups are members
    y = F.conv2d(grouped, weight.reshape(K * out, *weight.shape[2:]), groups=K, **kwargs)  # (B, K*out, H', W')
    return y.reshape(B, K, out, *y.shape[-2:]).transpose(0, 1).reshape(K * B, out, *y.shape[-2:])
