"""Singular-value linear layer: the building block of SVF and SV-Ensembles.

Paper: "Making Foundation Models Probabilistic via Singular Value Ensembles", Sec. 4.
A pretrained weight W (out x in) is decomposed once, W = U diag(s) V^T (Eq. 3). U and V are frozen; each of
the M members owns a copy of the singular values, initialised multiplicatively (Eq. 5)

    s_m = s * (1 + eps_m),   eps_m ~ N(0, sigma_init^2 I),

and member m computes y = U diag(s_m) V^T x + b_m (Eq. 4). In training the product is evaluated factored,
((x V) * s_m) U^T, so no (out x in) matrix is ever materialised per member: autograd then keeps only
activations of width r = min(out, in) per member instead of M weight copies (this is what keeps the memory
overhead at about 1%, Table 5). In evaluation the members may run with merged weights instead, cached or
merged per call (``inference``; the rules and their measurements are in ``sve.layers.sv_inference``).

Precision: the SVD is computed in float64 on the CPU/GPU holding the weight (``svd_dtype``), then U and V are
cast to ``factor_dtype`` (default: the layer's own dtype). In float32 the reconstruction error
|U diag(s) V^T - W| / |W| is about 1e-7 (tested); with bfloat16 factors it is about 2e-3
(scripts/sv_bf16_error.py), which is why the trainable singular values always stay in float32.

Members run through the protocol of ``sve.layers.member`` (selection, banks, layout checks, ``weight``/``merge``).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from sve.errors import InputError
from sve.layers.member import CONV_TYPES, MemberLayer, weight_matrix
from sve.layers.sv_inference import check_inference, member_slice, merge_members, merged_is_faster, tensor_key
from sve.layers.svd_cache import SVDCache, has_bytes, weight_key


def decompose(
    layer: nn.Module,
    svd_dtype: torch.dtype = torch.float64,
    factor_dtype: torch.dtype | None = None,
    cache: SVDCache | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Thin SVD of ``weight_matrix(layer)`` computed in ``svd_dtype``: U (out, r) and Vh (r, in') cast to
    ``factor_dtype`` (default: the layer's dtype), s (r,) kept in ``svd_dtype``; read from ``cache`` when
    it holds this weight's factors (``sve.layers.svd_cache``)."""
    return decompose_with_source(layer, svd_dtype, factor_dtype, cache)[:3]


def decompose_with_source(
    layer: nn.Module,
    svd_dtype: torch.dtype = torch.float64,
    factor_dtype: torch.dtype | None = None,
    cache: SVDCache | None = None,
) -> tuple[Tensor, Tensor, Tensor, str | None]:
    """``decompose`` and the factors' source: the SVD cache's key of the weight and settings
    (``svd_cache.weight_key``). Checkpoints identify frozen factors by it (``factor_sources``): their bits come
    from the machine's LAPACK and BLAS code paths (another instruction set, another last bit), the source
    does not."""
    W = weight_matrix(layer).detach()
    factor_dtype = factor_dtype or W.dtype
    # A weight without bytes (fake or meta tensors: the memory plan builds the model on those) has no source key.
    key = weight_key(W, svd_dtype, factor_dtype) if has_bytes(W) else None

    def compute() -> tuple[Tensor, Tensor, Tensor]:
        U, s, Vh = torch.linalg.svd(W.to(svd_dtype), full_matrices=False)
        return U.to(factor_dtype), s, Vh.to(factor_dtype)

    U, s, Vh = compute() if cache is None else cache.factors(W, svd_dtype, factor_dtype, compute, key=key)
    return U, s, Vh, key


# Every live SV layer, so that any optimiser's step projects its singular values back onto s >= 0 (one hook
# for the process, registered with the first layer): a plain PyTorch loop needs no call after
# ``optimizer.step()``, and the Lightning module gets the same projection (it also calls ``constrain_``, for
# optimisers that step copies of the parameters, e.g. FSDP's flattened ones, which the hook cannot recognise).
# Process-wide, not an argument (docs/architecture.md#global-state): the optimiser may be the user's own, built
# after ``sve.wrap`` returns and stepped in their loop, and PyTorch has no per-optimiser hook that fires for an
# optimiser not yet built, nor a per-parameter one after the step. The set maps the stepped parameters back to
# their layers by identity at each step (a ``singular_values`` replaced since, e.g. ``load_state_dict(assign=True)``,
# is still found, which a mark on the parameter would not be) and, being weak, lets dropped layers go.
_LAYERS: weakref.WeakSet = weakref.WeakSet()
_hook = None


def _project_after_step(optimizer, args, kwargs) -> None:
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for layer in list(_LAYERS):
        if id(layer.singular_values) in stepped:
            layer.constrain_()


def _constrained_by_every_optimizer(layer: SVLinear) -> None:
    global _hook
    if _hook is None:
        _hook = register_optimizer_step_post_hook(_project_after_step)
    _LAYERS.add(layer)


class SVLinear(MemberLayer):
    """M members sharing frozen singular vectors, each with its own singular values (and bias).

    Build it with ``from_linear``. Per-member tensors: ``singular_values`` (M, r) and, with ``member_bias``,
    ``biases`` (M, out); otherwise the pretrained bias is kept frozen and shared as ``shared_bias``.

    Args:
        base: the pretrained layer (its geometry; its weight is given as factors).
        U: left singular vectors (out, r); frozen.
        s: pretrained singular values (r,).
        Vh: right singular vectors transposed (r, in); frozen.
        ensemble_size: number of members M.
        sigma_init: std of the multiplicative initial perturbation (Eq. 5); 0 gives M identical members.
        member_bias: train one bias per member (what the authors' public code does).
        source: what U and Vh were computed from (``decompose_with_source``), or None.

    Attributes:
        inference: ``auto``, ``factored``, ``cached`` or ``merged``: how members compute in evaluation
            (``sve.layers.sv_inference``); training is always factored.
        auto_cache: which merged form ``auto`` may use: cached weights of all members (True) or weights
            merged per call for the running members only (False). The method sets it from its memory.
    """

    def __init__(
        self,
        base: nn.Module,
        U: Tensor,
        s: Tensor,
        Vh: Tensor,
        ensemble_size: int,
        sigma_init: float = 0.0,
        member_bias: bool = True,
        source: str | None = None,
    ):
        super().__init__(base, ensemble_size)
        if sigma_init < 0:
            raise InputError(f"sigma_init must be >= 0, got {sigma_init}")
        self.rank = s.shape[0]
        # Frozen parameters rather than buffers: they move with .to() and sit in the state_dict, but DDP
        # neither re-broadcasts them every step (as it does buffers) nor reduces gradients for them.
        self.U = nn.Parameter(U.detach().clone(), requires_grad=False)
        self.Vh = nn.Parameter(Vh.detach().clone(), requires_grad=False)
        self.register_buffer("pretrained_singular_values", s.detach().float().clone())
        s32 = s.detach().float()
        eps = torch.randn(ensemble_size, self.rank, device=s.device) * sigma_init
        # Non-negative from the start, as the constraint keeps them during training.
        self.singular_values = nn.Parameter((s32 * (1 + eps)).clamp_min(0))  # (M, r), always float32
        bias = base.bias
        self.bias_per_member = member_bias and bias is not None
        self.biases = (
            nn.Parameter(bias.detach().float().expand(ensemble_size, -1).clone()) if self.bias_per_member else None
        )  # (M, out)
        shared = None if bias is None or member_bias else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.shared_bias = shared  # (out,), frozen
        self._merged: tuple[tuple, Tensor] | None = None  # (key, (M, out, in') weights); never in state_dict
        # Frozen parameter name -> what it was computed from (``decompose_with_source``): checkpoints fingerprint
        # those by their source, not by their machine-dependent bits (training.checkpoint).
        self.factor_sources: dict[str, str] = dict.fromkeys(("U", "Vh"), source) if source else {}
        self.inference = "auto"
        self.auto_cache = True
        _constrained_by_every_optimizer(self)

    @classmethod
    def from_linear(
        cls,
        layer: nn.Module,
        ensemble_size: int,
        sigma_init: float = 0.0,
        member_bias: bool = True,
        svd_dtype: torch.dtype = torch.float64,
        factor_dtype: torch.dtype | None = None,
        cache: SVDCache | None = None,
    ) -> SVLinear:
        """Decomposes an nn.Linear (or HF Conv1D) weight with a thin SVD computed in ``svd_dtype`` (or read
        from ``cache``)."""
        if isinstance(layer, CONV_TYPES):
            raise TypeError(f"use SVConv.from_conv for an nn.{type(layer).__name__}")
        U, s, Vh, source = decompose_with_source(layer, svd_dtype, factor_dtype, cache)  # (out, r), (r,), (r, in)
        return cls(layer, U, s, Vh, ensemble_size, sigma_init=sigma_init, member_bias=member_bias, source=source)

    @property
    def base_dtype(self) -> torch.dtype:
        return self.U.dtype

    def forward_members(self, x: Tensor, members: list[int]) -> Tensor:
        path = self.path(x, len(members))
        if path == "factored":
            return self.factored(x, members)
        # Under autocast the matmul runs in the autocast dtype: merge (and cache) in it, not cast on every call.
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        return self.apply_merged(x, self.merged_weights(members, dtype, cache=path == "cached"), members)

    def factored(self, x: Tensor, members: list[int]) -> Tensor:
        K, lead = len(members), x.shape[:-1]
        h = x.reshape(K, -1, self.in_features) @ self.Vh.t().to(x.dtype)  # (K, N, r)
        h = h * self.pick("singular_values", members).to(h.dtype).unsqueeze(1)  # scale member k's directions
        y = h @ self.U.t().to(h.dtype)  # (K, N, out)
        return self.add_bias(y, members, channel_dim=-1).reshape(*lead, self.out_features)

    def apply_merged(self, x: Tensor, W: Tensor, members: list[int]) -> Tensor:
        """Block k of x through member k's merged weight W[k] (K, out, in), all K in one batched matmul."""
        K, b = len(members), self.bias_rows(members, x.dtype)  # b: (K, out) or None
        if K == 1:  # any input shape
            return F.linear(x, W[0], None if b is None else b[0])
        xs = x.reshape(K, -1, self.in_features)  # (K, N, in)
        Wt = W.transpose(1, 2)  # (K, in, out), a view: BLAS reads it transposed
        y = torch.bmm(xs, Wt) if b is None else torch.baddbmm(b.unsqueeze(1), xs, Wt)  # (K, N, out)
        return y.reshape(*x.shape[:-1], self.out_features)

    # ----- evaluation with merged weights (sve.layers.sv_inference) -------------------------------------------
    def tokens_per_member(self, x: Tensor, K: int) -> float:
        """Rows each member's weight is applied to in this call (N in the rules)."""
        return x.numel() / (K * self.in_features)

    def path(self, x: Tensor, K: int) -> str:
        """``factored``, ``cached`` or ``merged`` for this call; merged weights never under autograd."""
        if self.training or torch.is_grad_enabled() or self.inference == "factored":
            return "factored"
        if self.inference != "auto":
            return self.inference
        faster = merged_is_faster(
            self.tokens_per_member(x, K), self.in_features, self.out_features, self.rank, cached=self.auto_cache
        )
        return ("cached" if self.auto_cache else "merged") if faster else "factored"

    def merged_weights(self, members: list[int], dtype: torch.dtype, cache: bool) -> Tensor:
        """(K, out, in') merged weights of ``members``: from the cache of all members (rebuilt when a key
        differs) or merged for these members only."""
        keys = tuple(tensor_key(t) for t in self.merge_inputs())
        if not cache or None in keys:
            return self.merge_weights(members, dtype)
        key = (*keys, dtype)
        if self._merged is None or self._merged[0] != key:
            self._merged = None  # free the stale copy before building the new one
            self._merged = (key, self.merge_weights(list(range(self.num_members())), dtype))
        return member_slice(self._merged[1], members)

    def merge_inputs(self) -> tuple[Tensor, ...]:
        """The tensors the merged weights are made of: a cached copy is rebuilt when any of them changes."""
        return self.member_tensor("singular_values"), self.U, self.Vh  # (M, r) or a bank's, (out, r), (r, in')

    def merge_weights(self, members: list[int], dtype: torch.dtype) -> Tensor:
        """(K, out, in') weights U diag(s_k) V^T of ``members``, differentiable."""
        return merge_members(self.U, self.pick("singular_values", members), self.Vh, dtype)

    @property
    def inference(self) -> str:
        return self._inference

    @inference.setter
    def inference(self, value: str) -> None:
        if value != getattr(self, "_inference", None):
            self._inference = check_inference(value, f"{self.module_name}.inference")
            self.clear_cache()

    def clear_cache(self) -> None:
        """Drops the merged weights (needed only after a write through ``.data``, which PyTorch does not count)."""
        self._merged = None

    def cache_bytes(self) -> int:
        return 0 if self._merged is None else self._merged[1].numel() * self._merged[1].element_size()

    def train(self, mode: bool = True):
        if mode:
            self.clear_cache()  # no merged copy ever lives during training
        return super().train(mode)

    def _apply(self, fn, recurse=True):
        self.clear_cache()  # .to(), .cuda(), .half(): rebuilt on the new device or dtype when needed
        return super()._apply(fn, recurse)

    def bias_rows(self, members: list[int], dtype: torch.dtype) -> Tensor | None:
        """(K, out) biases of ``members`` (the shared bias repeated), or None."""
        if self.biases is not None:
            return self.pick("biases", members).to(dtype)
        if self.shared_bias is not None:
            return self.shared_bias.to(dtype).expand(len(members), -1)
        return None

    def add_bias(self, y: Tensor, members: list[int], channel_dim: int) -> Tensor:
        """Adds member k's bias to block k of y (K, ..., out, ...); the channel axis is ``channel_dim``."""
        b = self.bias_rows(members, y.dtype)  # (K, out)
        if b is None:
            return y
        trailing = -channel_dim - 1  # axes after the channel axis
        return y + b.reshape(len(members), *([1] * (y.dim() - 2 - trailing)), -1, *([1] * trailing))

    @torch.no_grad()
    def constrain_(self) -> None:
        """Projects the singular values back onto s >= 0; every optimiser step that updates them calls it."""
        self.singular_values.clamp_(min=0)

    def member_weight(self, member: int) -> Tensor:
        """W_m = U diag(s_m) V^T (and what a subclass's ``merge_weights`` adds), (out, in'), in float32."""
        return self.merge_weights([member], torch.float32)[0]

    def member_bias(self, member: int) -> Tensor | None:
        if self.biases is not None:
            return self.member_tensor("biases")[member]
        return self.shared_bias

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, "
            f"ensemble_size={self.ensemble_size}, member_bias={self.bias_per_member}, inference={self.inference}"
        )


__all__ = ["SVLinear", "decompose", "weight_matrix"]
