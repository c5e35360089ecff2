"""SVE: Singular Value Ensembles for pretrained models, and every baseline of the paper behind one interface.

Package map (by role; the modules are still flat, issue 22 groups them into subpackages):

- Member core: ``layers`` (SV, LoRA, BatchEnsemble and BLoB member layers, SV inference paths), ``inject``
  (wraps a backbone's target layers), ``members`` (the (M, B, C) member-logit layout and the predictive),
  ``shared_inputs``, ``svd_cache``, ``singular_values``.
- Models and data: ``backbones`` (timm, Hugging Face, CIFAR ResNets, choice LMs), ``methods`` (one class per
  method of the paper), ``data`` (data modules, their up-front checks, samplers, corruptions).
- Training: ``module`` (the one LightningModule), ``optim``, ``checkpoint`` (exact resume), ``draws``
  (draws independent of the device layout), ``allocator``, ``loggers``, ``validate`` (config checks, probe).
- Runs: ``run`` (what train.py calls), ``rundir`` (directories, locks, the config a directory started with),
  ``evaluation`` and ``evaluate`` (scoring, re-evaluation), ``metrics``, ``calibration``, ``results``,
  ``writable`` (atomic writes), ``errors`` (user errors in one line), ``multirun``.
- The paper: ``sweep`` (table sweeps), ``report``, ``render``, ``figures``, ``claims``; ``bench`` (costs).

The names below are imported on first use, so ``import sve`` itself loads no torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "SVE": "sve.methods", "SVF": "sve.methods", "Single": "sve.methods", "EnsembleMethod": "sve.methods",
    "LoRAEnsemble": "sve.methods", "DeepEnsemble": "sve.methods", "MCDropout": "sve.methods",
    "BatchEnsemble": "sve.methods", "EnsembleModule": "sve.module", "SVLinear": "sve.layers.sv_linear",
    "SVConv2d": "sve.layers.sv_conv", "run": "sve.run", "build": "sve.run", "InputError": "sve.errors",
}  # fmt: skip
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sve' has no attribute {name!r}")
