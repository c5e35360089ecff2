"""Shared test helpers: compose the real configs, shrunk to CPU and a temporary output directory."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

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


def config_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
