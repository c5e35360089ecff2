"""Singular Value Ensemble (SVE, Sec. 4) and its one-member special case, SVF (Sun et al., 2022).

Every target linear of the backbone becomes an ``SVLinear``: frozen U and V, M trainable copies of the
singular values initialised s * (1 + eps), eps ~ N(0, sigma_init^2) (Eq. 5). All other backbone weights are
frozen; each member has its own head. The loss is the mean member cross-entropy (Eq. 6).

Beyond the paper, a target convolution (``nn.Conv1d``, ``Conv2d`` or ``Conv3d``) becomes an ``SVConv`` (the
kernel as an (out, in*k1*...*kd) matrix; see ``sve.layers.sv_conv``), so SVE and SVF also apply to CNNs such
as the CIFAR ResNets, and to audio and volume CNNs.

Evaluation runs the members with merged weights where that is faster (``inference``, see
``sve.layers.sv_inference``). With ``auto``, the method decides each time it enters evaluation whether the
merged weights of all members may be cached: only when M copies of the wrapped weights take at most half of
the free memory of the device; otherwise the running chunk's weights (``members_at_once``) are merged per
call and dropped, so a model too large for M merged copies never holds them. With cached weights every
member is a dense model, and ``members_at_once: auto`` (the config's default) runs them as such on the CPU,
a few examples per pass. The SVD is read from a disk cache when one is configured (``svd_cache``, see
``sve.layers.svd_cache``).
"""

from __future__ import annotations

import logging
import time

import torch
from torch import nn

from sve.layers.member import CONV_TYPES
from sve.layers.singular_values import movement
from sve.layers.sv_conv import SVConv
from sve.layers.sv_inference import check_inference
from sve.layers.sv_linear import SVLinear
from sve.layers.svd_cache import SVDCache
from sve.memory import free_memory
from sve.methods.base import EnsembleMethod
from sve.methods.options import check_factor_dtype, check_sigma_init

log = logging.getLogger(__name__)


class SVE(EnsembleMethod):
    """Args:
    sigma_init: std of the multiplicative init noise (Table 7: 0.005 or 0.01).
    member_bias: one trainable bias per member in every wrapped layer (the authors' public code).
    svd_dtype: precision of the SVD at init (float64: reconstruction error ~1e-7 after the float32 cast).
    factor_dtype: storage dtype of U and V; None keeps the layer's dtype (bf16 for bf16 backbones).
        ``bfloat16`` halves their memory (the lean mode, docs/benchmark.md "Memory") at the reconstruction
        error that ``make bench`` records (results/bench/*.json, ``lean_memory.bf16_weight_error``; larger
        shapes: ``scripts/sv_bf16_error.py``); the singular values always stay float32.
    inference: ``auto``, ``factored``, ``cached`` or ``merged``: how members compute in evaluation.
    svd_cache: directory of the SVD cache; None computes every SVD afresh.
    """

    display_name = "SV-Ensemble"
    wrapping = "SVD of"
    trains = "each member's singular values (and biases) and its head"

    def __init__(
        self,
        backbone,
        ensemble_size: int,
        num_classes: int,
        sigma_init: float = 0.01,
        member_bias: bool = True,
        svd_dtype: str = "float64",
        factor_dtype: str | None = None,
        inference: str = "auto",
        svd_cache: str | None = None,
        **common,
    ):
        check_sigma_init(sigma_init, "method.sigma_init")
        check_factor_dtype(factor_dtype, "method.factor_dtype")
        super().__init__(backbone, ensemble_size, num_classes, **common)
        self.sigma_init = sigma_init
        if self.fixed_ensemble_size is None:  # SVF has one member by design
            self.warn_if_members_start_alike("sigma_init", sigma_init)
        self.member_bias = member_bias
        self.svd_dtype = getattr(torch, svd_dtype)
        self.factor_dtype = getattr(torch, factor_dtype) if factor_dtype else None
        self.inference = check_inference(inference, "method.inference")
        self.svd_cache = SVDCache(svd_cache) if svd_cache else None
        self.merged_cache: bool | None = None  # auto's last decision (plan_inference)
        # The free memory plan_inference assumes instead of asking the device: a memory plan (sve.runs.plan)
        # builds the model on fake tensors, for a device this machine may not have.
        self.planned_free_memory: int | None = None
        start = time.perf_counter()
        self.adapt()
        self.svd_seconds = time.perf_counter() - start  # one-time cost (Sec. 5: ~3.5 s for BERT-base on a GPU)
        for layer in self.sv_layers():
            layer.inference = self.inference
        if self.svd_cache is None:
            log.info("SVD of %d layers took %.1f s", len(self.wrapped), self.svd_seconds)
        else:
            st = self.svd_cache.stats
            log.info(
                "SVD of %d layers took %.1f s: %d read from the cache %s (%.1f s), %d computed (%.1f s)%s",
                len(self.wrapped),
                self.svd_seconds,
                st["hits"],
                self.svd_cache.directory,
                st["read_seconds"],
                st["misses"],
                st["compute_seconds"],
                self.svd_cache.written(),
            )

    def make_layer(self, layer: nn.Module) -> SVLinear:
        convert = SVConv.from_conv if isinstance(layer, CONV_TYPES) else SVLinear.from_linear
        return convert(
            layer,
            ensemble_size=self.ensemble_size,
            sigma_init=self.sigma_init,
            member_bias=self.member_bias,
            svd_dtype=self.svd_dtype,
            factor_dtype=self.factor_dtype,
            cache=self.svd_cache,
        )

    def merged_bytes(self) -> int:
        """Memory that cached merged weights of all members take, in the backbone's compute dtype."""
        size = torch.empty(0, dtype=self.compute_dtype()).element_size()
        return sum(layer.ensemble_size * layer.out_features * layer.in_features for layer in self.sv_layers()) * size

    def compute_dtype(self) -> torch.dtype:
        """The dtype activations have: that of the backbone's first floating weight outside the SV layers."""
        factors = {id(p) for layer in self.sv_layers() for p in layer.parameters()}
        return next(
            (p.dtype for p in self.backbone.parameters() if id(p) not in factors and p.is_floating_point()),
            torch.float32,
        )

    @classmethod
    def check_options(cls, node, prefix: str = "method") -> None:
        """A config node's values that need the layers' code to check (``sve.runs.validate`` calls this before any
        work; the values that need no torch are checked earlier, ``sve.methods.options``)."""
        if node.get("inference") is not None:
            check_inference(node.get("inference"), f"{prefix}.inference")

    def plan_inference(self) -> None:
        """``auto``: cache the merged weights of all members only when they take at most half of the free
        memory of the device; otherwise merge each chunk's weights per call."""
        if self.inference != "auto" or not self.sv_layers():
            return
        need = self.merged_bytes()
        device = self.sv_layers()[0].U.device
        free = free_memory(device) if self.planned_free_memory is None else self.planned_free_memory
        cache = need <= free / 2
        if cache != self.merged_cache:
            log.info(
                "%s inference: merged weights %s (%.0f MB for all members)",
                type(self).__name__,
                "cached for all members" if cache else "merged per chunk of members",
                need / 2**20,
            )
        self.merged_cache = cache
        for layer in self.sv_layers():
            layer.auto_cache = cache

    def train(self, mode: bool = True):
        super().train(mode)
        if not mode:
            self.plan_inference()
        return self

    def report(self) -> dict:
        facts = {
            **super().report(),
            "svd_seconds": self.svd_seconds,
            "inference": self.inference,
            "merged_cache": self.merged_cache,
            "merged_cache_bytes": self.merged_bytes(),
        }
        if self.svd_cache is not None:
            facts["svd_cache"] = self.svd_cache.summary()
        # Whether the singular values trained at all, or the members still differ by their init noise only (as
        # under a too-small learning rate): read beside sigma_init.
        facts["singular_values"] = movement(self)
        return facts

    def sv_layers(self) -> list[SVLinear]:
        return [m for m in self.modules() if isinstance(m, SVLinear)]

    def constrain_(self) -> None:
        for layer in self.sv_layers():
            layer.constrain_()


class SVF(SVE):
    """Singular-value fine-tuning: SVE with one member and no init noise (the paper's "Single w/ SVF")."""

    display_name = "Single w/ SVF"
    trains = "the singular values (and biases) and the head"

    fixed_ensemble_size = 1

    def __init__(self, backbone, ensemble_size: int, num_classes: int, sigma_init: float = 0.0, **kwargs):
        super().__init__(backbone, ensemble_size, num_classes, sigma_init=sigma_init, **kwargs)
