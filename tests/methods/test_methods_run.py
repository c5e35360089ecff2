"""Every method config through ``run()`` (trainer=debug, tiny_bert, synthetic_text): no config can rot.
The list and each method's member count come from the registry of methods (``sve.methods.registry``), so a
new method is run here without an edit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sve.methods import registry
from sve.runs.run import run
from tests.conftest import compose_cfg

BASELINES = registry.options()
FAST = [
    "backbone=tiny_bert",
    "dataset=synthetic_text",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1",
    "ensemble_size=2",
]


@pytest.mark.parametrize("method", BASELINES)
def test_every_baseline_config_runs(method, tmp_path):
    facts = registry.info(method)
    extra = ["method.marglik_steps=3"] if "marglik_steps" in registry.option_config(method) else []
    if method == "checkpoint_ensemble":  # one epoch-end checkpoint per member
        extra = ["trainer.max_epochs=2", "trainer.limit_train_batches=2"]
    results = run(compose_cfg([f"method={method}", *FAST, *extra], tmp_path))
    assert results["num_members"] == facts.members(2)
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["method"] == method and 0 <= written["metrics"]["test/acc"] <= 100
    assert results["parameters"]["trainable"] > 0
    report = written["method_report"]
    if method == "deep_ensemble":
        assert report["mode"] == "in_memory"  # CPU: M copies fit
    if method == "deep_ensemble_lora":
        assert (report["mode"], report["rounds"]) == ("sequential", 2)  # one run per member
    if facts.sampled:  # the option's samples, not ensemble_size=2
        assert report["num_samples"] == results["num_members"] == 10 and results["ensemble_size"] == 1
    if facts.fits_after_training:  # a Laplace posterior
        assert report["prior_precision"] > 0
    if method in ("sve", "svf"):  # the SVD's one-time cost and the cache's hits and misses
        cache = report["svd_cache"]
        assert cache["hits"] + cache["misses"] == report["wrapped_modules"] and report["svd_seconds"] > 0
        assert report["inference"] == "auto" and report["merged_cache"] is True  # CPU: M copies fit


def test_sequential_deep_ensemble_runs_one_fit_per_member(tmp_path):
    cfg = compose_cfg(["method=deep_ensemble", "method.mode=sequential", *FAST], tmp_path)
    results = run(cfg)
    report = results["method_report"]
    assert (report["mode"], report["chunk_size"], report["rounds"], results["num_members"]) == ("sequential", 1, 2, 2)
    assert len(results["metrics"]["test/member_acc"]) == 2


def test_deep_ensemble_members_from_a_pretrained_head_differ_by_their_own_data_order(tmp_path, monkeypatch):
    # Same start (a pretrained head) and the same batches would give M copies of one model: auto trains the
    # members one round each, each round with its own data order, and they end up different models.
    from sve.backbones.hf import HFBackbone

    def head(self, task, num_classes):
        g = torch.Generator().manual_seed(0)
        return torch.randn(num_classes, self.feature_dim, generator=g), torch.zeros(num_classes)

    monkeypatch.setattr(HFBackbone, "initial_head", head)
    results = run(compose_cfg(["method=deep_ensemble", *FAST, "trainer.limit_test_batches=null"], tmp_path))
    report = results["method_report"]
    assert report["head_init"].startswith("pretrained")
    assert (report["mode"], report["chunk_size"], report["rounds"]) == ("sequential", 1, 2)
    logits = np.load(tmp_path / "predictions" / "test.npz")["member_logits"]  # (M, B, C)
    assert logits.shape[0] == 2 and not np.allclose(logits[0], logits[1], atol=1e-4)
    with pytest.warns(UserWarning, match="stay identical"):
        run(compose_cfg(["method=deep_ensemble", "method.mode=in_memory", *FAST], tmp_path / "in_memory"))
