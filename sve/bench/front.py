"""The benchmark's ``front`` part: each method fast and lean, inference memory against latency (Table 5's front)."""

from __future__ import annotations

import gc
import statistics
from functools import partial

from sve.bench.counters import interleaved_times, paired_ratio, peak_memory, resident_bytes
from sve.bench.settings import Builder, Candidate, Setting, log
from sve.bench.table5 import sample_overrides
from sve.members import to_device

# Each method at its fast setting and, where it has one, its lean setting (method overrides). Fast: as its
# defaults run it (SVE: members_at_once and inference auto, the merged cache where the rule says it is faster);
# lean: the least inference memory it offers, one member per pass (SVE: factored, bfloat16 factors).
ONE_PER_PASS = ["method.members_at_once=1"]
FRONT = {
    "single": {"fast": []},
    "deep_ensemble": {"fast": []},  # M copies held; its sequential mode saves accelerator memory only
    "mc_dropout": {"fast": ["method.members_at_once=all"], "lean": ONE_PER_PASS},
    "batch_ensemble": {"fast": ["method.members_at_once=all"], "lean": ONE_PER_PASS},
    "lora_ensemble": {"fast": ["method.members_at_once=all"], "lean": ONE_PER_PASS},
    "sve": {"fast": [], "lean": ["method.inference=factored", "method.factor_dtype=bfloat16", *ONE_PER_PASS]},
    "sve_top": {"fast": [], "lean": ["method.factor_dtype=bfloat16", *ONE_PER_PASS]},
    "sve_top32": {"fast": [], "lean": ["method.factor_dtype=bfloat16", *ONE_PER_PASS]},
}
FRONT_BATCHES = (1, 16)


def on_front(points: dict[str, tuple[float, float]]) -> set[str]:
    """The names whose (memory, latency) no other point matches or beats on both, and beats on one."""

    def dominated(a, b):
        return b[0] <= a[0] and b[1] <= a[1] and b != a

    return {n for n, p in points.items() if not any(dominated(p, q) for m, q in points.items() if m != n)}


def pareto_front_part(setting: Setting, args, device) -> dict:
    """Every method of ``FRONT`` at each of its settings: stored and trainable parameters, inference memory at
    the full depth and batch 1 and 16 per member, latency as a ratio to Single timed in the same rounds: at the
    full depth for batch 1 (Table 5's setting), on ``--layers`` blocks for batch 16 (per-block work, as the
    vit_s/bert_base parts time it; the full depth would take minutes per call on 2 CPU cores)."""
    M = setting.ensemble_size
    full = Builder(setting, None, args.svd_cache, device)
    blocks = Builder(setting, args.layers, args.svd_cache, device)
    batches = {b: to_device(setting.batch(b), device) for b in FRONT_BATCHES}
    singles = {"full": Candidate(full.method("single")), "blocks": Candidate(blocks.method("single"))}
    timed_on = {1: "full", 16: "blocks"}  # which depth each batch is timed at
    rows = []
    for name, variants in FRONT.items():
        extra = sample_overrides(name, M)
        for variant, overrides in variants.items():
            log(f"[front] {name} ({variant})")
            row = {"method": name, "setting": variant, "overrides": overrides}
            for depth, builder in (("full", full), ("blocks", blocks)):
                cand = singles[depth] if name == "single" else Candidate(builder.method(name, *overrides, *extra))
                if depth == "full":
                    counts = cand.method.parameter_counts()
                    row.update(
                        parameters=counts["total"],
                        trainable_parameters=counts["trainable"],
                        members=cand.method.num_members(),
                    )
                for b, batch in batches.items():
                    step = partial(cand.eval_step, batch)
                    step()  # warm-up: the merged cache, lazy inits
                    if depth == "full":
                        row[f"infer_memory_bytes_b{b}"] = resident_bytes(cand.method) + peak_memory(step, device)
                    if timed_on[b] == depth:
                        reference = partial(singles[depth].eval_step, batch)
                        times = interleaved_times(
                            {"single": reference, name: step} if name != "single" else {"single": reference},
                            args.repeats,
                            device,
                            warmup=0,
                        )
                        row[f"infer_ms_b{b}"] = 1e3 * statistics.median(times[name])
                        row[f"ratio_to_single_b{b}"] = 1.0 if name == "single" else paired_ratio(times, name, "single")
                if cand is not singles[depth]:
                    del cand
                    gc.collect()
            rows.append(row)
    key = lambda r: f"{r['method']} ({r['setting']})"  # noqa: E731
    for b in FRONT_BATCHES:
        best = on_front({key(r): (r[f"infer_memory_bytes_b{b}"], r[f"ratio_to_single_b{b}"]) for r in rows})
        for r in rows:
            r[f"on_front_b{b}"] = key(r) in best
    return {
        "setting": {
            "backbone": "bert_base (random weights)" if not args.tiny else "tiny_bert",
            "ensemble_size": M,
            "sequence_length": setting.tokens,
            "device": str(device),
            "repeats": args.repeats,
            "layers": setting.full_depth,
            "timed_blocks_b16": args.layers,
            "batches": list(FRONT_BATCHES),
        },
        "rows": rows,
    }
