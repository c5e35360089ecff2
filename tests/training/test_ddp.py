"""DDP for real: ``trainer=ddp_sim`` (2 CPU processes over gloo) runs every method, and its test metrics equal
one process's on the same data; every trainable parameter gets a gradient, so DDP cannot stop on one."""

from __future__ import annotations

import json
import math
import shlex
import subprocess
import sys

import numpy as np
import pytest
import torch

from sve.runs.probe import probe
from sve.runs.run import build, run
from tests.conftest import ROOT, compose_cfg, config_options

METHODS = config_options("method")
# 21 test examples: 11 on rank 0, 10 on rank 1 plus one padding example that must not be counted.
# Two epochs of 3 steps with the default callbacks (checkpoints at steps 2 and 4, mid-epoch, and at epoch ends).
DATA = [
    "backbone=tiny_vit",
    "dataset=synthetic_image",
    "ensemble_size=2",
    "trainer.max_epochs=2",
    "callbacks=default",
    "callbacks.checkpoint.every_n_steps=2",
    "dataset.num_train=24",
    "dataset.num_val=8",
    "dataset.num_test=21",
]
# Sampled methods match too: evaluation draws are seeded per batch (the batches are the same on any number of
# processes), and training draws per optimiser step, made for the whole global batch (sve.layers.draws): MC
# dropout's masks and BLoB's per-example weight samples are those of one process.


def overrides(method: str, trainer: str) -> list[str]:
    extra = ["method.marglik_steps=3"] if method.startswith("bayes_lora") else []
    return [f"method={method}", f"trainer={trainer}", *DATA, *extra]


def ddp_runs(tmp_path, runs: list[list[str]]) -> list[dict | str]:
    """Runs the configs in one 2-process group; each result is results.json or the error text."""
    cmd = [sys.executable, "-m", "tests.ddp_runner", str(tmp_path), *(shlex.join(r) for r in runs)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = []
    for i in range(len(runs)):
        results, failed = tmp_path / str(i) / "results.json", tmp_path / str(i) / "failed.json"
        out.append(json.loads(results.read_text()) if results.exists() else json.loads(failed.read_text())["traceback"])
    return out


TEXT = ["backbone=tiny_bert", "dataset=synthetic_text"]


def test_ddp_sim_runs_every_method_and_equals_one_process(tmp_path):
    # One process group for every run (starting one costs more than a tiny run): every method on the ViT, then
    # SVE and full fine-tuning on BERT, whose pooler gets no gradient: the method base freezes it, so full
    # fine-tuning runs under DDP too.
    # Last, SVE on BERT trained one member at a time (members_at_once: 1, sve.training.module.chunked_step):
    # DDP reduces the first member's gradients, which its own backward left aside, with the second's.
    text_methods = ("sve", "single")
    chunked = overrides("sve", "ddp_sim") + TEXT + ["method.members_at_once=1"]
    runs = [overrides(m, "ddp_sim") for m in METHODS] + [overrides(m, "ddp_sim") + TEXT for m in text_methods]
    results = ddp_runs(tmp_path / "ddp", runs + [chunked])
    for method, result in zip(text_methods, results[len(METHODS) :]):
        assert isinstance(result, dict) and result["metrics"]["test/examples"] == 21, (method, result)
    assert isinstance(results[-1], dict), f"members_at_once=1 under DDP: {results[-1]}"
    # ... and trains what all members at once train under DDP (equal to the last digit here). (Text runs are
    # compared with each other, not with one process: a micro-batch pads its sentences to its own longest,
    # so dropout masks, drawn per padded shape, differ from one process's.)
    together, one_by_one = (
        np.load(tmp_path / "ddp" / str(i) / "predictions" / "test.npz")["member_logits"]
        for i in (len(METHODS), len(runs))
    )
    np.testing.assert_allclose(one_by_one, together, rtol=1e-6, atol=1e-7)
    for i, (method, ddp) in enumerate(zip(METHODS, results)):
        assert isinstance(ddp, dict), f"{method} under DDP: {ddp}"
        metrics = ddp["metrics"]
        assert ddp["hardware"]["devices"] == 2 and ddp["hardware"]["per_device_batch_size"] == 4
        assert metrics["test/examples"] == 21, method  # each test example once: no padding duplicates
        assert all(math.isfinite(v) for k, v in metrics.items() if isinstance(v, float)), method
        one_process = run(compose_cfg(overrides(method, "cpu"), tmp_path / "single" / method))
        if method.startswith("bayes_lora"):  # after training, every rank fits the posterior on the whole split
            alone = one_process["method_report"]
            assert ddp["method_report"]["prior_precision"] == pytest.approx(alone["prior_precision"], rel=1e-4)
        # Rank 0 saved both ranks' examples, each once, in dataset order.
        saved = np.load(tmp_path / "ddp" / str(i) / "predictions" / "test.npz")
        assert saved["index"].tolist() == list(range(21)) and saved["member_logits"].shape[1] == 21, method
        single = one_process["metrics"]
        assert single["test/examples"] == 21
        alone = np.load(tmp_path / "single" / method / "predictions" / "test.npz")
        assert saved["labels"].tolist() == alone["labels"].tolist()
        # The Laplace posteriors are solves on curvature sums taken in another order: their logits moved by up
        # to 1.7e-5 between the two layouts on one machine, where every other method stays within 1e-5.
        atol = 5e-5 if method.startswith("bayes_lora") else 1e-5
        np.testing.assert_allclose(saved["member_logits"], alone["member_logits"], rtol=1e-4, atol=atol)
        assert metrics["test/acc"] == single["test/acc"], method
        assert metrics["test/member_acc"] == single["test/member_acc"], method
        for key in ("test/nll", "test/brier", "test/ece"):  # same optimisation; float sums in another order
            assert metrics[key] == pytest.approx(single[key], rel=1e-5, abs=1e-7), (method, key)


@pytest.mark.parametrize("backbone", ["tiny_vit", "tiny_bert", "tiny_llama"])
@pytest.mark.parametrize("method", METHODS)
def test_every_trainable_parameter_gets_a_gradient(method, backbone):
    dataset = "synthetic_image" if backbone == "tiny_vit" else "synthetic_text"
    _, datamodule, _, module = build(
        compose_cfg([f"method={method}", f"backbone={backbone}", f"dataset={dataset}", "ensemble_size=2"])
    )
    datamodule.setup()
    before = {n: p.detach().clone() for n, p in module.state_dict().items() if isinstance(p, torch.Tensor)}
    rng = torch.get_rng_state()
    assert probe(module, datamodule) == []
    # The probe leaves the model and the random state as they were.
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(before[n], p) for n, p in module.state_dict().items() if n in before)
