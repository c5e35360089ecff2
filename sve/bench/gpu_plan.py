"""The ``plan`` part of ``sve-bench --gpu-check``: the memory plan (``sve.runs.plan``, ``plan=true``) against
what one real training step and one evaluation forward allocate on this GPU.

The run is Table 3's SVE row (``experiment=arc_easy_llama2 method=sve trainer=gpu``: LLaMA-2-7B's
architecture, bf16 weights and factors, gradient checkpointing, batch 1, length 512) at M = 4 and 16, each
with and without ``method.members_at_once=1``, with random weights and random factors of the SVD's shapes
(the memory is the same; 224 SVDs of 4096-wide matrices would take longer than the whole check). Its depth
is the largest of ``LAYERS`` whose planned peaks all fit in ``FILL`` of the card (all 32 layers on a 40 GiB
card or larger).

Each plan and each measurement runs in a process of its own (``python -m sve.cli.gpu_plan plan|measure``):
fake tensors now and then corrupt the heap of a process that builds many models (``sve.runs.plan``), and a
fresh process measures its own allocator peak and CUDA context. The measured step is the plan's
(``sve.runs.plan.train_step``'s order: chunks, backward, clipping, AdamW step) under CUDA autocast, taken
twice: the second, with the optimiser state resident, is measured (the plan's ``train_peak``). Then the
optimiser and gradients are dropped and one evaluation forward is measured.

Compared: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` against the plan's peaks
without its CUDA context; the context itself measured as the device's used memory (``mem_get_info``) minus
what the allocator reserved, after the first cuBLAS call (other processes on the GPU would count too).
A check passes when the plan's total (with its 0.5 GiB context estimate) is within ``PLAN_TOLERANCE`` of the
measured total (allocated peak plus measured context), the CPU validation's criterion (tests/runs/test_plan.py).
"""

from __future__ import annotations

import gc
import json
import math
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
from omegaconf import OmegaConf, open_dict

from sve.bench.gpu_report import GIB, Check

BASE = [
    "experiment=arc_easy_llama2",
    "method=sve",
    "trainer=gpu",
]  # sve.paper.plan_tables.table_runs("table3")'s SVE row
VARIANTS = {
    "SVE M=16": ["ensemble_size=16"],
    "SVE M=16, members_at_once=1": ["ensemble_size=16", "method.members_at_once=1"],
    "SVE M=4": ["ensemble_size=4"],
    "SVE M=4, members_at_once=1": ["ensemble_size=4", "method.members_at_once=1"],
}
LAYERS = (32, 24, 16, 8, 4, 2)
FILL = 0.9  # of the card's memory: the rest for the allocator's fragmentation and other processes
PLAN_TOLERANCE = 0.10


def config(overrides: list[str], layers: int):
    """The composed run config with the backbone's architecture at ``layers`` decoder layers."""
    from sve.runs.architectures import offline_backbone
    from sve.runs.resolvers import compose_run

    cfg = compose_run([*BASE, *overrides])
    arch = dict(offline_backbone(cfg.backbone)["config"], num_hidden_layers=layers)
    with open_dict(cfg):
        cfg.backbone.config = arch
    return cfg


def choose_layers(peak_at, capacity: int, layers=LAYERS, fill: float = FILL) -> int | None:
    """The largest depth whose planned peak ``peak_at(n)`` (bytes) fits ``fill * capacity``; else None."""
    return next((n for n in sorted(layers, reverse=True) if peak_at(n) <= fill * capacity), None)


def plan_error(planned: int, measured: int) -> float:
    """The plan's error in percent of the measured bytes (positive: the plan says more)."""
    return 100 * (planned - measured) / measured if measured else math.inf


# ----- in a process of its own ----------------------------------------------------------------------------------
def planned_peaks(overrides: list[str], layers: int, capacity: int) -> dict:
    from sve.runs.plan import plan

    p = plan(config(overrides, layers), capacity_gib=capacity / GIB, alternatives=False)
    return {
        "train_peak": p.train_peak,
        "eval_peak": p.eval_peak,
        "context": p.per_device["context"],
        "stored": sum(p.stored.values()),
        "merged_cache": p.eval["merged cache"],
    }


@contextmanager
def random_factors():
    """SV layers built inside get random factors of the SVD's shapes and dtypes, on the weight's device."""
    import sve.layers.sv_conv
    import sve.layers.sv_linear
    import sve.layers.sv_top
    from sve.layers.member import weight_matrix

    def fake(layer, svd_dtype=torch.float64, factor_dtype=None, cache=None):
        W = weight_matrix(layer)
        (out, inner), dtype = W.shape, factor_dtype or W.dtype
        r = min(out, inner)
        U = torch.randn(out, r, dtype=dtype, device=W.device) / math.sqrt(r)
        Vh = torch.randn(r, inner, dtype=dtype, device=W.device) / math.sqrt(inner)
        return U, torch.rand(r, dtype=svd_dtype, device=W.device) + 0.5, Vh, None

    modules = (sve.layers.sv_linear, sve.layers.sv_top, sve.layers.sv_conv)
    saved = [m.decompose_with_source for m in modules]
    for m in modules:
        m.decompose_with_source = fake
    try:
        yield
    finally:
        for m, original in zip(modules, saved):
            m.decompose_with_source = original


def train_step(method, batch: dict, optimizer, dtype, clip) -> None:
    """One step as ``sve.runs.plan.train_step`` plans it (every chunk here), under autocast to ``dtype`` (None:
    none) on the batch's device."""
    method.train()
    labels = batch["labels"]
    chunks = method.training_chunks() if hasattr(method, "training_chunks") else None
    with torch.autocast(labels.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        if chunks is None:
            loss = method.loss(method(batch), labels)
        else:  # the module's chunked step runs each chunk's backward inside its training_step, so in autocast
            M = sum(len(c) for c in chunks)
            for members in chunks:
                loss = method.loss(method.chunk_logits(batch, members), labels, ensemble_size=M)
                with method.select(members):
                    loss.backward()
                del loss
    if chunks is None:
        loss.backward()  # outside autocast, as Lightning runs it
        del loss
    if clip:
        torch.nn.utils.clip_grad_norm_(method.trainable_parameters(), float(clip))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measured_peaks(overrides: list[str], layers: int) -> dict:
    """Peaks of the real step and evaluation forward on this GPU, and the CUDA context (module docstring)."""
    from sve.layers.draws import unfuse_attention_dropout
    from sve.members import to_device
    from sve.runs import plan
    from sve.runs.architectures import offline_backbone
    from sve.runs.layout import device_layout
    from sve.runs.run import instantiate

    cfg = config(overrides, layers)
    device = torch.device("cuda")
    a = torch.randn(64, 64, device=device)
    (a @ a).sum().item()  # the context and cuBLAS's handle and workspace exist from here on
    del a
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    context = total - free - torch.cuda.memory_reserved()
    layout = device_layout(cfg)
    how = plan.PRECISIONS[layout.precision]
    datamodule = instantiate(cfg.dataset)
    node = OmegaConf.create(OmegaConf.to_container(cfg.method, resolve=True))
    node.svd_cache = None
    with random_factors(), device:
        backbone = instantiate(OmegaConf.create(offline_backbone(cfg.backbone)))
        datamodule.attach(backbone)
        method = instantiate(
            node,
            backbone=backbone,
            ensemble_size=int(cfg.ensemble_size),
            num_classes=datamodule.num_classes,
            task=cfg.dataset.name,
        )
    method.to(device)
    if bool(cfg.get("exact_draws", True)):
        unfuse_attention_dropout(method.backbone)
    if how is not None and how[0] == "cast":
        method.to(how[1])
    dtype = how[1] if how is not None and how[0] == "autocast" else None
    rows = -(-int(cfg.dataset.batch_size) // (layout.devices * layout.accumulate))
    batch = to_device(plan.example_batch(datamodule, backbone, rows), device)
    optimizer = plan.optimizer_factory(cfg, method)()
    clip = OmegaConf.select(cfg, "trainer.gradient_clip_val", default=None)
    train_step(method, batch, optimizer, dtype, clip)  # creates the optimiser state
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    train_step(method, batch, optimizer, dtype, clip)
    torch.cuda.synchronize()
    train = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
    del optimizer
    gc.collect()
    torch.cuda.empty_cache()
    eval_rows = int(getattr(datamodule, "eval_batch_size", rows))
    eval_batch = to_device(plan.example_batch(datamodule, backbone, eval_rows), device)
    torch.cuda.reset_peak_memory_stats()
    method.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        method(eval_batch)
    torch.cuda.synchronize()
    evaluation = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
    return {
        "context": context,
        "train_allocated": train[0],
        "train_reserved": train[1],
        "eval_allocated": evaluation[0],
        "eval_reserved": evaluation[1],
        "merged_cache": bool(getattr(method, "merged_cache", False)),
    }


def child(what: str, overrides: list[str], layers: int, capacity: int = 0) -> dict:
    """``what`` (plan or measure) in a fresh process; its JSON line, or an error naming the last line it wrote."""
    out = subprocess.run(
        [sys.executable, "-m", "sve.cli.gpu_plan", what, json.dumps(overrides), str(layers), str(capacity)],
        capture_output=True,
        text=True,
    )
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or lines or [f"exit status {out.returncode}"])[-1]
        raise RuntimeError(f"{what} {overrides} at {layers} layers: {tail}")
    return json.loads(lines[-1])


# ----- the part --------------------------------------------------------------------------------------------------
def compare(name: str, layers: int, plan_: dict, real: dict) -> tuple[list[Check], list[dict]]:
    """Rows for the table (the step without the context, and the context) and one check per phase."""
    checks, rows = [], []
    for phase in ("train", "eval"):
        planned_step = plan_[f"{phase}_peak"] - plan_["context"]
        real_step = real[f"{phase}_allocated"]
        rows.append(
            {
                "variant": name,
                "layers": layers,
                "phase": phase,
                "planned_gib": planned_step / GIB,
                "measured_gib": real_step / GIB,
                "error_pct": plan_error(planned_step, real_step),
                "reserved_gib": real[f"{phase}_reserved"] / GIB,
            }
        )
        total, real_total = plan_[f"{phase}_peak"], real_step + real["context"]
        error = plan_error(total, real_total)
        checks.append(
            Check(
                "plan",
                f"{name}, {layers} layers: {phase} peak planned within {PLAN_TOLERANCE:.0%} of measured",
                abs(error) <= 100 * PLAN_TOLERANCE,
                f"planned {total / GIB:.2f} GiB, measured {real_total / GIB:.2f} GiB (context "
                f"{real['context'] / GIB:.2f} measured, {plan_['context'] / GIB:.2f} planned): "
                f"{error:+.1f}%; merged cache planned {plan_['merged_cache'] > 0}, "
                f"used {real['merged_cache']}",
                {"planned": plan_, "measured": real},
            )
        )
    rows.append(
        {
            "variant": name,
            "layers": layers,
            "phase": "CUDA context",
            "planned_gib": plan_["context"] / GIB,
            "measured_gib": real["context"] / GIB,
            "error_pct": plan_error(plan_["context"], real["context"]),
        }
    )
    return checks, rows


def plan_part(scratch: Path) -> tuple[list[Check], list[dict], str]:
    capacity = torch.cuda.mem_get_info()[1]
    largest = next(iter(VARIANTS.values()))
    plans = {}

    def peak_at(layers: int) -> int:
        plans[layers] = child("plan", largest, layers, capacity)
        return max(plans[layers]["train_peak"], plans[layers]["eval_peak"])

    layers = choose_layers(peak_at, capacity)
    if layers is None:
        return (
            [
                Check(
                    "plan",
                    "a LLaMA-shaped model fits this card",
                    None,
                    f"not even {min(LAYERS)} layers fit {FILL:.0%} of {capacity / GIB:.1f} GiB",
                )
            ],
            [],
            "",
        )
    checks, rows = [], []
    for name, overrides in VARIANTS.items():
        print(f"[plan] {name} at {layers} layers", flush=True)
        p = plans[layers] if overrides is largest else child("plan", overrides, layers, capacity)
        c, r = compare(name, layers, p, child("measure", overrides, layers))
        checks += c
        rows += r
    note = (
        f"`{' '.join(BASE)}` (Table 3's SVE row) with LLaMA-2-7B's architecture at {layers} of 32 layers "
        f"(the most whose plan fits {FILL:.0%} of the card), random weights and factors; one training step "
        "with the optimiser state resident, then one evaluation forward, each in a fresh process. Planned and "
        "measured: the step's peak of allocated tensor memory (the plan without its CUDA context; measured: "
        "torch.cuda.max_memory_allocated after reset_peak_memory_stats); reserved: the allocator's peak "
        "including cached blocks; CUDA context: the plan's estimate against the device's used memory minus "
        "the allocator's reservation after the first cuBLAS call. Error: (planned - measured) / measured."
    )
    return checks, rows, note
