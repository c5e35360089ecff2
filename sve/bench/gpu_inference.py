"""The ``inference`` part of ``sve-bench --gpu-check``: SVE's inference paths agree, and what each costs at
batch 1 and 16 against LoRA-Ensemble and Single (Table 5 on a GPU).

BERT-base-shaped layers (768 wide, 12 heads, MLP 3072, sequence 128, 12 layers; random weights), M = 8, every
candidate built from the same backbone and seed (``sve.bench.settings.Builder``), so SVE's variants hold the
same members. Paths (``sve.layers.sv_inference``): the merged-weight cache, factored, merged per call,
``auto`` (the default), lean (factored with bfloat16 U and V) and top-r (``sve_top``: the top singular values
per member beside a frozen residual), factored and cached.

Agreement (tolerances: ``sve.bench.gpu_report``): every path's member logits against SVE factored in float32
(model tolerance, float32); lean against the same with the bfloat16 tolerance (its factors are rounded);
top-r cached against top-r factored; and under bfloat16 autocast, as ``trainer=gpu`` evaluates, every SVE
path against float32 factored (bfloat16 tolerance).

Cost: each candidate's evaluation step timed with CUDA events (``--gpu-check`` reviews their semantics),
``WARMUP`` rounds, then ``REPEATS`` rounds, every candidate once per round in alternating order; the median
ms and the median over rounds of the paired ratios to Single and LoRA-Ensemble (same round). Peak memory:
what the method holds (weights, caches) plus ``torch.cuda.max_memory_allocated`` above the allocation
before the step (``sve.bench.counters.peak_memory``). In float32 and under bfloat16 autocast.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from sve.bench.counters import interleaved_times, paired_ratio, peak_memory, resident_bytes
from sve.bench.gpu_report import MIB, Check, error_check

M = 8
BATCHES = (1, 16)
WARMUP, REPEATS = 3, 20
CANDIDATES = {  # name -> (method config, overrides)
    "single": ("single", []),
    "lora_ensemble": ("lora_ensemble", []),
    "sve": ("sve", []),
    "sve_cached": ("sve", ["method.inference=cached"]),
    "sve_factored": ("sve", ["method.inference=factored"]),
    "sve_merged": ("sve", ["method.inference=merged"]),
    "sve_lean": ("sve", ["method.inference=factored", "method.factor_dtype=bfloat16"]),
    "sve_top": ("sve_top", []),  # factored by its config
    "sve_top_cached": ("sve_top", ["method.inference=cached"]),
}
# path -> (its reference, the dtype whose model tolerance applies in float32)
AGREEMENT = {
    "sve_cached": ("sve_factored", "float32"),
    "sve_merged": ("sve_factored", "float32"),
    "sve": ("sve_factored", "float32"),
    "sve_lean": ("sve_factored", "bfloat16"),
    "sve_top_cached": ("sve_top", "float32"),
}
PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16}


def autocast(device: torch.device, dtype: torch.dtype | None):
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def cuda_event_ms(step: Callable[[], object]) -> float:
    """Milliseconds of ``step`` on the GPU's timeline, between two events recorded around it."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()  # nothing earlier queued ahead of the start event
    start.record()
    step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def wall_ms(step: Callable[[], object]) -> float:
    start = time.perf_counter()
    step()
    return 1e3 * (time.perf_counter() - start)


def interleaved_ms(
    steps: dict[str, Callable[[], object]], repeats: int, warmup: int, clock: Callable[[Callable[[], object]], float]
) -> dict[str, list[float]]:
    """The benchmark's interleaving (``sve.bench.counters.interleaved_times``) timed by this check's ``clock``."""
    return interleaved_times(steps, repeats, torch.device("cpu"), warmup=warmup, clock=clock)


def build(device: torch.device, tiny: bool) -> tuple[dict, object]:
    """The candidates (name -> method, in evaluation mode) and the setting they share."""
    from sve.bench.settings import Builder, settings

    setting = settings(tiny)["bert_base"]  # M = 8 (2 when tiny)
    builder = Builder(setting, None, None, device)  # the full depth; no SVD cache (random weights)
    methods = {name: builder.method(config, *overrides).eval() for name, (config, overrides) in CANDIDATES.items()}
    return methods, setting


def agreement(methods: dict, batch: dict, device: torch.device) -> list[Check]:
    from sve.members import to_device

    batch = to_device(batch, device)
    with torch.no_grad():
        reference = {n: methods[n](batch).float() for n in ("sve_factored", "sve_top")}
        checks = []
        for name, (ref, dtype) in AGREEMENT.items():
            error = {name: _error(methods[name](batch), reference[ref])}
            checks.append(error_check("inference", f"{name} = {ref}, float32", error, dtype, "model"))
        with autocast(device, torch.bfloat16):
            errors = {
                n: _error(methods[n](batch), reference["sve_factored"])
                for n in ("sve_factored", "sve_cached", "sve_merged", "sve", "sve_lean")
            }
        checks.append(
            error_check(
                "inference",
                "every SVE path under bfloat16 autocast = sve_factored, float32",
                errors,
                "bfloat16",
                "model",
            )
        )
    return checks


def _error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    from sve.bench.gpu_report import relative_error

    return relative_error(actual.float(), reference)


def costs(methods: dict, setting, device: torch.device, repeats: int, warmup: int) -> list[dict]:
    """One row per candidate, precision and batch: median ms, paired ratios, peak MiB."""
    from sve.members import to_device

    clock = cuda_event_ms if device.type == "cuda" else wall_ms
    rows = []
    for precision, dtype in PRECISIONS.items():
        for B in BATCHES:
            batch = to_device(setting.batch(B), device)

            def step(method, batch=batch, dtype=dtype):
                with torch.no_grad(), autocast(device, dtype):
                    method(batch)

            steps = {name: (lambda m=m: step(m)) for name, m in methods.items()}
            times = interleaved_ms(steps, repeats, warmup, clock)
            for name, method in methods.items():
                peak = resident_bytes(method) + peak_memory(steps[name], device)
                rows.append(
                    {
                        "candidate": name,
                        "precision": precision,
                        "batch": B,
                        "ms": statistics.median(times[name]),
                        "rounds_ms": times[name],
                        "ratio_to_single": paired_ratio(times, name, "single"),
                        "ratio_to_lora_ensemble": paired_ratio(times, name, "lora_ensemble"),
                        "peak_mib": peak / MIB,
                    }
                )
            print(
                f"[inference] {precision}, batch {B}: "
                + ", ".join(f"{r['candidate']} {r['ms']:.2f} ms" for r in rows[-len(methods) :]),
                flush=True,
            )
    return rows


def inference_part(
    device: torch.device, tiny: bool = False, repeats: int = REPEATS, warmup: int = WARMUP
) -> tuple[list[Check], list[dict], str]:
    methods, setting = build(device, tiny)
    checks = []
    for B in BATCHES:
        for c in agreement(methods, setting.batch(B), device):
            c.name += f", batch {B}"
            checks.append(c)
    rows = costs(methods, setting, device, repeats, warmup)
    note = (
        f"{setting.title}, M = {setting.ensemble_size}, random weights; {device.type} "
        f"{'CUDA events' if device.type == 'cuda' else 'wall clock'}, {warmup} warm-up rounds, median of "
        f"{repeats} interleaved rounds; ratios: median over rounds of the paired ratio (same round). Peak: "
        "the method's weights and caches plus the step's allocation peak. Candidates: "
        + ", ".join(f"{n} = {c} {' '.join(o)}".strip() for n, (c, o) in CANDIDATES.items())
        + "."
    )
    return checks, rows, note


__all__ = ["inference_part", "interleaved_ms", "cuda_event_ms", "wall_ms", "CANDIDATES", "AGREEMENT"]
