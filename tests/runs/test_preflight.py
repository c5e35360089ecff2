"""The pre-torch source check (``sve.runs.preflight``): offline, a run that would download answers at once,
naming every missing source and its key; anything on disk, or a network that answers, lets the run go on."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sve.errors import InputError, OfflineError
from sve.runs import preflight
from tests.conftest import ROOT


@pytest.fixture
def caches(monkeypatch, tmp_path):
    """Empty Hub, datasets, torch and data caches under tmp_path, and no network."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the project's cache: xdg/sve
    monkeypatch.setattr(preflight, "hub_reachable", lambda: False)
    monkeypatch.setattr(preflight, "network_reachable", lambda: False)
    return tmp_path


def config(backbone=None, dataset=None):
    return OmegaConf.create({k: v for k, v in (("backbone", backbone), ("dataset", dataset)) if v is not None})


TIMM = {"name": "dino_vits16", "model_name": "vit_small_patch16_224.dino", "pretrained": True, "checkpoint_path": None}
FLOWERS = {"name": "flowers102", "root": None, "download": True}


def test_offline_every_missing_source_is_named_in_one_error(caches):
    hf = {"name": "bert_base", "name_or_path": "bert-base-uncased", "tokenizer": None}
    with pytest.raises(OfflineError) as err:
        preflight.check_sources(config(hf, {"name": "sst2", "root": None, "hub_name": "glue"}))
    message = str(err.value)
    assert "the Hub model bert-base-uncased" in message and "backbone.name_or_path=" in message
    assert "the Hub dataset glue" in message and "dataset.root=" in message
    with pytest.raises(
        OfflineError,
        match=r"timm's pretrained weights of vit_small_patch16_224.dino.*"
        r"backbone.pretrained=false.*dataset flowers102 needs a download",
    ):
        preflight.check_sources(config(TIMM, FLOWERS))


def test_what_is_on_disk_is_not_named(caches):
    hub, data = caches / "hf" / "hub", caches / "xdg" / "sve" / "data"
    (hub / "models--timm--vit_small_patch16_224.dino" / "snapshots" / "abc").mkdir(parents=True)
    (data / "flowers102" / "flowers-102").mkdir(parents=True)
    with pytest.raises(OfflineError, match="flowers102"):  # empty folders (a failed download) are not data
        preflight.check_sources(config(TIMM, FLOWERS))
    (data / "flowers102" / "flowers-102" / "setid.mat").write_bytes(b"")
    preflight.check_sources(config(TIMM, FLOWERS))  # the data module decides what else is missing
    local = {**FLOWERS, "root": str(data / "flowers102")}
    preflight.check_sources(config({**TIMM, "pretrained": False}, local))


def test_an_untagged_timm_name_matches_any_cached_tag_and_torch_hub_files_count(caches):
    untagged = {**TIMM, "model_name": "vit_small_patch16_224"}
    with pytest.raises(OfflineError):
        preflight.check_sources(config(untagged))
    (caches / "hf" / "hub" / "models--timm--vit_small_patch16_224.augreg_in21k").mkdir(parents=True)
    preflight.check_sources(config(untagged))
    other = {**TIMM, "model_name": "resnet18"}
    with pytest.raises(OfflineError):
        preflight.check_sources(config(other))
    (caches / "torch" / "hub" / "checkpoints").mkdir(parents=True)
    (caches / "torch" / "hub" / "checkpoints" / "resnet18-5c106cde.pth").write_bytes(b"")
    preflight.check_sources(config(other))  # cannot be told apart without timm: left to the loader


def test_hub_datasets_are_found_under_either_cache_spelling(caches):
    arc = {"name": "arc_easy", "root": None, "hub_name": "allenai/ai2_arc"}
    with pytest.raises(OfflineError, match="allenai/ai2_arc"):
        preflight.check_sources(config(dataset=arc))
    (caches / "hf" / "datasets" / "allenai___ai2_arc").mkdir(parents=True)
    preflight.check_sources(config(dataset=arc))
    glue = {"name": "sst2", "root": None, "hub_name": "glue"}
    (caches / "hf" / "hub" / "datasets--nyu-mll--glue").mkdir(parents=True)
    preflight.check_sources(config(dataset=glue))


def test_a_reachable_network_lets_downloads_happen(caches, monkeypatch):
    monkeypatch.setattr(preflight, "hub_reachable", lambda: True)
    with pytest.raises(OfflineError, match="flowers102") as err:  # the Hub answers; the data host may not
        preflight.check_sources(config(TIMM, FLOWERS))
    assert "timm" not in str(err.value)
    monkeypatch.setattr(preflight, "network_reachable", lambda: True)
    preflight.check_sources(config(TIMM, FLOWERS))


def test_certain_local_errors_need_no_network_probe(caches, monkeypatch):
    monkeypatch.setattr(preflight, "hub_reachable", lambda: pytest.fail("asked the network"))
    with pytest.raises(InputError, match=r"backbone.name_or_path=~/nowhere holds no config.json"):
        preflight.check_sources(config({"name": "x", "name_or_path": "~/nowhere"}))
    with pytest.raises(InputError, match=r"dataset.download=false"):
        preflight.check_sources(config(dataset={**FLOWERS, "download": False}))


def test_the_offline_headline_answers_before_torch_is_imported(tmp_path):
    """``train.py method=sve dataset=flowers102`` with nothing cached and no network: one error line, no
    traceback, and torch never imported (so it takes about a second, not the ~10 s of importing it and
    Lightning and timm)."""
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "HF_HOME": str(tmp_path / "hf"),
        "TORCH_HOME": str(tmp_path / "t"),
        "HF_ENDPOINT": "http://127.0.0.1:9",
    }  # port 9 refuses at once: no network
    env.pop("HF_HUB_CACHE", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            str(ROOT / "train.py"),
            "method=sve",
            "dataset=flowers102",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(errors) == 1 and "Traceback" not in proc.stderr
    assert "backbone.checkpoint_path=" in errors[0] and "dataset.root=" in errors[0]
    assert "torch" not in imported and "pytorch_lightning" not in imported


def test_a_missing_checkpoint_file_is_one_error_naming_the_key_unless_unused(caches, monkeypatch):
    monkeypatch.setattr(preflight, "hub_reachable", lambda: pytest.fail("asked the network"))
    resnet = {"name": "resnet20_cifar", "pretrained": True, "checkpoint_path": "~/nowhere/resnet20.th"}
    with pytest.raises(
        InputError,
        match=r"^backbone resnet20_cifar: backbone.checkpoint_path=~/nowhere/resnet20.th: "
        rf"no file at {Path.home()}/nowhere/resnet20.th; set backbone.checkpoint_path="
        r"<a weights file>, or backbone.pretrained=false$",
    ):
        preflight.check_sources(config(resnet))
    preflight.check_sources(config({**resnet, "pretrained": False}))  # not read: no error
    preflight.check_sources(config({**resnet, "checkpoint_path": "pkg://some_package/w.pth"}))  # the loader's
