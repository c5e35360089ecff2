"""The benchmark's table, ``bench.md``: each part's measurements as markdown."""

from __future__ import annotations

from pathlib import Path

MB = 2**20

LABELS = {
    "dense": "M dense copies",
    "single": "Single (one model)",
    "sve_factored": "SVE, factored",
    "sve": "SVE, default (inference and members_at_once auto)",
    "sve_batched": "SVE, auto, all members batched",
    "sve_one_at_a_time": "SVE, one member at a time, merged per call",
    "rebuild": "Rebuild U diag(s_m) V^T per forward",
    "lora_ensemble": "LoRA-Ensemble",
    "lora_ensemble_auto": "LoRA-Ensemble, members_at_once auto",
    "batch_ensemble": "BatchEnsemble",
    "batch_ensemble_auto": "BatchEnsemble, members_at_once auto",
}


def ensemble_markdown(report: dict) -> list[str]:
    s = report["setting"]
    lines = [
        f"### {s['title']}",
        "",
        f"{s['blocks']} of {s['full_depth']} blocks, {s['device']}, median of {s['repeats']} interleaved rounds; "
        f"times as ratios to M dense copies in the same round (lower is better), training at batch "
        f"{s['train_batch_per_member']} per member.",
        "",
        "| candidate | train step | eval, batch 16 | eval, batch 1 | train GFLOPs | eval-16 GFLOPs | "
        "train peak MB | eval-16 peak MB | eval-16 page faults |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, label in LABELS.items():
        t, e16, e1 = (report[k].get(name) for k in ("train", "eval_b16", "eval_b1"))
        cell = lambda r: "–" if r is None else f"{r['ratio_to_dense']:.2f}x ({r['ms']:.0f} ms)"  # noqa: E731
        gf = lambda r: "–" if r is None else f"{r['flops'] / 1e9:.1f}"  # noqa: E731
        mb = lambda r: "–" if r is None else f"{r['peak_bytes'] / MB:.0f}"  # noqa: E731
        faults = "–" if e16 is None or "minor_faults" not in e16 else f"{e16['minor_faults']:,}"
        lines.append(
            f"| {label} | {cell(t)} | {cell(e16)} | {cell(e1)} | {gf(t)} | {gf(e16)} | {mb(t)} | {mb(e16)} | {faults} |"
        )
    lean = report["lean_memory"]
    lines += ["", "Targets:", ""]
    lines += [
        f"- {t['what']}: {t['value']:.2f} (rounds {min(t['rounds']):.2f}-{max(t['rounds']):.2f}; target "
        f"{t['op']} {t['limit']}): **{t['verdict']}**"
        for t in report["targets"]
    ]
    bf16 = lean["bf16_weight_error"]
    lines += [
        "",
        f"Weight memory at full depth: single {lean['single_bytes'] / MB:.0f} MB; SVE with float32 factors "
        f"{lean['sve_float32_ratio']:.2f}x, with bfloat16 factors {lean['sve_bfloat16_ratio']:.2f}x "
        f"(reconstruction error |U diag(s) V^T - W| / |W| with bfloat16 factors: mean {bf16['mean']:.1e}, max "
        f"{bf16['max']:.1e} over {bf16['layers']} layers). SVE's merged "
        f"cache (evaluation, all members): {report['merged_cache_bytes'] / MB:.0f} MB at this depth.",
        "",
    ]
    return lines


def table5_markdown(t5: dict) -> list[str]:
    s = t5["setting"]
    lines = [
        f"### Table 5 setting: {s['backbone']}, M = {s['ensemble_size']}, batch 1, sequence {s['sequence_length']}",
        "",
        f"{s['device']}, {s['layers']} layers, median of {s['repeats']} rounds interleaved with Single.",
        "",
        "| method | parameters (M) | +% | trainable (M) | train memory MB | +% | infer memory MB | +% | "
        "infer GFLOPs | infer ms | x Single |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = t5["methods"]["single"]
    pct = lambda m, k: "–" if m[k] is None else f"{100 * (m[k] - base[k]) / base[k]:+.0f}"  # noqa: E731
    for name, m in t5["methods"].items():
        train = "–" if m["train_memory_bytes"] is None else f"{m['train_memory_bytes'] / MB:.0f}"
        lines.append(
            f"| {name} | {m['parameters'] / 1e6:.1f} | {pct(m, 'parameters')} | "
            f"{m['trainable_parameters'] / 1e6:.2f} | {train} | {pct(m, 'train_memory_bytes')} | "
            f"{m['infer_memory_bytes'] / MB:.0f} | {pct(m, 'infer_memory_bytes')} | {m['infer_gflops']:.1f} | "
            f"{m['infer_ms']:.0f} | {m['infer_ratio_to_single']:.2f} |"
        )
    lines += [""] + [f"- {k}: {v}" for k, v in t5["notes"].items()]
    if "target" in t5:
        t = t5["target"]
        lines += ["", f"Target: {t['what']} (target <= {t['limit']}):", ""]
        lines += [
            f"- {m['threads']} thread{'s' if m['threads'] > 1 else ''}: {m['value']:.3f} (rounds "
            f"{min(m['rounds']):.3f}-{max(m['rounds']):.3f}; SVE {m['sve_ms']:.0f} ms, LoRA-Ensemble "
            f"{m['lora_ensemble_ms']:.0f} ms): **{m['verdict']}**"
            for m in t["by_threads"]
        ]
    return lines + [""]


def front_markdown(part: dict) -> list[str]:
    s = part["setting"]
    lines = [
        f"### Table 5 as a front: {s['backbone']}, M = {s['ensemble_size']}, sequence {s['sequence_length']}",
        "",
        f"{s['device']}. Inference memory (resident weights and caches plus the evaluation's peak) at the "
        f"full depth ({s['layers']} layers); latency as a ratio to Single, timed in the same rounds (median of "
        f"{s['repeats']}): at batch 1 at the full depth, at batch 16 per member on {s['timed_blocks_b16']} "
        "block(s). Fast: the method as its defaults run it; lean: its least-memory setting (one member per "
        "pass; SVE factored with bfloat16 factors). Stored parameters count every tensor kept, frozen ones "
        "included (U and V); trainable ones are what the optimiser updates. ★: on the front (no other row "
        "has both less or equal memory and latency).",
        "",
        "| method | setting | stored (M) | trainable (M) | memory b1 MB | latency b1 | memory b16 MB | latency b16 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in part["rows"]:
        star = {b: " ★" if r[f"on_front_b{b}"] else "" for b in s["batches"]}
        lines.append(
            f"| {r['method']} | {r['setting']} | {r['parameters'] / 1e6:.1f} | "
            f"{r['trainable_parameters'] / 1e6:.2f} | {r['infer_memory_bytes_b1'] / MB:.0f} | "
            f"{r['ratio_to_single_b1']:.2f}x{star[1]} | {r['infer_memory_bytes_b16'] / MB:.0f} | "
            f"{r['ratio_to_single_b16']:.2f}x{star[16]} |"
        )
    return lines + [""]


def rule_markdown(rule: dict) -> list[str]:
    lines = [
        "### The inference rule (one SV layer, tokens per member from which merged weights are faster)",
        "",
        "| in | out | members | cached from N | merged per call from N |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {c['in']} | {c['out']} | {c['members']} | {c['cached_from_tokens']} | {c['merged_from_tokens']} |"
        for c in rule["crossovers"]
    ]
    return lines + [""]


def weights_markdown(part: dict) -> list[str]:
    lines = [
        "### Batch 1: one shared weight against M distinct ones (one layer, tokens of one example per member)",
        "",
        "Time relative to the M members' tokens through one shared weight in one matmul, in the same round "
        f"(median of {part['meta']['args']['repeats']} rounds).",
        "",
        "| in | out | members | tokens per member | shared weight (per layer) | LoRA-Ensemble layer | "
        "SVE, cached merged weights | one weight, split M ways |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['in']} | {r['out']} | {r['members']} | {r['tokens_per_member']} | 1.00 ({r['shared_ms']:.1f} ms) "
        f"| {r['lora_ensemble_ratio']:.3f} | {r['sve_cached_ratio']:.3f} | {r['one_weight_split_ratio']:.3f} |"
        for r in part["rows"]
    ]
    return lines + [""]


def allocator_words(meta: dict) -> str:
    policy = meta.get("cpu_allocator", "system")
    if policy == "tuned" and not meta.get("cpu_allocator_tuned"):
        return "tuned (not applied: not glibc)"
    return {
        "tuned": "tuned (sve/training/allocator.py: freed memory kept for reuse)",
        "system": "as the C library sets it",
    }[policy]


def write_markdown(out: Path, parts: dict) -> None:
    lines = [
        "# Cost benchmark (`make bench`)",
        "",
        f"`{parts['meta']['command']}` at commit {parts['meta']['git_commit']}, torch "
        f"{parts['meta']['versions']['torch']}, {parts['meta']['threads']} threads, CPU allocator "
        f"{allocator_words(parts['meta'])}.",
        "",
    ]
    earlier = {
        key: part["meta"]
        for key, part in parts.items()
        if key != "meta"
        and (part["meta"]["command"], part["meta"]["git_commit"])
        != (parts["meta"]["command"], parts["meta"]["git_commit"])
    }
    lines += [
        f"Part `{key}` is from an earlier run: `{meta['command']}` at commit {meta['git_commit']}."
        for key, meta in earlier.items()
    ] + ([""] if earlier else [])
    for key in ("vit_s", "bert_base"):
        if key in parts:
            lines += ensemble_markdown(parts[key])
    if "table5" in parts:
        lines += table5_markdown(parts["table5"])
    if "front" in parts:
        lines += front_markdown(parts["front"])
    if "rule" in parts:
        lines += rule_markdown(parts["rule"])
    if "weights" in parts:
        lines += weights_markdown(parts["weights"])
    (out / "bench.md").write_text("\n".join(lines))
