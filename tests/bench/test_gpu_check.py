"""``sve-bench --gpu-check`` (sve.bench.gpu_check and its parts) on the CPU: the refusal without CUDA, the
tolerances and the report, and every device-independent check run here on device="cpu", each also shown to
fail when what it checks is broken. No GPU figure is produced or committed by these tests."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from sve.bench import gpu_check as G
from sve.bench import gpu_report as R
from sve.bench.gpu_inference import interleaved_ms
from sve.bench.gpu_plan import choose_layers, plan_error, random_factors, train_step
from sve.bench.gpu_ranks import compare_runs
from sve.layers import SVLinear
from sve.runs.resolvers import compose_run

CPU = torch.device("cpu")


def test_without_cuda_it_says_so_in_one_line_exits_0_and_writes_nothing(tmp_path, monkeypatch, capsys):
    import sys

    from sve.cli.bench import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert G.check(list(G.PARTS), tmp_path) == 0
    monkeypatch.setattr(sys, "argv", ["sve-bench", "--gpu-check", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [G.no_cuda_line()] * 2 and "no CUDA GPU" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_relative_error_is_the_worst_element_against_the_reference_scale():
    ref = torch.tensor([[4.0, -2.0], [0.0, 1.0]])
    assert R.relative_error(ref, ref) == 0.0
    assert R.relative_error(ref + torch.tensor([[0.0, 0.0], [0.4, 0.0]]), ref) == pytest.approx(0.1)
    assert R.relative_error(ref.bfloat16(), ref) == 0.0  # compared in float64 whatever the dtype
    assert R.relative_error(ref[:1], ref) == math.inf  # a shape mismatch never passes
    assert R.relative_error(ref * float("nan"), ref) == math.inf
    check = R.error_check("p", "n", {"a": 1e-5, "b": 2e-5}, torch.float32, "layer")
    assert not check.passed and "worst b: 2.00e-05" in check.detail
    assert R.error_check("p", "n", {"a": 1e-5}, "float32", "layer").passed  # at the tolerance: passes
    assert R.error_check("p", "n", {"a": 5e-2}, torch.bfloat16, "model").passed
    assert not R.error_check("p", "n", {"a": 5e-2}, torch.bfloat16, "layer").passed


def test_members_equal_their_merged_layers_on_the_cpu_and_a_wrong_merge_is_caught(monkeypatch):
    checks = G.members_equal_merged(CPU, dtypes=(torch.float32, torch.bfloat16))
    assert len(checks) == 4 and all(c.passed for c in checks), [c.detail for c in checks]
    float32 = [c for c in checks if c.values["dtype"] == "float32"]
    assert all(max(c.values["errors"].values()) < 1e-5 for c in float32)
    assert {k.split(",")[0] for k in checks[0].values["errors"]} == {"factored", "cached", "merged"}
    original = SVLinear.member_weight
    monkeypatch.setattr(SVLinear, "member_weight", lambda self, m: original(self, m) * 1.001)  # merge() reads it
    broken = G.members_equal_merged(CPU, dtypes=(torch.float32,))
    assert not broken[0].passed and broken[0].name.startswith("linear")


def test_singular_values_stay_nonnegative_and_the_check_sees_a_missing_projection(monkeypatch):
    checks = G.singular_values_stay_nonnegative(CPU, dtypes=(torch.float32, torch.bfloat16))
    assert all(c.passed and c.values["zeros"] > 0 for c in checks), [c.detail for c in checks]
    monkeypatch.setattr(SVLinear, "constrain_", lambda self: None)
    broken = G.singular_values_stay_nonnegative(CPU, dtypes=(torch.float32,), steps=1)
    assert not broken[0].passed and broken[0].values["min"] < 0


def _method_run(path, lowest_s=0.0, precision="bf16-mixed"):
    """The files a finished tiny run leaves that the methods part reads (hand-made, as a run writes them)."""
    (path / "predictions").mkdir(parents=True)
    np.savez(path / "predictions" / "test.npz", member_logits=np.zeros((2, 4, 3), np.float32))
    np.savez(
        path / "singular_values.npz",
        **{"l.pretrained": np.ones(3, np.float32), "l.members": np.array([[1.0, 0.5, lowest_s]] * 2, np.float32)},
    )
    return {"metrics": {"test/acc": 50.0, "test/nll": 0.7}, "num_members": 2, "hardware": {"precision": precision}}


def test_a_method_run_is_judged_from_its_files(tmp_path):
    results = _method_run(tmp_path / "ok")
    assert G.judge_run(results, tmp_path / "ok", "bf16-mixed", {"scaler": False, "scale": None}) == (
        True,
        "test/acc 50.0, 2 members, min s 0",
    )
    results = _method_run(tmp_path / "negative", lowest_s=-1e-3)
    passed, detail = G.judge_run(results, tmp_path / "negative", "bf16-mixed", {"scaler": False, "scale": None})
    assert not passed and "a singular value is -0.001 < 0" in detail
    results = _method_run(tmp_path / "fp16", precision="16-mixed")
    passed, detail = G.judge_run(results, tmp_path / "fp16", "16-mixed", {"scaler": False, "scale": None})
    assert not passed and "GradScaler absent" in detail
    assert G.judge_run(results, tmp_path / "fp16", "16-mixed", {"scaler": True, "scale": 1024.0})[0]
    results["metrics"]["test/nll"] = float("nan")
    passed, detail = G.judge_run(results, tmp_path / "fp16", "16-mixed", {"scaler": True, "scale": float("inf")})
    assert not passed and "non-finite metrics test/nll" in detail and "loss scale inf" in detail


@pytest.mark.slow
def test_one_method_run_on_the_cpu_passes_the_methods_part(tmp_path):
    # The methods part as on a GPU, here under trainer=cpu with bf16-mixed (autocast on the CPU; no scaler).
    checks = G.methods_part(
        CPU, tmp_path, methods=["sve"], backbones=("tiny_bert",), precisions=("bf16-mixed",), trainer="cpu"
    )
    assert len(checks) == 1 and checks[0].passed and "min s" in checks[0].detail, checks[0].detail


@pytest.mark.parametrize("method", ["checkpoint_ensemble", "bayes_lora_la"])
def test_the_gpu_run_overrides_compose(method, tmp_path):
    cfg = compose_run(G.method_overrides(method, "tiny_vit", "16-mixed", tmp_path))
    assert cfg.trainer.accelerator == "gpu" and cfg.trainer.precision == "16-mixed"
    assert cfg.trainer.limit_test_batches == 1 and list(cfg.callbacks) == ["precision_probe"]


def test_interleaved_rounds_alternate_the_order_after_the_warm_up():
    calls = []
    steps = {n: (lambda n=n: calls.append(n)) for n in "ab"}
    ticks = iter(range(100))
    times = interleaved_ms(steps, repeats=3, warmup=1, clock=lambda step: (step(), next(ticks))[1])
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert times == {"a": [0, 3, 4], "b": [1, 2, 5]}


def test_the_plan_depth_is_the_largest_that_fits_and_errors_are_relative_to_the_measured():
    peak = {32: 30, 24: 23, 16: 16, 8: 9, 4: 5, 2: 3}
    assert choose_layers(peak.get, capacity=25) == 16  # 23 > 0.9 * 25
    assert choose_layers(peak.get, capacity=40) == 32
    assert choose_layers(peak.get, capacity=3) is None
    assert plan_error(110, 100) == pytest.approx(10.0) and plan_error(90, 100) == pytest.approx(-10.0)


def test_the_measured_step_trains_each_chunk_with_random_factors():
    from sve.layers import sv_linear
    from sve.runs.run import build
    from tests.conftest import compose_cfg

    original = sv_linear.decompose_with_source
    cfg = compose_cfg(
        [
            "backbone=tiny_llama",
            "dataset=synthetic_text",
            "method=sve",
            "ensemble_size=2",
            "method.members_at_once=1",
            "method.svd_cache=null",
        ]
    )
    with random_factors():
        _, datamodule, method, _ = build(cfg)
    assert sv_linear.decompose_with_source is original  # restored
    layer = method.sv_layers()[0]
    assert layer.factor_sources == {} and layer.U.shape == (layer.out_features, layer.rank)
    datamodule.setup()
    batch = next(iter(datamodule.train_dataloader()))
    before = layer.singular_values.detach().clone()
    optimizer = torch.optim.AdamW(method.trainable_parameters(), lr=1e-2)
    train_step(method, batch, optimizer, torch.bfloat16, clip=1.0)
    moved = (layer.singular_values.detach() != before).any(dim=1)
    assert moved.tolist() == [True, True]  # both chunks (one member each) trained
    assert all(p.grad is None for p in method.trainable_parameters())


def _run_dir(path, logits, acc=50.0, devices=2, index=range(21)):
    path.mkdir(parents=True)
    metrics = {
        "test/examples": 21,
        "test/acc": acc,
        "test/member_acc": [acc],
        "test/nll": 0.7,
        "test/brier": 0.5,
        "test/ece": 0.1,
    }
    (path / "results.json").write_text(json.dumps({"metrics": metrics, "hardware": {"devices": devices}}))
    (path / "predictions").mkdir()
    np.savez(path / "predictions" / "test.npz", member_logits=logits, index=np.array(list(index)))


def test_distributed_runs_are_compared_by_the_cpu_tests_criteria(tmp_path):
    logits = np.random.default_rng(0).normal(size=(2, 21, 3)).astype(np.float32)
    _run_dir(tmp_path / "alone", logits, devices=1)
    _run_dir(tmp_path / "same", logits + 5e-6)
    _run_dir(tmp_path / "off", logits + 1e-3)
    _run_dir(tmp_path / "acc", logits, acc=55.0)
    rtol, atol = R.DISTRIBUTED_CRITERIA["ddp"]
    assert compare_runs(tmp_path / "same", tmp_path / "alone", rtol, atol, metrics=True)[0]
    passed, detail = compare_runs(tmp_path / "off", tmp_path / "alone", rtol, atol, metrics=True)
    assert not passed and "member logits differ" in detail
    passed, detail = compare_runs(tmp_path / "acc", tmp_path / "alone", rtol, atol, metrics=True)
    assert not passed and "test/acc 55.0 != 50.0" in detail
    assert compare_runs(tmp_path / "acc", tmp_path / "alone", rtol, atol, metrics=False)[0]  # FSDP: logits only
    (tmp_path / "failed").mkdir()
    (tmp_path / "failed" / "failed.json").write_text(json.dumps({"traceback": "Traceback\nValueError: nccl"}))
    passed, detail = compare_runs(tmp_path / "failed", tmp_path / "alone", rtol, atol, metrics=True)
    assert not passed and "ValueError: nccl" in detail


def test_the_report_states_the_device_and_every_outcome(tmp_path):
    # A hand-made outcome (no GPU ran): the writer's format, not a result.
    header = {
        "devices": ["Example GPU", "Example GPU"],
        "memory_gib": [24.0, 24.0],
        "driver": "000.00",
        "torch": "2.x",
        "cuda": "12.x",
        "cudnn": 90000,
        "command": "sve-bench --gpu-check",
        "git_commit": "abc1234",
        "versions": {},
    }
    checks = [
        R.Check("members", "layer ok", True, "worst 1e-7"),
        R.Check("plan", "peak | within", False, "planned 2 GiB", {"error": math.inf}),
        R.Check("distributed", "DDP", None, "needs 2 or more GPUs"),
    ]
    tables = {
        "latency": [
            {
                "candidate": "sve",
                "precision": "float32",
                "batch": 1,
                "ms": 1.234,
                "ratio_to_single": 1.5,
                "ratio_to_lora_ensemble": 0.9,
                "peak_mib": 512.4,
            }
        ],
        "latency_note": "note",
        "plan": [
            {
                "variant": "SVE M=4",
                "layers": 2,
                "phase": "train",
                "planned_gib": 1.0,
                "measured_gib": 1.1,
                "error_pct": -9.09,
                "reserved_gib": None,
            }
        ],
    }
    json_path, md_path = R.write_report(tmp_path, {"header": header, "checks": checks, "tables": tables})
    md = md_path.read_text()
    assert "2 GPU(s): Example GPU (24.0 GiB), Example GPU (24.0 GiB); driver 000.00, torch 2.x, CUDA 12.x" in md
    assert "**1 of 3 checks passed, 1 failed, 1 did not apply.**" in md
    assert "| plan | peak / within | **FAIL** | planned 2 GiB |" in md  # a | in a name cannot break the table
    assert "| sve | float32 | 1 | 1.23 | 1.50 | 0.90 | 512 |" in md
    assert "| SVE M=4 | 2 | train | 1.00 | 1.10 | -9.1 | – |" in md
    data = json.loads(json_path.read_text())
    assert [c["passed"] for c in data["checks"]] == [True, False, None]
    assert data["checks"][1]["values"]["error"] == "Infinity" and data["header"]["driver"] == "000.00"
    assert R.failed(checks) == [checks[1]]
