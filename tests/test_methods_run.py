"""Every method config through ``run()`` (trainer=debug, tiny_bert, synthetic_text): no config can rot.
The list comes from configs/method, so a new method is run here without an edit."""

from __future__ import annotations

import json

import pytest

from sve.run import run
from tests.conftest import compose_cfg, config_options

BASELINES = config_options("method")

FAST = ["backbone=tiny_bert", "dataset=synthetic_text", "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1", "ensemble_size=2"]


@pytest.mark.parametrize("method", BASELINES)
def test_every_baseline_config_runs(method, tmp_path):
    extra = ["method.marglik_steps=3"] if method.startswith("bayes_lora") else []
    results = run(compose_cfg([f"method={method}", *FAST, *extra], tmp_path))
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["method"] == method and 0 <= written["metrics"]["test/acc"] <= 100
    assert results["parameters"]["trainable"] > 0
    report = written["method_report"]
    if method == "deep_ensemble":
        assert report["mode"] == "in_memory"  # CPU: M copies fit
    if method in ("mc_dropout", "blob", "bayes_lora_llla", "bayes_lora_la"):
        assert report["num_samples"] == 10 and results["num_members"] == 10
    if method.startswith("bayes_lora"):
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
