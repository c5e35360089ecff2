"""The cost benchmark (``make bench``): SVE against the alternatives, measured in one process.

    sve-bench [--layers 1] [--repeats 3] [--device cpu|cuda] [--parts vit_s bert_base table5 front rule weights]

Every number comes from ``sve.bench.counters`` (interleaved rounds and paired medians for time, FlopCounterMode for
FLOPs, live-tensor peaks for memory; see its docstring) on random weights of the real shapes. On the CPU it
runs one thread unless ``--threads`` says otherwise: on a machine shared with other jobs, multi-threaded
small operators wait at thread barriers for a core that another process holds, and the times would measure
those processes (an optimiser step of 20 parameters took 1.4 s with 2 threads against 0.17 s with one).

Parts:

- ``vit_s`` (ViT-S/16: width 384, 6 heads, MLP 1536, 197 tokens; M = 4) and ``bert_base`` (BERT-base: width
  768, 12 heads, MLP 3072, sequence 128; M = 8): a training step (batch ``--train-batch`` per member) and
  evaluation at batch 16 per member and at batch 1, each as a ratio to M dense copies of the same backbone
  timed in the same round. Candidates: Single; SVE factored, SVE as configured by default (``inference`` and
  ``members_at_once`` auto), SVE with all members batched, SVE one member at a time with weights merged per
  call (no cache); the rebuild formulation (every member weight U diag(s_m) V^T materialised, with autograd,
  in every forward: a training reference); LoRA-Ensemble and BatchEnsemble as configured and, in evaluation,
  with SVE's default chunking (``members_at_once`` auto: any method can run it). M dense copies
  are measured as such in evaluation (a deep ensemble held in memory); their training step is M x the
  Single step, the same work (M independent fine-tunes) without holding M copies and their Adam moments.
  ``--layers`` transformer blocks are used (default 1): every candidate repeats the same per-block work and
  differs from the others only inside the blocks, so the ratios of a stack of blocks are those of one block,
  the embedding and the heads aside. Those are not negligible against one block: ViT-S's patch embedding
  costs 14% of a block's FLOPs, and SVE's members compute it once per batch where M dense copies compute it M
  times (``sve.layers.shared_inputs``), which one block weighs 12 times too much. So evaluation at batch 16 is also
  timed at the full depth for SVE and M dense copies (``--full-depth-eval``, default ViT-S; BERT's token
  embedding is a lookup), and its target is judged there too. ``--layers 12`` measures everything at the full
  depth. The lean-memory
  numbers (weights of SVE with float32 and bfloat16 factors against the single model, and the bfloat16
  reconstruction error) always use the full depth: they need no timing.
- ``table5``: Table 5's setting, BERT-base (12 layers), M = 8, batch 1, sequence 128: every method of
  configs/tables/table5.yaml that runs without a long fit (``--table5-methods``), Single, and two SVE
  variants beside the default (factored; factored with bfloat16 factors), each built alone (memory) and
  timed interleaved with Single; writes table5.json for ``make table5`` (schema: ``sve.paper.report.cost_runs``).
  Its target, SVE's batch-1 latency against LoRA-Ensemble's, is then timed directly: the two built side by
  side and timed against each other in the same rounds (3 x ``--repeats``), at the benchmark's thread count
  and, on a CPU, with every core (what one request waits for: PyTorch's default uses every core).
- ``front``: Table 5 as a front (``FRONT``): each method at its fast setting (its defaults) and its lean
  one (one member per pass; SVE factored with bfloat16 factors), stored and trainable parameters apart,
  inference memory at the full depth and latency against Single at batch 1 (full depth) and 16 (per block),
  with the rows no other row beats on both marked.
- ``rule``: one SV layer of each shape of the two settings, factored against cached and per-call merged
  weights over the tokens per member: the measurements behind ``sve.layers.sv_inference``'s rule.
- ``weights``: why batch 1 costs what it does. One layer of each shape, at the tokens per member of one
  example (ViT-S 197, BERT 128): M members through one shared weight (the base matmul of LoRA-Ensemble and
  BatchEnsemble), through a LoRA-Ensemble layer, through SVE's cached merged weights, and through one weight
  repeated M times in the same batched matmul. The last separates the two costs of distinct member weights:
  splitting one large matmul into M smaller ones, and reading M weights instead of one.

Writes ``<out>/{vit_s,bert_base,table5,front,rule,weights}.json`` (with the command, commit and versions) and
``<out>/bench.md`` (shown in docs/benchmark.md). ``--tiny``: tiny backbones, 1 round, for the tests.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import statistics
import time
import types
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from sve.bench.counters import (
    count_flops,
    interleaved_times,
    minor_faults,
    paired_ratio,
    paired_ratios,
    peak_memory,
    resident_bytes,
    verdict,
)
from sve.layers import LoRALayer, SVLinear, weight_matrix
from sve.members import to_device
from sve.methods import registry
from sve.paths import CONFIGS
from sve.runs.results import command_line, git_commit, package_versions, write_json
from sve.runs.run import instantiate
from sve.training.allocator import set_cpu_allocator

MB = 2**20


# --- settings -------------------------------------------------------------------------------------------


@dataclass
class Setting:
    name: str
    title: str
    ensemble_size: int
    overrides: list[str]  # Hydra overrides selecting the backbone and its data
    modality: str
    tokens: int  # image size for images, sequence length for text
    depth_key: str
    full_depth: int
    vocab: int = 0
    num_classes: int = 2
    notes: list[str] = field(default_factory=list)

    def backbone_overrides(self, layers: int | None) -> list[str]:
        return [*self.overrides, f"{self.depth_key}={layers or self.full_depth}"]

    def batch(self, B: int, seed: int = 0) -> dict:
        g = torch.Generator().manual_seed(seed)
        labels = torch.randint(0, self.num_classes, (B,), generator=g)
        if self.modality == "image":
            return {"pixel_values": torch.randn(B, 3, self.tokens, self.tokens, generator=g), "labels": labels}
        ids = torch.randint(1, self.vocab, (B, self.tokens), generator=g)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


BERT_BASE = ["backbone=tiny_bert", "backbone.name=bert_base_random", "backbone.config.hidden_size=768",
             "backbone.config.num_attention_heads=12", "backbone.config.intermediate_size=3072",
             "backbone.config.vocab_size=30522", "backbone.config.max_position_embeddings=512",
             "dataset=synthetic_text", "dataset.max_length=128"]  # fmt: skip


def settings(tiny: bool) -> dict[str, Setting]:
    if tiny:
        return {
            "vit_s": Setting("vit_s", "tiny ViT (test)", 2, ["backbone=tiny_vit", "dataset=synthetic_image"],
                             "image", 32, "++backbone.model_kwargs.depth", 2, num_classes=4),
            "bert_base": Setting("bert_base", "tiny BERT (test)", 2, ["backbone=tiny_bert", "dataset=synthetic_text"],
                                 "text", 16, "backbone.config.num_hidden_layers", 2, vocab=141),
        }
    return {
        "vit_s": Setting("vit_s", "ViT-S/16 (384 wide, 6 heads, MLP 1536, 197 tokens), M = 4", 4,
                         ["backbone=vit_small_random", "dataset=synthetic_image"], "image", 224,
                         "++backbone.model_kwargs.depth", 12, num_classes=10),
        "bert_base": Setting("bert_base", "BERT-base (768 wide, 12 heads, MLP 3072, sequence 128), M = 8", 8,
                             BERT_BASE, "text", 128, "backbone.config.num_hidden_layers", 12, vocab=30522),
    }


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=overrides)


class Builder:
    """Methods on copies of one random backbone (so every SVE variant decomposes the same weights, once)."""

    def __init__(self, setting: Setting, layers: int | None, svd_cache: str | None, device: torch.device):
        self.setting, self.layers, self.svd_cache, self.device = setting, layers, svd_cache, device
        torch.manual_seed(0)
        self.pristine = instantiate(compose_cfg(setting.backbone_overrides(layers)).backbone)

    def method(self, name: str, *overrides: str, ensemble_size: int | None = None):
        M = ensemble_size or self.setting.ensemble_size
        decomposes = "svd_cache" in registry.option_config(name)  # the methods whose SVD a cache keeps
        extra = [f"method.svd_cache={self.svd_cache}"] if decomposes and self.svd_cache else []
        cfg = compose_cfg([*self.setting.backbone_overrides(self.layers), f"method={name}", *extra, *overrides])
        torch.manual_seed(1)
        method = instantiate(cfg.method, backbone=copy.deepcopy(self.pristine), ensemble_size=M,
                             num_classes=self.setting.num_classes)
        return method.to(self.device)

    def datamodule(self):
        """A few synthetic examples, for the methods that fit something after training (Laplace)."""
        cfg = compose_cfg([*self.setting.backbone_overrides(self.layers), "dataset.num_train=4",
                           "dataset.batch_size=2"])
        dm = instantiate(cfg.dataset)
        dm.attach(self.pristine)
        dm.setup()
        return dm


def rebuild(method):
    """The rebuild formulation: every SV layer materialises its members' weights, with autograd, in every
    forward (training included); the same SVE otherwise."""
    for layer in method.sv_layers():
        layer.path = types.MethodType(lambda self, x, K: "merged", layer)
    return method


# --- steps ----------------------------------------------------------------------------------------------


class Candidate:
    """A method with its optimiser; ``train_step`` and ``eval_step`` are what gets measured."""

    def __init__(self, method, lr: float = 1e-4):
        self.method = method
        self.optimizer = torch.optim.AdamW(method.trainable_parameters(), lr=lr)

    def train_step(self, batch: dict) -> None:
        m = self.method
        m.train()
        m.loss(m(batch), batch["labels"]).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        m.constrain_()

    @torch.no_grad()
    def eval_step(self, batch: dict) -> None:
        self.method.eval()
        self.method(batch)

    def resident(self) -> int:
        return resident_bytes(self.method, self.optimizer.state)


def measure(candidates: dict[str, Candidate], kind: str, batch: dict, repeats: int, device) -> dict:
    """Warm-up, then one pass counting FLOPs and memory, then interleaved timing rounds; per candidate:
    ms (median), flops, peak bytes, the raw seconds (for paired ratios) and the minor page faults of one more
    call after the timed rounds (in the steady state)."""
    steps = {n: (lambda c=c: c.train_step(batch)) if kind == "train" else (lambda c=c: c.eval_step(batch))
             for n, c in candidates.items()}
    out = {}
    for name, step in steps.items():
        step()  # warm-up: caches, optimiser state, lazy inits
        c = candidates[name]  # evaluation needs no optimiser state
        resident = c.resident() if kind == "train" else resident_bytes(c.method)
        flops = count_flops(step)
        out[name] = {"flops": flops, "peak_bytes": resident + peak_memory(step, device)}
    times = interleaved_times(steps, repeats, device, warmup=0)
    for name in steps:
        out[name]["ms"] = 1e3 * statistics.median(times[name])
        out[name]["seconds"] = times[name]
        out[name]["minor_faults"] = minor_faults(steps[name])
    return out


# --- part 1: the ensemble benchmark per setting -----------------------------------------------------------

LABELS = {
    "dense": "M dense copies", "single": "Single (one model)", "sve_factored": "SVE, factored",
    "sve": "SVE, default (inference and members_at_once auto)", "sve_batched": "SVE, auto, all members batched",
    "sve_one_at_a_time": "SVE, one member at a time, merged per call",
    "rebuild": "Rebuild U diag(s_m) V^T per forward", "lora_ensemble": "LoRA-Ensemble",
    "lora_ensemble_auto": "LoRA-Ensemble, members_at_once auto", "batch_ensemble": "BatchEnsemble",
    "batch_ensemble_auto": "BatchEnsemble, members_at_once auto",
}


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
    evaluate = ["dense", "single", "sve_factored", "sve", "sve_batched", "sve_one_at_a_time", "lora_ensemble",
                "lora_ensemble_auto", "batch_ensemble", "batch_ensemble_auto"]
    for kind, names, B in (("train", train, args.train_batch), ("eval_b16", evaluate, 16), ("eval_b1", evaluate, 1)):
        log(f"[{setting.name}] {kind}: batch {B} per member, {args.repeats} rounds")
        batch = to_device(setting.batch(B), device)
        results[kind] = measure({n: candidates[n] for n in names}, kind.split("_")[0], batch, args.repeats, device)
    # M dense fine-tunes = M independent Single steps (same work; no need to hold M copies and their moments).
    single = results["train"]["single"]
    results["train"]["dense"] = {"flops": M * single["flops"], "peak_bytes": M * single["peak_bytes"],
                                 "ms": M * single["ms"], "seconds": [M * s for s in single["seconds"]],
                                 "derived": f"{M} x single"}
    for rows in results.values():
        for name, row in rows.items():
            row["ratio_to_dense"] = paired_ratio({k: v["seconds"] for k, v in rows.items()}, name, "dense")
    report = {
        "setting": {"name": setting.name, "title": setting.title, "ensemble_size": M,
                    "blocks": args.layers or setting.full_depth, "full_depth": setting.full_depth,
                    "train_batch_per_member": args.train_batch, "device": str(device), "repeats": args.repeats},
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
    candidates = {"sve": Candidate(builder.method("sve")),
                  "dense": Candidate(builder.method("deep_ensemble", "method.mode=in_memory"))}
    batch = to_device(setting.batch(16), device)
    times = interleaved_times({n: (lambda c=c: c.eval_step(batch)) for n, c in candidates.items()}, args.repeats,
                              device, warmup=1)
    return {"blocks": setting.full_depth, **{n: {"ms": 1e3 * statistics.median(t), "seconds": t,
                                                  "ratio_to_dense": paired_ratio(times, n, "dense")}
                                              for n, t in times.items()}}


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
        ("eval at batch 16 per member, SVE (default) / M dense", paired_ratios(seconds["eval_b16"], "sve", "dense"),
         1.0, True),
        ("training step, SVE / M dense", paired_ratios(seconds["train"], "sve", "dense"),
         0.90 if setting.name == "vit_s" else 1.0, True),
        ("training step, rebuild / SVE (speed-up over rebuilding)", paired_ratios(seconds["train"], "rebuild", "sve"),
         1.3, False),
    ]
    if "eval_b16_full_depth" in report:
        full = report["eval_b16_full_depth"]
        rows.insert(1, (f"eval at batch 16 per member, full depth ({full['blocks']} blocks), SVE (default) / M dense",
                        paired_ratios({k: full[k]["seconds"] for k in ("sve", "dense")}, "sve", "dense"), 1.0, True))
    if setting.name == "bert_base":
        rows.append(("eval at batch 1 per member, SVE (default) / LoRA-Ensemble",
                     paired_ratios(seconds["eval_b1"], "sve", "lora_ensemble"), 1.0, True))
    return [{"what": what, "value": statistics.median(r), "rounds": r, "op": "<=" if at_most else ">=", "limit": limit,
             "verdict": verdict(r, limit, at_most)} for what, r, limit, at_most in rows]


# --- part 2: Table 5 -------------------------------------------------------------------------------------

TABLE5_DEFAULT = ["svf", "single_lora", "mc_dropout", "deep_ensemble", "batch_ensemble", "lora_ensemble",
                  "last_layer_ensemble", "checkpoint_ensemble", "bayes_lora_llla", "blob", "sve", "sve_factored",
                  "sve_lean", "sve_top", "sve_top32"]  # fmt: skip  (top-r: beyond the paper, sve.layers.sv_top)
# SVE variants beside the default (Table 5's "sve" row): method config and overrides.
VARIANTS = {"sve_factored": ("sve", ["method.inference=factored"]),
            "sve_lean": ("sve", ["method.inference=factored", "method.factor_dtype=bfloat16"])}
NOT_BY_DEFAULT = {"bayes_lora_la": "its KFAC Laplace fit over every LoRA factor of BERT-base took 508 s on this "
                                   "CPU; add it with --table5-methods"}


def prepare(method, builder: Builder) -> None:
    """Puts a method in its evaluation state without training, by the hooks a run calls: one epoch end per member
    (a checkpoint ensemble's snapshots), then ``after_fit``, on the training data where the method fits some
    after training (a Laplace posterior; ``fits_after_training``)."""
    for _ in range(method.ensemble_size):
        method.on_train_epoch_end(None)
    method.after_fit(builder.datamodule() if method.fits_after_training else None)


def sample_overrides(name: str, members: int) -> list[str]:
    """``members`` samples for a method whose members are samples of one model (the registry's ``sampled``); the
    builder gives every other method ``members`` members already."""
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
            "train_memory_bytes": train_bytes, "infer_memory_bytes": infer_bytes,
            "infer_gflops": flops / 1e9, "infer_ms": 1e3 * statistics.median(times[name]),
            "infer_ratio_to_single": paired_ratio(times, name, "single"),
            "infer_ratios_to_single": paired_ratios(times, name, "single"),
            "members": cand.method.num_members(),
        }
        if cand is not single:
            del cand
            gc.collect()
    if "deep_ensemble" in entries:
        entries["deep_ensemble"]["train_memory_bytes"] = M * entries["single"]["train_memory_bytes"]
        notes["deep_ensemble"] = (f"train_memory_bytes = {M} x single's measured peak: {M} copies trained jointly "
                                  "in memory hold M x (weights, gradients, Adam moments, activations)")
    notes["parameters"] = ("every stored parameter, frozen ones included (SVE's U and V: 1.5x the weights they "
                           "replace in float32); trainable_parameters beside it")
    notes["sve"] = ("the default configuration: merged weights of all members cached for evaluation (M x the wrapped "
                    "weights: the inference memory), members batched at batch 1; sve_factored: the paper's factored "
                    "product (no cache); sve_lean: factored with bfloat16 U and V (not Table 5 rows)")
    for name, why in NOT_BY_DEFAULT.items():
        if name not in args.table5_methods:
            notes[name] = f"not measured by default: {why}"
    target = None
    if "sve" in entries and "lora_ensemble" in entries:
        target = latency_target(builder, batch, args, device)
    return {
        "setting": {"backbone": "bert_base (random weights)" if not args.tiny else "tiny_bert",
                    "ensemble_size": M, "batch_size": 1, "sequence_length": setting.tokens,
                    "device": str(device), "repeats": args.repeats, "layers": setting.full_depth},
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
        measured.append({"threads": n, "sve_ms": 1e3 * statistics.median(times["sve"]),
                         "lora_ensemble_ms": 1e3 * statistics.median(times["lora_ensemble"]),
                         "value": statistics.median(ratios), "rounds": ratios, "verdict": verdict(ratios, 1.0)})
    torch.set_num_threads(threads[0])
    return {"what": "batch-1 latency, SVE (default) / LoRA-Ensemble, timed against each other", "limit": 1.0,
            **{k: measured[0][k] for k in ("value", "rounds", "verdict")}, "by_threads": measured}


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# --- part 2b: Table 5 as a front -------------------------------------------------------------------------

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


def front_part(setting: Setting, args, device) -> dict:
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
                    row.update(parameters=counts["total"], trainable_parameters=counts["trainable"],
                               members=cand.method.num_members())
                for b, batch in batches.items():
                    step = partial(cand.eval_step, batch)
                    step()  # warm-up: the merged cache, lazy inits
                    if depth == "full":
                        row[f"infer_memory_bytes_b{b}"] = resident_bytes(cand.method) + peak_memory(step, device)
                    if timed_on[b] == depth:
                        reference = partial(singles[depth].eval_step, batch)
                        times = interleaved_times({"single": reference, name: step} if name != "single"
                                                  else {"single": reference}, args.repeats, device, warmup=0)
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
    return {"setting": {"backbone": "bert_base (random weights)" if not args.tiny else "tiny_bert",
                        "ensemble_size": M, "sequence_length": setting.tokens, "device": str(device),
                        "repeats": args.repeats, "layers": setting.full_depth, "timed_blocks_b16": args.layers,
                        "batches": list(FRONT_BATCHES)},
            "rows": rows}


def front_markdown(part: dict) -> list[str]:
    s = part["setting"]
    lines = [f"### Table 5 as a front: {s['backbone']}, M = {s['ensemble_size']}, sequence {s['sequence_length']}",
             "", f"{s['device']}. Inference memory (resident weights and caches plus the evaluation's peak) at the "
             f"full depth ({s['layers']} layers); latency as a ratio to Single, timed in the same rounds (median of "
             f"{s['repeats']}): at batch 1 at the full depth, at batch 16 per member on {s['timed_blocks_b16']} "
             "block(s). Fast: the method as its defaults run it; lean: its least-memory setting (one member per "
             "pass; SVE factored with bfloat16 factors). Stored parameters count every tensor kept, frozen ones "
             "included (U and V); trainable ones are what the optimiser updates. ★: on the front (no other row "
             "has both less or equal memory and latency).", "",
             "| method | setting | stored (M) | trainable (M) | memory b1 MB | latency b1 | memory b16 MB | "
             "latency b16 |", "|---|---|---|---|---|---|---|---|"]
    for r in part["rows"]:
        star = {b: " ★" if r[f"on_front_b{b}"] else "" for b in s["batches"]}
        lines.append(f"| {r['method']} | {r['setting']} | {r['parameters'] / 1e6:.1f} | "
                     f"{r['trainable_parameters'] / 1e6:.2f} | {r['infer_memory_bytes_b1'] / MB:.0f} | "
                     f"{r['ratio_to_single_b1']:.2f}x{star[1]} | {r['infer_memory_bytes_b16'] / MB:.0f} | "
                     f"{r['ratio_to_single_b16']:.2f}x{star[16]} |")
    return lines + [""]


# --- part 3: the inference rule ----------------------------------------------------------------------------


def rule_part(args, device) -> dict:
    shapes = [(32, 32, 2), (32, 64, 2)] if args.tiny else [(384, 384, 4), (384, 1536, 4), (768, 768, 8),
                                                            (768, 3072, 8)]
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
            row = {"in": in_f, "out": out_f, "members": K, "tokens_per_member": N,
                   **{f"{m}_ms": 1e3 * statistics.median(t) for m, t in times.items()},
                   "cached_ratio": paired_ratio(times, "cached", "factored"),
                   "merged_ratio": paired_ratio(times, "merged", "factored")}
            out.append(row)
            log(f"[rule] {in_f}->{out_f} K={K} N={N}: cached {row['cached_ratio']:.2f}, "
                f"merged {row['merged_ratio']:.2f} x factored")
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


# --- part 4: one shared weight against M distinct ones (batch 1) --------------------------------------------


def weight_steps(x, bases, loras, svs, repeated, shape: tuple[int, int, int]) -> dict:
    """The timed steps of one shape (built in a function, so every closure holds this shape's tensors)."""
    return {"shared": lambda: [torch.addmm(b.bias, x, b.weight.t()) for b in bases],
            "lora_ensemble": lambda: [layer(x) for layer in loras],
            "sve_cached": lambda: [layer(x) for layer in svs],
            "one_weight_split": lambda: [torch.baddbmm(b, x.view(*shape), W) for W, b in repeated]}


def weights_part(args, device) -> dict:
    """Each step runs the members through ``copies`` distinct layers of one shape, enough that the shared
    weights alone (64 MB) exceed the CPU's last-level cache: as in a full model, every call then reads its
    weights from memory. (One layer timed alone keeps SVE's M merged weights in the cache between calls and
    hides the cost of reading them.)"""
    shapes = [(32, 32, 2, 8)] if args.tiny else [(384, 384, 4, 197), (384, 1536, 4, 197), (1536, 384, 4, 197),
                                                 (768, 768, 8, 128), (768, 3072, 8, 128), (3072, 768, 8, 128)]
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
        row = {"in": in_f, "out": out_f, "members": K, "tokens_per_member": N, "copies": copies,
               "shared_ms": 1e3 * statistics.median(times["shared"]) / copies,
               **{f"{name}_ratio": paired_ratio(times, name, "shared") for name in steps if name != "shared"}}
        rows.append(row)
        log(f"[weights] {in_f}->{out_f} K={K} N={N} ({copies} layers): LoRA-E {row['lora_ensemble_ratio']:.3f}, "
            f"SVE cached {row['sve_cached_ratio']:.3f}, one weight split {row['one_weight_split_ratio']:.3f} x shared")
        del svs, loras, bases, repeated, steps
        gc.collect()
    return {"rows": rows, "stream_bytes": stream_bytes}


# --- output ----------------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


def fmt(x, digits=2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def ensemble_markdown(report: dict) -> list[str]:
    s = report["setting"]
    lines = [f"### {s['title']}", "",
             f"{s['blocks']} of {s['full_depth']} blocks, {s['device']}, median of {s['repeats']} interleaved rounds; "
             f"times as ratios to M dense copies in the same round (lower is better), training at batch "
             f"{s['train_batch_per_member']} per member.", "",
             "| candidate | train step | eval, batch 16 | eval, batch 1 | train GFLOPs | eval-16 GFLOPs | "
             "train peak MB | eval-16 peak MB | eval-16 page faults |", "|---|---|---|---|---|---|---|---|---|"]
    for name, label in LABELS.items():
        t, e16, e1 = (report[k].get(name) for k in ("train", "eval_b16", "eval_b1"))
        cell = lambda r: "–" if r is None else f"{r['ratio_to_dense']:.2f}x ({r['ms']:.0f} ms)"  # noqa: E731
        gf = lambda r: "–" if r is None else f"{r['flops'] / 1e9:.1f}"  # noqa: E731
        mb = lambda r: "–" if r is None else f"{r['peak_bytes'] / MB:.0f}"  # noqa: E731
        faults = "–" if e16 is None or "minor_faults" not in e16 else f"{e16['minor_faults']:,}"
        lines.append(f"| {label} | {cell(t)} | {cell(e16)} | {cell(e1)} | {gf(t)} | {gf(e16)} | {mb(t)} | {mb(e16)} "
                     f"| {faults} |")
    lean = report["lean_memory"]
    lines += ["", "Targets:", ""]
    lines += [f"- {t['what']}: {t['value']:.2f} (rounds {min(t['rounds']):.2f}-{max(t['rounds']):.2f}; target "
              f"{t['op']} {t['limit']}): **{t['verdict']}**" for t in report["targets"]]
    bf16 = lean["bf16_weight_error"]
    lines += ["", f"Weight memory at full depth: single {lean['single_bytes'] / MB:.0f} MB; SVE with float32 factors "
              f"{lean['sve_float32_ratio']:.2f}x, with bfloat16 factors {lean['sve_bfloat16_ratio']:.2f}x "
              f"(reconstruction error |U diag(s) V^T - W| / |W| with bfloat16 factors: mean {bf16['mean']:.1e}, max "
              f"{bf16['max']:.1e} over {bf16['layers']} layers). SVE's merged "
              f"cache (evaluation, all members): {report['merged_cache_bytes'] / MB:.0f} MB at this depth.", ""]
    return lines


def table5_markdown(t5: dict) -> list[str]:
    s = t5["setting"]
    lines = [f"### Table 5 setting: {s['backbone']}, M = {s['ensemble_size']}, batch 1, "
             f"sequence {s['sequence_length']}",
             "", f"{s['device']}, {s['layers']} layers, median of {s['repeats']} rounds interleaved with Single.", "",
             "| method | parameters (M) | +% | trainable (M) | train memory MB | +% | infer memory MB | +% | "
             "infer GFLOPs | infer ms | x Single |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    base = t5["methods"]["single"]
    pct = lambda m, k: "–" if m[k] is None else f"{100 * (m[k] - base[k]) / base[k]:+.0f}"  # noqa: E731
    for name, m in t5["methods"].items():
        train = "–" if m["train_memory_bytes"] is None else f"{m['train_memory_bytes'] / MB:.0f}"
        lines.append(f"| {name} | {m['parameters'] / 1e6:.1f} | {pct(m, 'parameters')} | "
                     f"{m['trainable_parameters'] / 1e6:.2f} | {train} | {pct(m, 'train_memory_bytes')} | "
                     f"{m['infer_memory_bytes'] / MB:.0f} | {pct(m, 'infer_memory_bytes')} | {m['infer_gflops']:.1f} | "
                     f"{m['infer_ms']:.0f} | {m['infer_ratio_to_single']:.2f} |")
    lines += [""] + [f"- {k}: {v}" for k, v in t5["notes"].items()]
    if "target" in t5:
        t = t5["target"]
        lines += ["", f"Target: {t['what']} (target <= {t['limit']}):", ""]
        lines += [f"- {m['threads']} thread{'s' if m['threads'] > 1 else ''}: {m['value']:.3f} (rounds "
                  f"{min(m['rounds']):.3f}-{max(m['rounds']):.3f}; SVE {m['sve_ms']:.0f} ms, LoRA-Ensemble "
                  f"{m['lora_ensemble_ms']:.0f} ms): **{m['verdict']}**" for m in t["by_threads"]]
    return lines + [""]


def rule_markdown(rule: dict) -> list[str]:
    lines = ["### The inference rule (one SV layer, tokens per member from which merged weights are faster)", "",
             "| in | out | members | cached from N | merged per call from N |", "|---|---|---|---|---|"]
    lines += [f"| {c['in']} | {c['out']} | {c['members']} | {c['cached_from_tokens']} | {c['merged_from_tokens']} |"
              for c in rule["crossovers"]]
    return lines + [""]


def weights_markdown(part: dict) -> list[str]:
    lines = ["### Batch 1: one shared weight against M distinct ones (one layer, tokens of one example per member)",
             "", "Time relative to the M members' tokens through one shared weight in one matmul, in the same round "
             f"(median of {part['meta']['args']['repeats']} rounds).", "",
             "| in | out | members | tokens per member | shared weight (per layer) | LoRA-Ensemble layer | "
             "SVE, cached merged weights | one weight, split M ways |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['in']} | {r['out']} | {r['members']} | {r['tokens_per_member']} | 1.00 ({r['shared_ms']:.1f} ms) "
              f"| {r['lora_ensemble_ratio']:.3f} | {r['sve_cached_ratio']:.3f} | {r['one_weight_split_ratio']:.3f} |"
              for r in part["rows"]]
    return lines + [""]


def allocator_words(meta: dict) -> str:
    policy = meta.get("cpu_allocator", "system")
    if policy == "tuned" and not meta.get("cpu_allocator_tuned"):
        return "tuned (not applied: not glibc)"
    return {"tuned": "tuned (sve/training/allocator.py: freed memory kept for reuse)",
            "system": "as the C library sets it"}[policy]


def write_markdown(out: Path, parts: dict) -> None:
    lines = ["# Cost benchmark (`make bench`)", "",
             f"`{parts['meta']['command']}` at commit {parts['meta']['git_commit']}, torch "
             f"{parts['meta']['versions']['torch']}, {parts['meta']['threads']} threads, CPU allocator "
             f"{allocator_words(parts['meta'])}.", ""]
    earlier = {key: part["meta"] for key, part in parts.items() if key != "meta"
               and (part["meta"]["command"], part["meta"]["git_commit"]) != (parts["meta"]["command"],
                                                                            parts["meta"]["git_commit"])}
    lines += [f"Part `{key}` is from an earlier run: `{meta['command']}` at commit {meta['git_commit']}."
              for key, meta in earlier.items()] + ([""] if earlier else [])
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


def run_parts(args, device: torch.device, known_parts: tuple[str, ...]) -> None:
    """Measures ``args.parts`` (the options of ``sve.cli.bench``) on ``device``, each written to
    ``<args.out>/<part>.json``, and the table of these and of the ``known_parts`` measured before to
    ``<args.out>/bench.md``."""
    allocator_tuned = set_cpu_allocator(args.cpu_allocator)
    if args.threads or device.type == "cpu":
        torch.set_num_threads(args.threads or 1)
    all_settings = settings(args.tiny)
    parts: dict = {"meta": {"command": command_line(), "git_commit": git_commit(), "versions": package_versions(),
                            "threads": torch.get_num_threads(), "device": str(device),
                            "cpu_allocator": args.cpu_allocator, "cpu_allocator_tuned": allocator_tuned, "args": {
                                k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}}
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.parts:
        start = time.perf_counter()
        if name in ("vit_s", "bert_base"):
            parts[name] = ensemble_part(all_settings[name], args, device)
        elif name == "table5":
            parts[name] = table5_part(all_settings["bert_base"], args, device)
        elif name == "front":
            parts[name] = front_part(all_settings["bert_base"], args, device)
        elif name == "rule":
            parts[name] = rule_part(args, device)
        else:
            parts[name] = weights_part(args, device)
        parts[name]["meta"] = {**parts["meta"], "seconds": time.perf_counter() - start}
        write_json(args.out / f"{name}.json", parts[name])
        log(f"{name}: {time.perf_counter() - start:.0f} s, written to {args.out / f'{name}.json'}")
    previous = {k: json.loads((args.out / f"{k}.json").read_text()) for k in known_parts
                if k not in parts and (args.out / f"{k}.json").exists()}  # parts not rerun this time
    write_markdown(args.out, {**previous, **parts})
    log(f"table: {args.out / 'bench.md'}")

