"""BatchEnsemble layer (Wen et al., 2020, "BatchEnsemble: an alternative approach to efficient ensemble and
lifelong learning").

Member m uses the shared ("slow") weight W modulated by a rank-one "fast" weight, W_m = W o (s_m r_m^T),
and its own bias b_m. For a linear layer this is computed without forming W_m:

    y_m = ((x o r_m) W^T) o s_m + b_m.

r_m and s_m start at one and b_m at the pretrained bias, so every member equals the pretrained layer at init;
``init_std`` > 0 draws each entry of r_m and s_m from N(1, init_std^2) instead, so that members differ from
the start (needed when nothing else tells them apart, e.g. a pretrained head shared by all).
For a convolution the kernel is read as an (out, in*k*k) matrix (``sve.layers.member.weight_matrix``), r_m has
in*k*k entries, and the K member kernels run as one grouped convolution; with r_m constant over the k*k taps
this is Wen et al.'s per-channel convolution.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sve.errors import InputError
from sve.layers.adapter import member_conv
from sve.layers.member import MemberLayer, weight_matrix


class BatchEnsembleLayer(MemberLayer):
    """Args:
    base: the layer (nn.Linear, HF Conv1D or nn.Conv1d/2d/3d); its weight becomes the shared weight (trainable or
        not, as the method decides) and its bias becomes one bias per member (``biases``).
    ensemble_size: number of members M.
    init_std: standard deviation of the fast weights around one at init (0: exactly one).
    """

    def __init__(self, base: nn.Module, ensemble_size: int, init_std: float = 0.0):
        super().__init__(base, ensemble_size)
        if init_std < 0:
            raise InputError(f"init_std must be >= 0, got {init_std}")
        bias = base.bias
        base.register_parameter("bias", None)  # replaced by the member biases below
        self.base = base
        self.r = nn.Parameter(1 + init_std * torch.randn(ensemble_size, self.in_features))  # (M, in')
        self.s = nn.Parameter(1 + init_std * torch.randn(ensemble_size, self.out_features))  # (M, out)
        self.biases = (
            nn.Parameter(bias.detach().float().expand(ensemble_size, -1).clone()) if bias is not None else None
        )  # (M, out)

    @property
    def base_dtype(self) -> torch.dtype:
        return weight_matrix(self.base).dtype

    def forward_members(self, x: Tensor, members: list[int]) -> Tensor:
        K = len(members)
        W = weight_matrix(self.base)
        r, s = self.pick("r", members).to(x.dtype), self.pick("s", members).to(x.dtype)  # (K, in'), (K, out)
        b = self.pick("biases", members).to(x.dtype) if self.biases is not None else None  # (K, out)
        if self.kind == "conv":
            d = self.conv_dims
            kernels = s[:, :, None] * W.unsqueeze(0) * r[:, None, :]  # (K, out, in')
            y = member_conv(x, kernels.reshape(K, *self.base.weight.shape), self.base)  # (K*B, out, *S')
            if b is not None:
                y = (y.reshape(K, -1, *y.shape[-(d + 1) :]) + b.reshape(K, 1, -1, *([1] * d))).reshape(y.shape)
            return y
        lead = x.shape[:-1]
        xs = x.reshape(K, -1, self.in_features)  # (K, N*T, in)
        y = F.linear(xs * r[:, None], W) * s[:, None]  # (K, N*T, out)
        if b is not None:
            y = y + b[:, None]
        return y.reshape(*lead, self.out_features)

    def member_weight(self, member: int) -> Tensor:
        """W o (s_m r_m^T) as an (out, in') matrix."""
        r, s = self.member_tensor("r")[member], self.member_tensor("s")[member]
        return s[:, None] * weight_matrix(self.base).float() * r[None, :]

    def member_bias(self, member: int) -> Tensor | None:
        return None if self.biases is None else self.member_tensor("biases")[member]

    def extra_repr(self) -> str:
        return f"ensemble_size={self.ensemble_size}"
