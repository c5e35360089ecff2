"""The benchmark's one-layer parts: where merged weights beat factored ones (rule), distinct weights at batch 1."""

from __future__ import annotations

import copy
import gc
import statistics
from functools import partial

import torch

from sve.bench.counters import interleaved_times, paired_ratio
from sve.bench.settings import log
from sve.layers import LoRALayer, SVLinear

# --- rule: one SV layer, factored against cached and merged weights ---------------------------------------------


def rule_part(args, device) -> dict:
    shapes = [(32, 32, 2), (32, 64, 2)] if args.tiny else [(384, 384, 4), (384, 1536, 4), (768, 768, 8), (768, 3072, 8)]
    grid = [1, 16, 64] if args.tiny else [1, 4, 16, 64, 256, 1024, 2048]
    out = []
    for in_f, out_f, K in shapes:
        torch.manual_seed(0)
        layer = SVLinear.from_linear(torch.nn.Linear(in_f, out_f), K, sigma_init=0.01).to(device).eval()
        layers = {}
        for mode in ("factored", "cached", "merged"):  # one layer per mode: switching modes drops a cache
            layers[mode] = copy.deepcopy(layer)
            layers[mode].inference = mode
        for N in grid:
            x = torch.randn(K * N, in_f, device=device)
            steps = {mode: partial(lay, x) for mode, lay in layers.items()}
            with torch.no_grad():
                times = interleaved_times(steps, args.repeats, device)
            row = {
                "in": in_f,
                "out": out_f,
                "members": K,
                "tokens_per_member": N,
                **{f"{m}_ms": 1e3 * statistics.median(t) for m, t in times.items()},
                "cached_ratio": paired_ratio(times, "cached", "factored"),
                "merged_ratio": paired_ratio(times, "merged", "factored"),
            }
            out.append(row)
            log(
                f"[rule] {in_f}->{out_f} K={K} N={N}: cached {row['cached_ratio']:.2f}, "
                f"merged {row['merged_ratio']:.2f} x factored"
            )
    return {"rows": out, "crossovers": crossovers(out)}


def crossovers(rows: list[dict]) -> list[dict]:
    """Per shape: the smallest N from which cached (merged) weights stay faster than factored."""
    out = []
    for key in sorted({(r["in"], r["out"], r["members"]) for r in rows}):
        shape = [r for r in rows if (r["in"], r["out"], r["members"]) == key]
        entry = {"in": key[0], "out": key[1], "members": key[2]}
        for mode in ("cached", "merged"):
            faster = [r[f"{mode}_ratio"] < 1 for r in shape]
            first = next((i for i in range(len(shape)) if all(faster[i:])), None)
            entry[f"{mode}_from_tokens"] = None if first is None else shape[first]["tokens_per_member"]
        out.append(entry)
    return out


# --- weights: one shared weight against M distinct ones (batch 1) ------------------------------------------


def weight_steps(x, bases, loras, svs, repeated, shape: tuple[int, int, int]) -> dict:
    """The timed steps of one shape (built in a function, so every closure holds this shape's tensors)."""
    return {
        "shared": lambda: [torch.addmm(b.bias, x, b.weight.t()) for b in bases],
        "lora_ensemble": lambda: [layer(x) for layer in loras],
        "sve_cached": lambda: [layer(x) for layer in svs],
        "one_weight_split": lambda: [torch.baddbmm(b, x.view(*shape), W) for W, b in repeated],
    }


def weights_part(args, device) -> dict:
    """Each step runs the members through ``copies`` distinct layers of one shape, enough that the shared
    weights alone (64 MB) exceed the CPU's last-level cache: as in a full model, every call then reads its
    weights from memory. (One layer timed alone keeps SVE's M merged weights in the cache between calls and
    hides the cost of reading them.)"""
    shapes = (
        [(32, 32, 2, 8)]
        if args.tiny
        else [
            (384, 384, 4, 197),
            (384, 1536, 4, 197),
            (1536, 384, 4, 197),
            (768, 768, 8, 128),
            (768, 3072, 8, 128),
            (3072, 768, 8, 128),
        ]
    )
    stream_bytes = 2**16 if args.tiny else 64 * 2**20
    rows = []
    for in_f, out_f, K, N in shapes:
        torch.manual_seed(0)
        base = torch.nn.Linear(in_f, out_f).to(device)
        copies = -(-stream_bytes // (base.weight.numel() * base.weight.element_size()))
        sve = SVLinear.from_linear(base, K, sigma_init=0.01).to(device).eval()
        sve.inference = "cached"
        lora = LoRALayer(copy.deepcopy(base), K).to(device).eval()
        x = torch.randn(K * N, in_f, device=device)
        bases = [copy.deepcopy(base) for _ in range(copies)]
        svs = [copy.deepcopy(sve) for _ in range(copies)]
        loras = [copy.deepcopy(lora) for _ in range(copies)]
        # One weight repeated M times in one batched matmul: the split into M matmuls without reading M weights.
        repeated = [(b.weight.detach().expand(K, out_f, in_f).transpose(1, 2), b.bias.detach()) for b in bases]
        steps = weight_steps(x, bases, loras, svs, repeated, (K, N, in_f))
        with torch.no_grad():
            steps["sve_cached"]()  # builds the caches outside the timing
            split = steps["one_weight_split"]()[0].reshape(K * N, out_f)
            torch.testing.assert_close(split, steps["shared"]()[0])  # the same product, computed split
            times = interleaved_times(steps, args.repeats, device)
        row = {
            "in": in_f,
            "out": out_f,
            "members": K,
            "tokens_per_member": N,
            "copies": copies,
            "shared_ms": 1e3 * statistics.median(times["shared"]) / copies,
            **{f"{name}_ratio": paired_ratio(times, name, "shared") for name in steps if name != "shared"},
        }
        rows.append(row)
        log(
            f"[weights] {in_f}->{out_f} K={K} N={N} ({copies} layers): LoRA-E {row['lora_ensemble_ratio']:.3f}, "
            f"SVE cached {row['sve_cached_ratio']:.3f}, one weight split {row['one_weight_split_ratio']:.3f} x shared"
        )
        del svs, loras, bases, repeated, steps
        gc.collect()
    return {"rows": rows, "stream_bytes": stream_bytes}
