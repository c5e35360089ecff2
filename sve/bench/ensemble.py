"""The benchmark's ``vit_s`` and ``bert_base`` parts: SVE against M dense copies and the batched baselines."""

from __future__ import annotations

import gc
import statistics
import types

from sve.bench.counters import interleaved_times, paired_ratio, paired_ratios, resident_bytes, verdict
from sve.bench.settings import Builder, Candidate, Setting, log, measure
from sve.layers import SVLinear, weight_matrix
from sve.members import to_device


def ensemble_part(setting: Setting, args, device) -> dict:
    builder = Builder(setting, args.layers, args.svd_cache, device)
    M = setting.ensemble_size
    log(f"[{setting.name}] building candidates ({args.layers or setting.full_depth} blocks, M = {M})")
    methods = {
        "single": builder.method("single"),
        "sve_factored": builder.method("sve", "method.inference=factored", "method.members_at_once=all"),
        "sve": builder.method("sve"),
        "sve_batched": builder.method("sve", "method.members_at_once=all"),
        "sve_one_at_a_time": builder.method("sve", "method.members_at_once=1", "method.inference=merged"),
        "rebuild": rebuild(builder.method("sve", "method.inference=factored")),
        "lora_ensemble": builder.method("lora_ensemble"),
        "lora_ensemble_auto": builder.method("lora_ensemble", "method.members_at_once=auto"),
        "batch_ensemble": builder.method("batch_ensemble"),
        "batch_ensemble_auto": builder.method("batch_ensemble", "method.members_at_once=auto"),
        "dense": builder.method("deep_ensemble", "method.mode=in_memory"),
    }
    candidates = {n: Candidate(m) for n, m in methods.items()}
    results: dict[str, dict] = {"train": {}, "eval_b16": {}, "eval_b1": {}}
    train = ["single", "sve", "rebuild", "lora_ensemble", "batch_ensemble"]
    evaluate = [
        "dense",
        "single",
        "sve_factored",
        "sve",
        "sve_batched",
        "sve_one_at_a_time",
        "lora_ensemble",
        "lora_ensemble_auto",
        "batch_ensemble",
        "batch_ensemble_auto",
    ]
    for kind, names, B in (("train", train, args.train_batch), ("eval_b16", evaluate, 16), ("eval_b1", evaluate, 1)):
        log(f"[{setting.name}] {kind}: batch {B} per member, {args.repeats} rounds")
        batch = to_device(setting.batch(B), device)
        results[kind] = measure({n: candidates[n] for n in names}, kind.split("_")[0], batch, args.repeats, device)
    # M dense fine-tunes = M independent Single steps (same work; no need to hold M copies and their moments).
    single = results["train"]["single"]
    results["train"]["dense"] = {
        "flops": M * single["flops"],
        "peak_bytes": M * single["peak_bytes"],
        "ms": M * single["ms"],
        "seconds": [M * s for s in single["seconds"]],
        "derived": f"{M} x single",
    }
    for rows in results.values():
        for name, row in rows.items():
            row["ratio_to_dense"] = paired_ratio({k: v["seconds"] for k, v in rows.items()}, name, "dense")
    report = {
        "setting": {
            "name": setting.name,
            "title": setting.title,
            "ensemble_size": M,
            "blocks": args.layers or setting.full_depth,
            "full_depth": setting.full_depth,
            "train_batch_per_member": args.train_batch,
            "device": str(device),
            "repeats": args.repeats,
        },
        "parameters": {n: m.parameter_counts() for n, m in methods.items()},
        "merged_cache_bytes": methods["sve"].merged_bytes(),
        **results,
    }
    del methods, candidates
    gc.collect()
    if setting.name in args.full_depth_eval and report["setting"]["blocks"] != setting.full_depth:
        log(f"[{setting.name}] eval_b16 at the full depth ({setting.full_depth} blocks): SVE and M dense")
        report["eval_b16_full_depth"] = full_depth_eval(setting, args, device)
    report["lean_memory"] = lean_memory(setting, args, device)
    report["targets"] = targets(setting, report)
    return report


def full_depth_eval(setting: Setting, args, device) -> dict:
    """Evaluation at batch 16 per member of SVE (default) and M dense copies at the full depth: times only."""
    builder = Builder(setting, setting.full_depth, args.svd_cache, device)
    candidates = {
        "sve": Candidate(builder.method("sve")),
        "dense": Candidate(builder.method("deep_ensemble", "method.mode=in_memory")),
    }
    batch = to_device(setting.batch(16), device)
    times = interleaved_times(
        {n: (lambda c=c: c.eval_step(batch)) for n, c in candidates.items()}, args.repeats, device, warmup=1
    )
    return {
        "blocks": setting.full_depth,
        **{
            n: {"ms": 1e3 * statistics.median(t), "seconds": t, "ratio_to_dense": paired_ratio(times, n, "dense")}
            for n, t in times.items()
        },
    }


def lean_memory(setting: Setting, args, device) -> dict:
    """Weight memory (parameters and buffers, bytes) of SVE with float32 and bfloat16 factors against the
    single model at full depth, and what bfloat16 factors cost in reconstruction error."""
    builder = Builder(setting, None if not args.tiny else args.layers, args.svd_cache, device)
    single = builder.method("single")
    out = {"single_bytes": resident_bytes(single)}
    del single
    for dtype in ("float32", "bfloat16"):
        log(f"[{setting.name}] lean memory: SVE with {dtype} factors, full depth")
        sve = builder.method("sve", f"method.factor_dtype={dtype}")
        out[f"sve_{dtype}_bytes"] = resident_bytes(sve)
        out[f"sve_{dtype}_ratio"] = out[f"sve_{dtype}_bytes"] / out["single_bytes"]
        if dtype == "bfloat16":
            errors = []
            originals = dict(builder.pristine.named_modules())
            for name, module in sve.backbone.named_modules():
                if isinstance(module, SVLinear):
                    W = weight_matrix(originals[name]).detach().double().to(device)
                    W_sv = (module.U.double() * module.pretrained_singular_values.double()) @ module.Vh.double()
                    errors.append(float((W_sv - W).norm() / W.norm()))
            out["bf16_weight_error"] = {"mean": statistics.mean(errors), "max": max(errors), "layers": len(errors)}
        del sve
        gc.collect()
    return out


def targets(setting: Setting, report: dict) -> list[dict]:
    """The issue's targets as (what, value, round-by-round ratios, limit, verdict)."""
    seconds = {kind: {k: v["seconds"] for k, v in report[kind].items()} for kind in ("train", "eval_b16", "eval_b1")}
    rows = [
        (
            "eval at batch 16 per member, SVE (default) / M dense",
            paired_ratios(seconds["eval_b16"], "sve", "dense"),
            1.0,
            True,
        ),
        (
            "training step, SVE / M dense",
            paired_ratios(seconds["train"], "sve", "dense"),
            0.90 if setting.name == "vit_s" else 1.0,
            True,
        ),
        (
            "training step, rebuild / SVE (speed-up over rebuilding)",
            paired_ratios(seconds["train"], "rebuild", "sve"),
            1.3,
            False,
        ),
    ]
    if "eval_b16_full_depth" in report:
        full = report["eval_b16_full_depth"]
        rows.insert(
            1,
            (
                f"eval at batch 16 per member, full depth ({full['blocks']} blocks), SVE (default) / M dense",
                paired_ratios({k: full[k]["seconds"] for k in ("sve", "dense")}, "sve", "dense"),
                1.0,
                True,
            ),
        )
    if setting.name == "bert_base":
        rows.append(
            (
                "eval at batch 1 per member, SVE (default) / LoRA-Ensemble",
                paired_ratios(seconds["eval_b1"], "sve", "lora_ensemble"),
                1.0,
                True,
            )
        )
    return [
        {
            "what": what,
            "value": statistics.median(r),
            "rounds": r,
            "op": "<=" if at_most else ">=",
            "limit": limit,
            "verdict": verdict(r, limit, at_most),
        }
        for what, r, limit, at_most in rows
    ]


def rebuild(method):
    """The rebuild formulation: every SV layer materialises its members' weights, with autograd, in every
    forward (training included); the same SVE otherwise."""
    for layer in method.sv_layers():
        layer.path = types.MethodType(lambda self, x, K: "merged", layer)
    return method
