"""Sharded training for real: ``trainer=fsdp_sim`` (FSDP2 over 2 CPU processes, gloo) trains a full fine-tune
and SVE to the predictions of one process, with checkpoints written along the way (sve/training/sharding.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from sve.runs.run import run
from sve.training.sharding import repeated_blocks
from tests.conftest import compose_cfg
from tests.training.test_ddp import ddp_runs, overrides

# A full fine-tune (every weight sharded, with its gradient and AdamW moments), SVE (frozen U, V beside
# trainable singular values in one unit) and a full-fine-tune deep ensemble trained in rounds (each round a
# fit of its own, starting from the whole pretrained weights cut to the shards; the stored members made
# whole after training). A LoRA deep ensemble is refused, naming the trainers that hold it.
METHODS = [
    ["method=single"],
    ["method=sve"],
    ["method=deep_ensemble", "method.mode=sequential"],
    ["method=deep_ensemble_lora"],
]


def test_fsdp_sim_trains_as_one_process(tmp_path):
    runs = [overrides(m[0].split("=")[1], "fsdp_sim") + m[1:] for m in METHODS]
    results = ddp_runs(tmp_path / "fsdp", runs)
    assert "trainer=gpu or trainer=ddp" in results[-1], results[-1]
    for i, (method, result) in enumerate(zip(METHODS[:-1], results)):
        assert isinstance(result, dict), f"{method} under FSDP: {result}"
        assert result["hardware"]["devices"] == 2 and result["metrics"]["test/examples"] == 21
        alone = tmp_path / "alone" / str(i)
        run(compose_cfg(overrides(method[0].split("=")[1], "cpu") + method[1:], alone))
        sharded = np.load(tmp_path / "fsdp" / str(i) / "predictions" / "test.npz")
        single = np.load(alone / "predictions" / "test.npz")
        assert sharded["index"].tolist() == list(range(21))
        # Gradients reduced in shards, in another order than one process's sums: 3.6e-7 measured here.
        np.testing.assert_allclose(
            sharded["member_logits"], single["member_logits"], rtol=1e-5, atol=1e-5, err_msg=str(method)
        )
        assert (tmp_path / "fsdp" / str(i) / "checkpoints" / "final.ckpt").is_file()


@pytest.mark.parametrize(
    ("method", "after"), [(["method=single"], 3), (["method=deep_ensemble", "method.mode=sequential"], 8)]
)
def test_a_sharded_run_resumes_after_a_crash_as_if_uninterrupted(tmp_path, method, after):
    # Both ranks crash after their 3rd batch (the last of epoch 1, after the step-2 checkpoint; a deep
    # ensemble: the 8th, in its second round, with the first member stored): the rerun in the same directory
    # loads each rank's shards, the gathered AdamW state, the RNG states and the data position, and ends where
    # the uninterrupted run ends, to the last digit.
    import shlex
    import subprocess
    import sys

    from tests.conftest import ROOT

    base = overrides(method[0].split("=")[1], "fsdp_sim") + method[1:]
    crash = [
        "+callbacks.crash._target_=tests.helpers.Crash",
        f"+callbacks.crash.after_batches={after}",
        "+callbacks.crash.per_rank=true",
        f"+callbacks.crash.marker={tmp_path / 'crashed'}",
    ]
    crashing = f"@crashed {shlex.join(base + crash)}"
    runs = [f"@whole {shlex.join(base)}", crashing, crashing]  # the second is the resume
    done = subprocess.run(
        [sys.executable, "-m", "tests.ddp_runner", str(tmp_path / "fsdp"), *runs],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "fsdp"
    assert all((tmp_path / f"crashed.{rank}").exists() for rank in (0, 1))  # both ranks did crash, once
    resumed = json.loads((out / "crashed" / "results.json").read_text())
    whole = json.loads((out / "whole" / "results.json").read_text())
    assert resumed["resumed_from"] is not None and whole["resumed_from"] is None
    drop = lambda r: {k: v for k, v in r["metrics"].items() if k != "test/seconds"}  # noqa: E731
    assert drop(resumed) == drop(whole)
    a, b = (np.load(out / d / "predictions" / "test.npz")["member_logits"] for d in ("whole", "crashed"))
    np.testing.assert_array_equal(a, b)


def test_the_units_are_the_repeated_blocks_of_any_model():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

    model = nn.Module()
    model.stem = nn.ModuleList([nn.Linear(4, 4), nn.ReLU()])  # mixed classes: not a stack of blocks
    model.layers = nn.ModuleList([Block() for _ in range(3)])
    model.pair = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])  # shorter than the layers
    assert repeated_blocks(model) == {Block}
    assert repeated_blocks(nn.Sequential(nn.Linear(2, 2))) == set()


@pytest.mark.parametrize("trainer", ["fsdp", "fsdp_sim"])
def test_the_fsdp_configs_build_the_sharded_strategy(trainer):
    from hydra.utils import instantiate

    from sve.training.sharding import ShardedStrategy

    cfg = compose_cfg([f"trainer={trainer}"])
    strategy = instantiate(cfg.trainer.strategy)
    assert isinstance(strategy, ShardedStrategy) and not strategy._save_distributed_checkpoint
    assert torch.distributed.is_available()
