"""The benchmark's ``table5`` part: every method of Table 5 at batch 1, and SVE's latency against LoRA-Ensemble's."""

from __future__ import annotations

import gc
import os
import statistics
from functools import partial

import torch

from sve.bench.counters import (
    count_flops,
    interleaved_times,
    paired_ratio,
    paired_ratios,
    peak_memory,
    resident_bytes,
    verdict,
)
from sve.bench.settings import Builder, Candidate, Setting, log
from sve.members import to_device
from sve.methods import registry
from sve.methods.kinds import FittedAfterTraining

TABLE5_DEFAULT = [
    "svf",
    "single_lora",
    "mc_dropout",
    "deep_ensemble",
    "batch_ensemble",
    "lora_ensemble",
    "last_layer_ensemble",
    "checkpoint_ensemble",
    "bayes_lora_llla",
    "blob",
    "sve",
    "sve_factored",
    "sve_lean",
    "sve_top",
    "sve_top32",
]  # top-r: beyond the paper (sve.layers.sv_top)
# SVE variants beside the default (Table 5's "sve" row): method config and overrides.
VARIANTS = {
    "sve_factored": ("sve", ["method.inference=factored"]),
    "sve_lean": ("sve", ["method.inference=factored", "method.factor_dtype=bfloat16"]),
}
NOT_BY_DEFAULT = {
    "bayes_lora_la": "its KFAC Laplace fit over every LoRA factor of BERT-base took 508 s on this "
    "CPU; add it with --table5-methods"
}


def prepare(method, builder: Builder) -> None:
    """Puts a method in its evaluation state without training, by the hooks a run calls: one epoch end per member
    (a checkpoint ensemble's snapshots), then ``after_fit``, on the training data where the method fits some
    after training (a Laplace posterior; ``FittedAfterTraining``)."""
    for _ in range(method.ensemble_size):
        method.on_train_epoch_end(None)
    method.after_fit(builder.datamodule() if isinstance(method, FittedAfterTraining) else None)


def sample_overrides(name: str, members: int) -> list[str]:
    """``members`` samples for a sampled method (the builder gives every other method its members already)."""
    return [f"method.num_samples={members}"] if registry.info(name).sampled else []


def table5_part(setting: Setting, args, device) -> dict:
    M = setting.ensemble_size
    builder = Builder(setting, None if not args.tiny else args.layers, args.svd_cache, device)
    batch = to_device(setting.batch(1), device)

    single = Candidate(builder.method("single"))
    entries, notes = {}, {}
    for name in ["single", *args.table5_methods]:
        log(f"[table5] {name}")
        config, extra = VARIANTS.get(name, (name, []))
        cand = single if name == "single" else Candidate(builder.method(config, *extra, *sample_overrides(config, M)))
        train_bytes = None
        if name != "deep_ensemble":  # M copies with Adam moments: M x Single's (below)
            cand.train_step(batch)
            train_bytes = cand.resident() + peak_memory(partial(cand.train_step, batch), device)
        prepare(cand.method, builder)
        cand.eval_step(batch)
        infer_bytes = resident_bytes(cand.method) + peak_memory(partial(cand.eval_step, batch), device)
        flops = count_flops(partial(cand.eval_step, batch))
        steps = {"single": partial(single.eval_step, batch), name: partial(cand.eval_step, batch)}
        times = interleaved_times(steps, args.repeats, device, warmup=0)
        entries[name] = {
            "parameters": cand.method.parameter_counts()["total"],
            "trainable_parameters": cand.method.parameter_counts()["trainable"],
            "train_memory_bytes": train_bytes,
            "infer_memory_bytes": infer_bytes,
            "infer_gflops": flops / 1e9,
            "infer_ms": 1e3 * statistics.median(times[name]),
            "infer_ratio_to_single": paired_ratio(times, name, "single"),
            "infer_ratios_to_single": paired_ratios(times, name, "single"),
            "members": cand.method.num_members(),
        }
        if cand is not single:
            del cand
            gc.collect()
    if "deep_ensemble" in entries:
        entries["deep_ensemble"]["train_memory_bytes"] = M * entries["single"]["train_memory_bytes"]
        notes["deep_ensemble"] = (
            f"train_memory_bytes = {M} x single's measured peak: {M} copies trained jointly "
            "in memory hold M x (weights, gradients, Adam moments, activations)"
        )
    notes["parameters"] = (
        "every stored parameter, frozen ones included (SVE's U and V: 1.5x the weights they "
        "replace in float32); trainable_parameters beside it"
    )
    notes["sve"] = (
        "the default configuration: merged weights of all members cached for evaluation (M x the wrapped "
        "weights: the inference memory), members batched at batch 1; sve_factored: the paper's factored "
        "product (no cache); sve_lean: factored with bfloat16 U and V (not Table 5 rows)"
    )
    for name, why in NOT_BY_DEFAULT.items():
        if name not in args.table5_methods:
            notes[name] = f"not measured by default: {why}"
    target = None
    if "sve" in entries and "lora_ensemble" in entries:
        target = latency_target(builder, batch, args, device)
    return {
        "setting": {
            "backbone": "bert_base (random weights)" if not args.tiny else "tiny_bert",
            "ensemble_size": M,
            "batch_size": 1,
            "sequence_length": setting.tokens,
            "device": str(device),
            "repeats": args.repeats,
            "layers": setting.full_depth,
        },
        "methods": entries,
        "notes": notes,
        **({"target": target} if target else {}),
    }


def latency_target(builder: Builder, batch: dict, args, device) -> dict:
    """SVE (default) against LoRA-Ensemble at batch 1, timed against each other in the same rounds: at the
    benchmark's thread count and, on a CPU with more cores, with all of them."""
    pair = {"sve": Candidate(builder.method("sve")), "lora_ensemble": Candidate(builder.method("lora_ensemble"))}
    steps = {name: (lambda c=c: c.eval_step(batch)) for name, c in pair.items()}
    threads = [torch.get_num_threads()]
    if device.type == "cpu" and available_cores() > threads[0]:
        threads.append(available_cores())
    rounds, measured = 3 * args.repeats, []
    for n in threads:
        torch.set_num_threads(n)
        log(f"[table5] target: SVE against LoRA-Ensemble at batch 1, {n} threads, {rounds} rounds")
        times = interleaved_times(steps, rounds, device, warmup=1)
        ratios = paired_ratios(times, "sve", "lora_ensemble")
        measured.append(
            {
                "threads": n,
                "sve_ms": 1e3 * statistics.median(times["sve"]),
                "lora_ensemble_ms": 1e3 * statistics.median(times["lora_ensemble"]),
                "value": statistics.median(ratios),
                "rounds": ratios,
                "verdict": verdict(ratios, 1.0),
            }
        )
    torch.set_num_threads(threads[0])
    return {
        "what": "batch-1 latency, SVE (default) / LoRA-Ensemble, timed against each other",
        "limit": 1.0,
        **{k: measured[0][k] for k in ("value", "rounds", "verdict")},
        "by_threads": measured,
    }


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
