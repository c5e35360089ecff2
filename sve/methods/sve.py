"""Singular Value Ensemble (SVE, Sec. 4) and its one-member special case, SVF (Sun et al., 2022).

Every target linear of the backbone becomes an ``SVLinear``: frozen U and V, M trainable copies of the
singular values initialised s * (1 + eps), eps ~ N(0, sigma_init^2) (Eq. 5). All other backbone weights are
frozen; each member has its own head. The loss is the mean member cross-entropy (Eq. 6).

Beyond the paper, a target ``nn.Conv2d`` becomes an ``SVConv2d`` (the kernel as an (out, in*kh*kw) matrix;
see ``sve.layers.sv_conv``), so SVE and SVF also apply to CNNs such as the CIFAR ResNets.
"""

from __future__ import annotations

import logging
import time

import torch
from torch import nn

from sve.layers.sv_conv import SVConv2d
from sve.layers.sv_linear import SVLinear
from sve.methods.base import EnsembleMethod

log = logging.getLogger(__name__)


class SVE(EnsembleMethod):
    """Args:
    sigma_init: std of the multiplicative init noise (Table 7: 0.005 or 0.01).
    member_bias: one trainable bias per member in every wrapped layer (the authors' public code).
    svd_dtype: precision of the SVD at init (float64: reconstruction error ~1e-7 after the float32 cast).
    factor_dtype: storage dtype of U and V; None keeps the layer's dtype (bf16 for bf16 backbones).
    """

    def __init__(self, backbone, ensemble_size: int, num_classes: int, sigma_init: float = 0.01,
                 member_bias: bool = True, svd_dtype: str = "float64", factor_dtype: str | None = None, **common):
        super().__init__(backbone, ensemble_size, num_classes, **common)
        self.sigma_init = sigma_init
        self.member_bias = member_bias
        self.svd_dtype = getattr(torch, svd_dtype)
        self.factor_dtype = getattr(torch, factor_dtype) if factor_dtype else None
        start = time.perf_counter()
        self.adapt()
        self.svd_seconds = time.perf_counter() - start  # one-time cost (Sec. 5: ~3.5 s for BERT-base on a GPU)
        log.info("SVD of %d layers took %.1f s", len(self.wrapped), self.svd_seconds)

    def make_layer(self, layer: nn.Module) -> SVLinear:
        convert = SVConv2d.from_conv if isinstance(layer, nn.Conv2d) else SVLinear.from_linear
        return convert(layer, ensemble_size=self.ensemble_size, sigma_init=self.sigma_init,
                       member_bias=self.member_bias, svd_dtype=self.svd_dtype, factor_dtype=self.factor_dtype)

    def report(self) -> dict:
        return {**super().report(), "svd_seconds": self.svd_seconds}

    def sv_layers(self) -> list[SVLinear]:
        return [m for m in self.modules() if isinstance(m, SVLinear)]

    def constrain_(self) -> None:
        for layer in self.sv_layers():
            layer.constrain_()


class SVF(SVE):
    """Singular-value fine-tuning: SVE with one member and no init noise (the paper's "Single w/ SVF")."""

    fixed_ensemble_size = 1

    def __init__(self, backbone, ensemble_size: int, num_classes: int, sigma_init: float = 0.0, **kwargs):
        super().__init__(backbone, ensemble_size, num_classes, sigma_init=sigma_init, **kwargs)
