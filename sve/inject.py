"""Replace target layers of a backbone with adapter layers (SV layers, LoRA, BatchEnsemble, ...).

Following peft: the names to replace are collected first, then each module is swapped through its parent,
so the tree is never mutated while it is being iterated. A pattern is a regular expression that must match
a whole dot-separated suffix of the module name: ``query`` matches ``encoder.layer.0.attention.self.query``
but not ``encoder.layer.0.attention.self.query_proj``; ``attn\\.(qkv|proj)`` matches ``blocks.3.attn.qkv``.
Only the layer types given (by default nn.Linear and Hugging Face Conv1D) are candidates, so ``proj`` does
not catch timm's Conv2d ``patch_embed.proj``; classification heads are never candidates.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence

from torch import nn

from sve.layers.sv_linear import Conv1D

log = logging.getLogger(__name__)

LINEAR_TYPES: tuple[type, ...] = (nn.Linear,) + ((Conv1D,) if Conv1D else ())

# Module names that are heads in the libraries we wrap; they are never adapted even if a pattern matches.
HEAD_NAMES = ("head", "fc_norm.head", "classifier", "lm_head", "score", "pooler.dense", "linear", "fc")


def _is_head(name: str, protected: Sequence[str]) -> bool:
    return any(name == p or name.endswith("." + p) for p in protected)


def find_targets(
    model: nn.Module,
    patterns: Sequence[str],
    types: tuple[type, ...] = LINEAR_TYPES,
    protected: Sequence[str] = HEAD_NAMES,
) -> list[str]:
    """Names of modules of ``types`` whose name ends in a dotted suffix matching one of ``patterns``."""
    if isinstance(patterns, str):
        patterns = [patterns]
    compiled = [re.compile(rf"(?:^|\.)(?:{p})$") for p in patterns]
    return [
        name
        for name, module in model.named_modules()
        if name
        and isinstance(module, types)
        and not _is_head(name, protected)
        and any(c.search(name) for c in compiled)
    ]


def inject(
    model: nn.Module,
    patterns: Sequence[str],
    factory: Callable[[nn.Module], nn.Module],
    types: tuple[type, ...] = LINEAR_TYPES,
    protected: Sequence[str] = HEAD_NAMES,
) -> list[str]:
    """Replaces every target module ``m`` by ``factory(m)`` in place; returns the replaced names."""
    names = find_targets(model, patterns, types, protected)
    if not names:
        candidates = [n for n, m in model.named_modules() if n and isinstance(m, types)]
        shown = ", ".join(candidates[:12]) + (" ..." if len(candidates) > 12 else "")
        raise ValueError(
            f"no module matched the target patterns {list(patterns)} "
            f"(types: {[t.__name__ for t in types]}); candidate modules are: {shown or 'none'}"
        )
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, factory(getattr(parent, child)))
    log.debug("wrapped %d modules: %s", len(names), ", ".join(names))
    return names
