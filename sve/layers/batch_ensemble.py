"""BatchEnsemble layer (Wen et al., 2020, "BatchEnsemble: an alternative approach to efficient ensemble and
lifelong learning").

Member m uses the shared ("slow") weight W modulated by a rank-one "fast" weight, W_m = W o (s_m r_m^T),
and its own bias b_m. For a linear layer this is computed without forming W_m:

    y_m = ((x o r_m) W^T) o s_m + b_m.

r_m and s_m start at one and b_m at the pretrained bias, so every member equals the pretrained layer at init.
For a Conv2d the kernel is read as an (out, in*k*k) matrix (``sve.layers.adapter``), r_m has in*k*k entries,
and the M member kernels run as one grouped convolution; with r_m constant over the k*k taps this is Wen et
al.'s per-channel convolution.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sve.layers.adapter import check_layer, member_conv2d, weight_shape
from sve.layers.sv_linear import weight_matrix
from sve.members import split_members


class BatchEnsembleLayer(nn.Module):
    """Args:
    base: the layer (nn.Linear, HF Conv1D or nn.Conv2d); its weight becomes the shared weight (trainable or
        not, as the method decides) and its bias becomes one bias per member.
    ensemble_size: number of members M.
    """

    def __init__(self, base: nn.Module, ensemble_size: int):
        super().__init__()
        check_layer(base)
        self.ensemble_size = ensemble_size
        self.out_features, self.in_features = weight_shape(base)
        bias = base.bias
        base.register_parameter("bias", None)  # replaced by the member biases below
        self.base = base
        self.r = nn.Parameter(torch.ones(ensemble_size, self.in_features))  # (M, in')
        self.s = nn.Parameter(torch.ones(ensemble_size, self.out_features))  # (M, out)
        self.bias = (
            nn.Parameter(bias.detach().float().expand(ensemble_size, -1).clone()) if bias is not None else None
        )  # (M, out)

    def forward(self, x: Tensor) -> Tensor:
        M = self.ensemble_size
        W = weight_matrix(self.base)
        if isinstance(self.base, nn.Conv2d):
            kernels = (self.s[:, :, None] * W.unsqueeze(0) * self.r[:, None, :]).to(x.dtype)  # (M, out, in')
            y = member_conv2d(x, kernels.reshape(M, *self.base.weight.shape), self.base)  # (M*B, out, H', W')
            if self.bias is not None:
                y = (split_members(y, M, "BatchEnsembleLayer") + self.bias.to(y.dtype)[:, None, :, None, None])
                y = y.reshape(-1, *y.shape[2:])
            return y
        lead = x.shape[:-1]
        xs = split_members(x, M, type(self).__name__).reshape(M, -1, self.in_features)  # (M, N*T, in)
        y = F.linear(xs * self.r.to(x.dtype)[:, None], W) * self.s.to(x.dtype)[:, None]  # (M, N*T, out)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)[:, None]
        return y.reshape(*lead, self.out_features)

    @torch.no_grad()
    def member_weight(self, member: int) -> Tensor:
        """W o (s_m r_m^T) as an (out, in') matrix."""
        return self.s[member, :, None] * weight_matrix(self.base).float() * self.r[member, None, :]

    def extra_repr(self) -> str:
        return f"ensemble_size={self.ensemble_size}"
