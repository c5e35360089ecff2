"""Shared pieces of the per-member adapter layers (LoRA, BatchEnsemble, BLoB).

Every adapter *holds* its base layer (as peft does) and sees the base weight as one matrix (out, in'):
``nn.Linear`` and Hugging Face ``Conv1D`` give (out, in); ``nn.Conv2d`` gives (out, in*k*k), the kernel
flattened in PyTorch's (in, kh, kw) order, so a rank-r update of that matrix is a convolution with r
filters of the full kernel size followed by a 1x1 convolution (the same reading as the SV layer's).

Inputs follow ``sve.members``: the leading dimension is M*B, member-major. A per-member convolution runs as
one grouped convolution with M groups, so members never loop in Python.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from sve.layers.sv_linear import Conv1D
from sve.members import split_members

ADAPTABLE_TYPES: tuple[type, ...] = (nn.Linear, nn.Conv2d) + ((Conv1D,) if Conv1D else ())


def check_layer(layer: nn.Module) -> None:
    if not isinstance(layer, ADAPTABLE_TYPES):
        raise TypeError(
            f"expected one of {[t.__name__ for t in ADAPTABLE_TYPES]}, got {type(layer).__name__}"
        )
    if isinstance(layer, nn.Conv2d) and (layer.groups != 1 or layer.padding_mode != "zeros"):
        raise NotImplementedError(
            f"Conv2d adapters need groups=1 and padding_mode='zeros' (got groups={layer.groups}, "
            f"padding_mode={layer.padding_mode!r})"
        )


def weight_shape(layer: nn.Module) -> tuple[int, int]:
    """(out, in') of the layer's weight seen as a matrix; in' = in*k*k for a Conv2d."""
    if isinstance(layer, nn.Conv2d):
        return layer.out_channels, layer.weight[0].numel()
    if isinstance(layer, nn.Linear):
        return layer.out_features, layer.in_features
    return layer.weight.shape[1], layer.weight.shape[0]  # Conv1D stores (in, out)


def member_conv2d(x: Tensor, weight: Tensor, conv: nn.Conv2d | None = None) -> Tensor:
    """Member m's input rows convolved with member m's kernel, in one grouped convolution.

    Args:
        x: (M*B, in, H, W), member-major.
        weight: (M, out, in, kh, kw).
        conv: the layer whose stride, padding and dilation to use; None gives a 1x1-style plain convolution.
    """
    M, out = weight.shape[:2]
    xs = split_members(x, M, "member_conv2d")  # (M, B, in, H, W)
    B = xs.shape[1]
    grouped = xs.transpose(0, 1).reshape(B, -1, *xs.shape[-2:])  # (B, M*in, H, W): groups are members
    kwargs = dict(stride=conv.stride, padding=conv.padding, dilation=conv.dilation) if conv is not None else {}
    y = F.conv2d(grouped, weight.reshape(M * out, *weight.shape[2:]), groups=M, **kwargs)  # (B, M*out, H', W')
    return y.reshape(B, M, out, *y.shape[-2:]).transpose(0, 1).reshape(M * B, out, *y.shape[-2:])
