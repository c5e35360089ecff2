"""Integration with ../shared: the CIFAR ResNet checkpoints on the CIFAR-10 JPEG test set, and the
CPU-sized training runs of the issue (skipped with a reason when the shared data is absent)."""

import tarfile
from pathlib import Path

import pytest
import torch

from sve.backbones.resnet_cifar import ResNetCIFAR, ResNetCIFARBackbone, load_checkpoint
from sve.data import CIFAR10Data
from sve.paths import cache_root
from sve.runs.run import run
from tests.conftest import compose_cfg, installed, shared_path

CHECKPOINTS = {
    20: "resnet20-12fca82f.th",
    32: "resnet32-d509ac18.th",
    44: "resnet44-014dd654.th",
    56: "resnet56-4bfd9763.th",
}


@pytest.fixture(scope="session")
def cifar10_tree(tmp_path_factory) -> Path:
    """The JPEG CIFAR-10 as an ImageFolder tree: the user's unpacked cache if complete, else unpacked here."""
    archive = shared_path("data", "cifar10_jpg.tar.gz")
    cache = cache_root("data", "cifar10_jpg")  # make mini-data
    if all(len(list((cache / "test").glob(f"{c}/*.jpg"))) == 1000 for c in ("airplane", "truck")):
        return cache
    out = tmp_path_factory.mktemp("cifar10_jpg")
    with tarfile.open(archive) as tar:
        tar.extractall(out, filter="data")
    return out


@pytest.mark.parametrize("depth", sorted(CHECKPOINTS))
def test_checkpoint_keys_match_the_architecture(depth):
    path = shared_path("models", "resnet_cifar10", CHECKPOINTS[depth])
    load_checkpoint(ResNetCIFAR(depth), path)  # strict: every key and shape matches


def _accuracy(depth: int, root: Path, n: int) -> float:
    path = shared_path("models", "resnet_cifar10", CHECKPOINTS[depth])
    backbone = ResNetCIFARBackbone(depth, ["conv1", "conv2"], str(path)).eval()
    data = CIFAR10Data(root=str(root), test_size=n, eval_batch_size=250)
    data.attach(backbone)
    correct = 0
    with torch.no_grad():
        for batch in data.test_dataloader():
            correct += (backbone.model.linear(backbone(batch)).argmax(-1) == batch["labels"]).sum().item()
    return correct / n


@pytest.mark.slow  # real weights over 1,000 real test images (27 s); make test-slow
def test_resnet20_reproduces_its_cifar10_accuracy(cifar10_tree):
    """README of ../shared: 81.0% on the full JPEG test set; a seeded 500-image subset lands near it."""
    assert 0.75 <= _accuracy(20, cifar10_tree, 500) <= 0.88


@pytest.mark.slow
def test_resnet56_reproduces_its_cifar10_accuracy(cifar10_tree):
    assert 0.78 <= _accuracy(56, cifar10_tree, 2000) <= 0.89  # 83.2% on all 10,000


@pytest.mark.slow
def test_sve_resnet20_cifar10_cpu_run(cifar10_tree, tmp_path):
    cfg = compose_cfg(
        [
            "method=sve",
            "backbone=resnet20_cifar",
            "dataset=cifar10",
            f"dataset.root={cifar10_tree}",
            f"backbone.checkpoint_path={shared_path('models', 'resnet_cifar10', CHECKPOINTS[20])}",
            "dataset.train_size=64",
            "dataset.val_size=32",
            "dataset.test_size=200",
            "dataset.num_workers=0",
            "ensemble_size=2",
        ],
        tmp_path,
    )
    results = run(cfg)
    assert results["metrics"]["test/acc"] > 0.6  # the checkpoint's head initialises every member


@pytest.mark.slow
def test_sve_smollm2_arc_easy_cpu_run(tmp_path):
    installed("smollm2_135m", "config.json")
    root = shared_path("data", "arc_easy")
    cfg = compose_cfg(
        [
            "method=sve",
            "backbone=smollm2_135m",
            "dataset=arc_easy",
            f"dataset.root={root}",
            "backbone.target_modules=['layers\\.29\\.self_attn\\.(q|v)_proj']",
            "dataset.train_size=4",
            "dataset.val_size=4",
            "dataset.test_size=8",
            "dataset.batch_size=2",
            "ensemble_size=2",
        ],
        tmp_path,
    )
    results = run(cfg)
    assert 0 <= results["metrics"]["test/acc"] <= 1
