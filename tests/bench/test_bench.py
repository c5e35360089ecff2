"""The cost benchmark: its memory and FLOP counters on exact cases, and sve-bench end to end in its tiny
setting (files and facts, never timings)."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from sve.bench.counters import PeakTensorMemory, count_flops, minor_faults, paired_ratio, peak_memory, resident_bytes
from sve.cli.bench import bench as main
from sve.paper.report import cost_runs
from tests.conftest import ROOT as REPO

FLOAT = 4


def test_peak_memory_counts_live_activations_exactly():
    lin = nn.Linear(100, 50)
    x = torch.randn(20, 100)
    with PeakTensorMemory() as m:
        y = torch.tanh(lin(x))  # addmm output, then tanh output; tanh keeps its output for backward
        assert m.now == 20 * 50 * FLOAT and m.peak == 2 * 20 * 50 * FLOAT
        y.sum().backward()
        del y
    grads = (100 * 50 + 50) * FLOAT
    assert m.now == grads  # activations and the loss are gone, the gradients stay
    assert peak_memory(lambda: lin(x).sum(), torch.device("cpu")) == 20 * 50 * FLOAT + FLOAT  # output and sum


def test_minor_faults_count_the_pages_a_step_touches_first():
    import mmap

    pages = 1024

    def touch_fresh_pages():
        with mmap.mmap(-1, pages * mmap.PAGESIZE) as region:  # anonymous memory: no page exists until written
            for i in range(pages):
                region[i * mmap.PAGESIZE] = 1

    assert pages <= minor_faults(touch_fresh_pages) < 2 * pages
    assert minor_faults(lambda: None) < 16


def test_views_and_existing_tensors_cost_nothing():
    W = torch.randn(64, 64)
    with PeakTensorMemory() as m:
        v = W.t()[:10]  # views of memory from before the step
        flat = W[:10].reshape(-1)
        assert m.peak == 0 and flat.numel() == 640
        v.reshape(-1)  # not contiguous: a copy
    assert m.peak == 640 * FLOAT and m.now == 0


def test_resident_bytes_counts_each_storage_once():
    a = nn.Linear(10, 10)
    b = nn.Linear(10, 10)
    b.weight = a.weight  # tied
    model = nn.Sequential(a, b)
    assert resident_bytes(model) == (100 + 10 + 10) * FLOAT
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 10)).sum().backward()
    opt.step()
    assert resident_bytes(model, opt.state) > 3 * resident_bytes(model)  # two Adam moments (+ step counts)


def test_flops_and_paired_ratio():
    lin = nn.Linear(30, 20, bias=False)
    assert count_flops(lambda: lin(torch.randn(7, 30))) == 2 * 7 * 30 * 20
    times = {"a": [2.0, 4.0, 6.0], "b": [1.0, 1.0, 2.0]}
    assert paired_ratio(times, "a", "b") == 3.0


@pytest.mark.slow  # the benchmark script end to end (80 s of the default suite); make test-slow
def test_bench_script_tiny_writes_every_file(tmp_path):
    out = tmp_path / "bench"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sve.cli.bench",
            "--tiny",
            "--parts",
            "vit_s",
            "table5",
            "rule",
            "weights",
            "--out",
            str(out),
            "--svd-cache",
            str(tmp_path / "svd"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    vit = json.loads((out / "vit_s.json").read_text())
    M = vit["setting"]["ensemble_size"]
    for kind in ("train", "eval_b16", "eval_b1"):
        rows = vit[kind]
        assert rows["dense"]["ratio_to_dense"] == 1.0
        for name, row in rows.items():
            assert row["ms"] > 0 and row["flops"] > 0 and row["peak_bytes"] > 0, (kind, name)
    # Facts, not timings: merged SVE does the dense copies' FLOPs less the stem its members share (computed
    # once, sve.layers.shared_inputs), factored more; rebuilding costs more than training factored; M dense copies are
    # M single models.
    e16 = vit["eval_b16"]
    assert e16["sve"]["flops"] < e16["dense"]["flops"] == M * e16["single"]["flops"]
    assert e16["sve_factored"]["flops"] > e16["dense"]["flops"]
    assert vit["train"]["rebuild"]["flops"] > vit["train"]["sve"]["flops"]
    assert vit["train"]["dense"]["derived"] == f"{M} x single"
    for name in ("lora_ensemble", "batch_ensemble"):  # SVE's chunking for the baselines: one member per pass at
        assert e16[f"{name}_auto"]["flops"] < e16[name]["flops"]  # batch 16, so the members share the stem
    lean = vit["lean_memory"]
    assert lean["sve_bfloat16_bytes"] < lean["sve_float32_bytes"]
    assert 1e-4 < lean["bf16_weight_error"]["max"] < 1e-2
    assert {t["what"].split(",")[0] for t in vit["targets"]} == {"eval at batch 16 per member", "training step"}
    full = vit["eval_b16_full_depth"]  # the tiny run uses 1 of 2 blocks, so the full depth is timed too
    assert full["blocks"] == 2 and full["dense"]["ratio_to_dense"] == 1.0 and full["sve"]["ms"] > 0
    assert any("full depth (2 blocks)" in t["what"] for t in vit["targets"])

    table5 = json.loads((out / "table5.json").read_text())
    assert {"single", "sve", "lora_ensemble", "batch_ensemble", "deep_ensemble", "mc_dropout"} <= set(table5["methods"])
    costs = cost_runs(table5)  # the schema sve.paper.report reads
    assert all(math.isfinite(v) for row in costs.values() for v in row.values())
    methods = table5["methods"]
    assert methods["deep_ensemble"]["parameters"] == M * methods["single"]["parameters"]
    assert costs["deep_ensemble"]["train_memory_overhead_pct"] == 100.0 * (M - 1)
    # Stored and trainable parameters apart: SVE stores U and V (far more than 1% over the base) and trains
    # its singular values and heads (a small share of it); Deep Ensemble trains M copies of what Single trains.
    share = lambda name: 100.0 * methods[name]["trainable_parameters"] / methods["single"]["parameters"]  # noqa: E731
    assert costs["sve"]["trainable_param_pct"] == share("sve") < 10 < costs["sve"]["param_overhead_pct"]
    assert costs["deep_ensemble"]["trainable_param_pct"] == pytest.approx(M * share("single"), rel=1e-12)
    assert methods["mc_dropout"]["members"] == M and methods["sve"]["members"] == M
    target = table5["target"]  # timed directly against each other, at 1 thread and (if there are more) all cores
    assert target["by_threads"][0]["threads"] == 1 and target["value"] == target["by_threads"][0]["value"]
    assert [len(m["rounds"]) for m in target["by_threads"]] == [3] * len(target["by_threads"])
    assert len(target["by_threads"]) == (1 if len(os.sched_getaffinity(0)) == 1 else 2)

    rule = json.loads((out / "rule.json").read_text())
    assert rule["crossovers"] and all("cached_from_tokens" in c for c in rule["crossovers"])
    weights = json.loads((out / "weights.json").read_text())
    for row in weights["rows"]:  # enough distinct layers that their shared weights alone stream from memory
        assert row["copies"] * row["in"] * row["out"] * 4 >= weights["stream_bytes"]
        assert row["shared_ms"] > 0 and all(
            row[f"{n}_ratio"] > 0 for n in ("lora_ensemble", "sve_cached", "one_weight_split")
        )
    md = (out / "bench.md").read_text()
    assert "### tiny ViT (test)" in md and "### Table 5 setting" in md and "### The inference rule" in md
    assert "### Batch 1: one shared weight against M distinct ones" in md and "from an earlier run" not in md

    # Rerunning some parts keeps the others' files, and the table says which parts come from the earlier run;
    # Table 5 may leave out any method (Deep Ensemble included).
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "sve.cli.bench",
            "--tiny",
            "--parts",
            "weights",
            "table5",
            "--table5-methods",
            "sve",
            "lora_ensemble",
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert set(json.loads((out / "table5.json").read_text())["methods"]) == {"single", "sve", "lora_ensemble"}
    md = (out / "bench.md").read_text()
    earlier = {line.split("`")[1] for line in md.splitlines() if "from an earlier run" in line}
    assert earlier == {"vit_s", "rule"}
    assert "### tiny ViT (test)" in md and "### Batch 1" in md
    assert not (out / "bert_base.json").exists()


def test_front_marks_the_points_no_other_beats_on_both():
    from sve.bench.front import on_front

    points = {"a": (1, 5), "b": (2, 2), "c": (3, 3), "d": (2, 2), "e": (5, 1), "f": (1, 6)}
    # c is beaten by b on both; f by a (equal memory, more latency); b and d tie, and a tie beats neither.
    assert on_front(points) == {"a", "b", "d", "e"}


@pytest.mark.slow  # the benchmark script end to end (80 s of the default suite); make test-slow
def test_bench_front_tiny_has_every_setting_and_a_consistent_front(tmp_path):
    from sve.bench.front import FRONT, on_front

    out = tmp_path / "bench"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sve.cli.bench",
            "--tiny",
            "--parts",
            "front",
            "--out",
            str(out),
            "--svd-cache",
            str(tmp_path / "svd"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads((out / "front.json").read_text())["rows"]
    found = {(r["method"], r["setting"]) for r in rows}
    assert found == {(m, s) for m, settings in FRONT.items() for s in settings}
    by = {(r["method"], r["setting"]): r for r in rows}
    for method, settings in FRONT.items():  # a setting changes how members run, never what is stored or trained
        counts = {(by[method, s]["parameters"], by[method, s]["trainable_parameters"]) for s in settings}
        assert len(counts) == 1, method
    # SVE's fast setting holds every member's merged weights beside float32 factors; its lean one bfloat16
    # factors alone: less memory at both batch sizes.
    for b in (1, 16):
        assert by["sve", "lean"][f"infer_memory_bytes_b{b}"] < by["sve", "fast"][f"infer_memory_bytes_b{b}"]
        assert by["single", "fast"][f"ratio_to_single_b{b}"] == 1.0
        points = {
            f"{r['method']} {r['setting']}": (r[f"infer_memory_bytes_b{b}"], r[f"ratio_to_single_b{b}"]) for r in rows
        }
        assert {f"{r['method']} {r['setting']}" for r in rows if r[f"on_front_b{b}"]} == on_front(points)
    assert by["deep_ensemble", "fast"]["parameters"] == 2 * by["single", "fast"]["parameters"]
    assert "### Table 5 as a front" in (out / "bench.md").read_text()


@pytest.mark.parametrize(("device", "message"), [("cuda", "no CUDA GPU here"), ("foo", "not a device torch knows")])
def test_a_device_that_is_not_there_is_one_line(device, message, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stop:
        main(["--device", device, "--tiny"])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
