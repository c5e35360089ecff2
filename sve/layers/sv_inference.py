"""How an SV layer's members compute in evaluation: the factored product or merged weights.

Member m's weight is W_m = U diag(s_m) V^T (out x in', rank r). Training always runs the factored product
x V diag(s_m) U^T: autograd then keeps activations of width r per member rather than M weight copies, and the
gradient of s_m costs no (out x in') product. In evaluation (module in eval mode and no autograd graph being
recorded) the merged weight is cheaper per token: N tokens of one member cost

    factored   N r (in' + out)             (2 N d^2 for a square layer: twice a dense layer)
    merged     N in' out  +  out r in'      (the second term: merging, once per member)

so an SV layer can run its K members as one batched matmul over K merged weights (``torch.baddbmm``; a
grouped convolution for ``SVConv``), exactly as K dense layers would. ``inference`` chooses:

- ``factored``: the training path, always.
- ``cached``: the merged weights of all M members are computed once and kept until the singular values (or
  the factors) change; this costs M x the layer's weight in memory.
- ``merged``: the weights of the members running now (a chunk of ``members_at_once``) are merged in every
  forward and dropped after it; no copy outlives the call, so a large model never holds M merged copies.
- ``auto``: per layer and per call, whichever of the two sides (cached or merged, as the method decides from
  the memory it has; ``auto_cache``) and the factored path is faster by the rules below.

The rules come from measurements on the CPU (one thread; ``sve-bench --parts rule``, which
writes the time ratios for every shape and token count to results/bench/rule.json). Per token, merged
weights save the fraction f = 1 - in' out / (r (in' + out)) of the factored FLOPs: 1/2 for a square layer,
1/5 for a 4:1 MLP layer, nothing (f <= 0) for a low-rank one, which stays factored.

- *Cached weights* cost no merging, but K weight matrices are read where the factored path reads one U and
  one V for all members, so at a few tokens per member the memory traffic decides and the cache is slower
  (unless all K weights fit in the CPU's caches, as for the small square layer of rule.json); with more
  tokens the time ratio falls towards the FLOP ratio, sooner for square layers than for 4:1 ones. Rule:
  cache when N f >= ``CACHED_SAVED_TOKENS`` = 8 (N >= 16 for a square layer, N >= 40 for a 4:1 one), from
  where rule.json shows the cache ahead for the larger square layer.
- *Merging per call* pays off when the FLOPs saved on N tokens exceed the merge, N r (in' + out) f >
  out r in' (N > d for a square layer of width d). The measured crossovers in rule.json lie somewhat above
  that break-even, hence ``MERGE_FACTOR`` = 1.25.

Invalidation is by value identity, not by hooks: the cache is keyed by (data pointer, version counter,
dtype, device, shape) of the singular values and of U and V. Every in-place change bumps PyTorch's version
counter (optimiser steps, ``load_state_dict``, ``with torch.no_grad(): s[0, 0] = 1``), ``.to()`` changes the
pointer, dtype or device, and a bank of stand-in values (``MemberLayer.use_bank``) is another tensor. The one
write PyTorch does not count is through ``.data``; call ``clear_cache()`` after such an edit. Biases are read
live on every call, never cached. The cache is dropped when the module enters training mode or moves.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from sve.errors import InputError

INFERENCE = ("auto", "factored", "cached", "merged")
CACHED_SAVED_TOKENS = 8
MERGE_FACTOR = 1.25


def check_inference(value: str, where: str = "inference") -> str:
    """The value itself, or an error naming it and the valid choices."""
    if value not in INFERENCE:
        raise InputError(
            f'{where}={value!r} is not valid; expected one of {list(INFERENCE)} (docs/benchmark.md: "Inference modes")'
        )
    return value


def merged_is_faster(tokens: float, in_features: int, out_features: int, rank: int, cached: bool) -> bool:
    """Whether ``tokens`` per member run faster with merged weights than factored (module docstring)."""
    factored = rank * (in_features + out_features)  # FLOPs per token, factored
    saved = factored - in_features * out_features  # FLOPs per token that merged weights save
    if saved <= 0:
        return False
    if cached:
        return tokens * saved / factored >= CACHED_SAVED_TOKENS
    return tokens * saved > MERGE_FACTOR * out_features * rank * in_features


def tensor_key(t: Tensor) -> tuple | None:
    """What identifies the values of ``t`` without reading them; None for an inference-mode tensor, which
    has no version counter (it is merged per call, never cached)."""
    if t.is_inference():
        return None
    # A fake tensor (a memory plan, sve.runs.plan) has no data to point to: the object stands for it.
    pointer = id(t) if is_fake(t) else t.data_ptr()
    return pointer, t._version, t.dtype, t.device, tuple(t.shape)


def member_slice(W: Tensor, members: list[int]) -> Tensor:
    """Rows ``members`` of W (M, ...): a view for consecutive members (the usual chunks), else a copy."""
    first = members[0]
    if members == list(range(first, first + len(members))):
        return W[first : first + len(members)]
    return W[members]


def merge_members(U: Tensor, s: Tensor, Vh: Tensor, dtype: torch.dtype) -> Tensor:
    """(K, out, in') merged weights U diag(s_k) V^T for s (K, r), computed at least in float32 and returned in
    ``dtype``. One batched matmul: a loop over members costs several times more on the CPU, where each small
    operator pays a thread synchronisation. Differentiable (the benchmark's rebuild formulation uses that)."""
    compute = torch.promote_types(torch.float32, dtype)
    return torch.matmul(U.to(compute) * s.to(compute)[:, None, :], Vh.to(compute)).to(dtype)


__all__ = [
    "INFERENCE",
    "CACHED_SAVED_TOKENS",
    "MERGE_FACTOR",
    "check_inference",
    "merged_is_faster",
    "tensor_key",
    "member_slice",
    "merge_members",
]
