"""SVE: Singular Value Ensembles for pretrained models, and every baseline of the paper behind one interface.

Package map, by role, top to bottom: a module imports only from its own layer and the layers below it
(``tests/test_imports.py`` checks every import, function bodies included; ``docs/architecture.md`` has the
flow of a run).

- ``cli``: the console entry points, every ``main()`` and argument parser.
- ``paper``: ``sweep`` (table sweeps; its parts ``sweep_jobs``, ``sweep_runs``, ``sweep_tuning``,
  ``sittings``) with ``tuning`` (grids grown to an interior optimum), ``store`` (table definitions, run
  directories, the runs of a store), ``display`` (metric names, directions and digits, method labels),
  ``report`` (a table's cells), ``build`` (writes the tables and figures), ``render``, ``figures``, ``claims``
  (verdicts) with ``evidence`` (what they read), ``claims_text`` (their markdown), ``bootstrap`` (paired
  intervals), ``coverage``, ``movement``; ``budget``, ``plan_tables`` (every row's memory plan); ``open_answers``
  (the open-ended ARC table and its verdicts). ``bench``,
  beside it: memory and FLOP counters (``counters``), the cost benchmark (``benchmark``, with ``settings``, its
  parts ``ensemble``, ``table5``, ``front``, ``layer_costs`` and its table ``markdown``) and the GPU check
  (``gpu_check``, ``make gpu-check``).
- ``runs``: ``run`` (one run end to end), ``validate`` (config checks), ``probe``, ``rundir`` (directories,
  locks, the config a directory started with), ``evaluation`` (scoring a trained module) and ``reevaluate`` (a
  finished run scored again) with ``eval_config`` (the config a finished run is evaluated with),
  ``prediction_files`` (the per-set files an evaluation writes), ``open_answers`` (a run's written answers to
  multiple-choice questions asked without their options, judged against them), ``plan`` with ``layout``,
  ``live_memory``, ``architectures`` and ``plan_report`` (the memory plan), ``results``, ``multirun``,
  ``writable`` (atomic writes), ``resolvers``.
- ``api``: the library API: ``wrap`` (any method on the user's own ``nn.Module``), ``Ensemble`` (member logits,
  ``predict``, ``save_pretrained``/``from_pretrained``), ``options`` (a method's settings and learning rates
  from its config), ``starts`` (one new head for every member, warned about), ``batches`` (the user's inputs
  as batches), ``calibration`` (the fitted temperature), ``export`` (a member as a plain model),
  ``adapter_files`` (their format), ``hf_trainer`` (training with ``transformers.Trainer``), ``generation``
  (``Ensemble.generate``, and a run's LM writing), ``conformal`` (prediction sets).
- ``training``: ``module`` (the one LightningModule), ``optim``, ``checkpoint`` (exact resume), ``sharding``,
  ``curves`` (learning curves), ``allocator``, ``loggers``.
- ``methods``: one class per method of the paper behind one interface, returning member logits in the
  (M, B, C) layout of ``members`` (which also forms the predictive); ``heads`` (one head per member);
  ``kinds`` (sampled, snapshot and fitted-after-training methods, as base classes); ``registry`` (every
  method option, its class and the facts the class states).
- ``backbones``: timm (ViTs and CNNs), Hugging Face encoders and causal LMs, CIFAR ResNets, choice LMs.
- ``layers``: the member layers (SV, LoRA, BatchEnsemble, BLoB; SV inference paths), ``inject`` (wraps a
  backbone's target layers), ``shared_inputs``, ``svd_cache``, ``singular_values`` (Figs. 4-6 files),
  ``draws`` (random draws independent of the device layout), ``recompute`` (activation checkpointing that
  replays them).
- ``metrics``: accuracy, ECE, NLL, Brier, OOD scores, temperature scaling (torchmetrics), ``collapse``
  (collapsed members), ``selective`` (the risk-coverage curve, AURC), ``plots`` (the reliability diagram,
  metrics against the shift's severity). ``data``, beside it: data modules (the user's own:
  ``image_folder``, ``text_table``, sharing ``user_data``), their up-front checks, samplers, the corruption
  generator.
- At the bottom, used by every role: ``members`` (the member-logit layout), ``paths`` (where things are read
  and written, the config resolvers for them), ``errors`` (user errors in one line), ``memory`` (a device's
  free memory), ``distributed`` (a whole state loaded into a sharded module), ``offline``. ``configs``: the
  Hydra config groups (package data).

The names below are imported on first use, so ``import sve`` itself loads no torch. Modules that moved into
the subpackages stay importable under their old names (``sve.checkpoint`` is ``sve.training.checkpoint``)
until ``MOVED_UNTIL``, with a ``FutureWarning`` naming the new module; the ``_target_``s of a results.json
written before the move are renamed when it is read (``sve.runs.results.migrate``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"

_METHODS = (  # every method class (sve.methods), one per method of the paper or beyond it
    "EnsembleMethod",
    "SVE",
    "SVF",
    "SVETop",
    "SVELoRA",
    "Single",
    "SingleLoRA",
    "LoRAEnsemble",
    "DeepEnsemble",
    "DeepEnsembleLoRA",
    "MCDropout",
    "MCDropoutLoRA",
    "BatchEnsemble",
    "CheckpointEnsemble",
    "LastLayerEnsemble",
    "BayesLoRA",
    "BayesLoRALA",
    "BayesLoRALLLA",
    "BLoB",
)
_EXPORTS = {
    **dict.fromkeys(_METHODS, "sve.methods"),
    "EnsembleModule": "sve.training.module",
    "SVLinear": "sve.layers.sv_linear",
    "SVConv": "sve.layers.sv_conv",
    "run": "sve.runs.run",
    "build": "sve.runs.run",
    "InputError": "sve.errors",
    "uncertainty": "sve.metrics.scores",
    "Prediction": "sve.metrics.scores",
    "wrap": "sve.api",
    "from_pretrained": "sve.api",
    "Ensemble": "sve.api",
    "ModuleBackbone": "sve.api",
}
_OLD_NAMES = {"SVConv2d": "sve.layers.sv_conv"}  # still importable, not listed: SVConv took 1-D and 3-D kernels
__all__ = ["__version__", *_EXPORTS]

MOVED = {
    "sve.inject": "sve.layers.inject",
    "sve.shared_inputs": "sve.layers.shared_inputs",
    "sve.svd_cache": "sve.layers.svd_cache",
    "sve.singular_values": "sve.layers.singular_values",
    "sve.module": "sve.training.module",
    "sve.optim": "sve.training.optim",
    "sve.checkpoint": "sve.training.checkpoint",
    "sve.draws": "sve.layers.draws",
    "sve.allocator": "sve.training.allocator",
    "sve.loggers": "sve.training.loggers",
    "sve.curves": "sve.training.curves",
    "sve.run": "sve.runs.run",
    "sve.rundir": "sve.runs.rundir",
    "sve.validate": "sve.runs.validate",
    "sve.evaluation": "sve.runs.evaluation",
    "sve.evaluate": "sve.runs.reevaluate",
    "sve.results": "sve.runs.results",
    "sve.multirun": "sve.runs.multirun",
    "sve.writable": "sve.runs.writable",
    "sve.resolvers": "sve.runs.resolvers",
    "sve.calibration": "sve.metrics.calibration",
    "sve.sweep": "sve.paper.sweep",
    "sve.tuning": "sve.paper.tuning",
    "sve.report": "sve.paper.report",
    "sve.render": "sve.paper.render",
    "sve.figures": "sve.paper.figures",
    "sve.claims": "sve.paper.claims",
    "sve.budget": "sve.paper.budget",
    "sve.bootstrap": "sve.paper.bootstrap",
    "sve.benchmark": "sve.bench.benchmark",
    # moved so that imports run down the package map
    "sve.training.draws": "sve.layers.draws",
    "sve.training.recompute": "sve.layers.recompute",
    # renamed: beside sve.runs.evaluation, the name did not say that it scores a finished run again
    "sve.runs.evaluate": "sve.runs.reevaluate",
    # renamed: beside sve.methods.registry and sve.training.checkpoint, the names read as another registry and
    # checkpoint code
    "sve.paper.registry": "sve.paper.display",
    "sve.methods.checkpoint": "sve.methods.checkpoint_ensemble",
}
MOVED_UNTIL = "0.2.0"  # the next minor release after __version__ removes the old names of MOVED
_warned: set[str] = set()  # old names this process has warned about (each once)


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import sve.<old name>`` gives the module at its new place, the same object (classes keep their
    identity, a test's monkeypatch reaches the code that runs)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        if spec.name not in _warned:
            _warned.add(spec.name)
            # FutureWarning, not DeprecationWarning: Python hides the latter outside __main__, and the users of
            # an old name are scripts and configs, not the code that imports it.
            warnings.warn(
                f"{spec.name} is now {MOVED[spec.name]}; the old name goes in sve {MOVED_UNTIL}: import "
                f"{MOVED[spec.name]} (or set _target_ to it)",
                FutureWarning,
                stacklevel=2,
            )
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module) -> None:
        pass  # already executed under its new name


# A finder, not an argument (docs/architecture.md#global-state): the old names come in import statements and in
# ``_target_`` strings of users' configs and checkpoints, resolved by Python's import system, which only a finder
# (or a ``sys.modules`` entry, which would import every moved module, torch with them, at ``import sve``) reaches.
if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())


def __getattr__(name: str):
    if name in _EXPORTS or name in _OLD_NAMES:
        return getattr(importlib.import_module({**_EXPORTS, **_OLD_NAMES}[name]), name)
    raise AttributeError(f"module 'sve' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public surface the architecture page lists (exports and ``__version__``), not the import machinery."""
    return sorted(__all__)
