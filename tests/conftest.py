"""Shared test helpers: compose the real configs, shrunk to CPU and a temporary output directory."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import sve.runs.resolvers  # noqa: F401 - ${sve_cache:}, ${shared:}, ... before any config is composed
from sve.paths import cache_root

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "sve" / "configs"
SHARED = Path(os.environ.get("SVE_SHARED", ROOT.parent / "shared"))

# Every run the tests start keeps its SVD cache (sve.layers.svd_cache) in a directory of its own, never ~/.cache.
os.environ["SVE_SVD_CACHE"] = tempfile.mkdtemp(prefix="sve-svd-test-")
atexit.register(shutil.rmtree, os.environ["SVE_SVD_CACHE"], ignore_errors=True)


def compose_cfg(overrides: list[str], tmp_path: Path | None = None):
    """The composed training config with test-friendly defaults (debug trainer, no checkpoints)."""
    base = ["trainer=debug", "callbacks=none", "logger=csv"]
    if tmp_path is not None:
        base.append(f"paths.output_dir={tmp_path}")
    else:  # a fresh directory: a finished run's directory would be skipped (skip_finished)
        base.append(f"paths.output_dir={tempfile.mkdtemp(prefix='sve-test-')}")
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=base + list(overrides))


def method_on(cfg, backbone, ensemble_size: int):
    """(the configured method wrapping ``backbone``, the configured datamodule attached to it and set up): the
    steps a run takes between building the backbone and training, for tests that drive a method by hand."""
    from sve.runs.run import instantiate

    datamodule = instantiate(cfg.dataset)
    datamodule.attach(backbone)
    datamodule.setup()
    method = instantiate(cfg.method, backbone=backbone, ensemble_size=ensemble_size, num_classes=datamodule.num_classes)
    return method, datamodule


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or a skip naming what is missing."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"needs {path} (the project's shared data, absent here)")
    return path


def make_targets() -> dict[str, str]:
    """{path in the project's cache: the make target that installs it}, read from the Makefile's help texts
    ("... into $XDG_CACHE_HOME/sve/<path>"), so the Makefile stays the one place that says which target installs
    what."""
    found = re.findall(r"^([\w-]+):.*## .*\$XDG_CACHE_HOME/sve/([\w./-]+)", (ROOT / "Makefile").read_text(), re.M)
    return {path.rstrip("."): target for target, path in found}


def installed(*parts: str) -> Path:
    """A path in the project's cache that a make target installs (MPNet's weights: make mpnet; the CIFAR-10
    JPEGs: make mini-data), or a skip naming the target: a fresh machine has none of them."""
    path = cache_root(*parts)
    if not path.exists():
        relative = "/".join(parts)
        target = next((t for p, t in make_targets().items() if relative == p or relative.startswith(f"{p}/")), None)
        pytest.skip(f"needs {path} ({f'`make {target}` installs it' if target else 'no make target installs it'})")
    return path


def skip_unless_installed(cfg) -> None:
    """Skips, naming the make target, when the config's backbone or dataset reads a path in the project's cache
    that is not there."""
    root = cache_root().resolve()

    def strings(node):
        if isinstance(node, dict):
            return [s for v in node.values() for s in strings(v)]
        if isinstance(node, list):
            return [s for v in node for s in strings(v)]
        return [node] if isinstance(node, str) else []

    for group in ("backbone", "dataset"):
        for value in strings(OmegaConf.to_container(cfg[group], resolve=True)) if group in cfg else []:
            path = Path(value).expanduser().resolve()
            if path.is_relative_to(root):
                installed(*path.relative_to(root).parts)


def config_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _own_run_id():
    """``sve.runs.rundir.run_id`` keeps a process's run id in ``SVE_RUN_ID`` so that its child ranks share it: a
    test that composed a run config in this process must not hand its id to the next test's runs (two runs
    started together then shared one directory)."""
    before = os.environ.get("SVE_RUN_ID")
    yield
    if before is None:
        os.environ.pop("SVE_RUN_ID", None)
    else:
        os.environ["SVE_RUN_ID"] = before
