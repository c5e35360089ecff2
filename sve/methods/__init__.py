"""Methods: each wraps a backbone and returns member logits (M, B, C); see ``sve.members``.

The classes are imported on first use (``sve.methods.SVE``, a config's ``_target_``), so that the registry of
methods (``sve.methods.registry``) can be read without torch, and a method's facts without every other
method's dependencies (laplace-torch for Bayes-LoRA).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "EnsembleMethod": "base",
    "MemberHeads": "heads",
    "BatchEnsemble": "batch_ensemble",
    "BayesLoRA": "bayes_lora",
    "BayesLoRALA": "bayes_lora",
    "BayesLoRALLLA": "bayes_lora",
    "BLoB": "blob",
    "CheckpointEnsemble": "checkpoint_ensemble",
    "DeepEnsemble": "deep_ensemble",
    "DeepEnsembleLoRA": "deep_ensemble",
    "LastLayerEnsemble": "last_layer",
    "LoRAEnsemble": "lora",
    "SingleLoRA": "lora",
    "MCDropout": "mc_dropout",
    "MCDropoutLoRA": "mc_dropout",
    "Single": "single",
    "SVE": "sve",
    "SVF": "sve",
    "SVELoRA": "sve_lora",
    "SVETop": "sve_top",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
