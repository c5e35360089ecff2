"""``sve-bench --gpu-check`` (``make gpu-check``): every GPU path of the framework checked on the user's own
CUDA machine, in minutes, offline (random weights, synthetic data). Writes ``results/bench/gpu.md`` and
``gpu.json`` (device, driver, torch and CUDA versions in the header) and exits 1 when a check fails. Without
CUDA it prints one line and exits 0, having checked and written nothing.

    sve-bench --gpu-check [--parts methods members inference plan distributed] [--out DIR]

Parts (judged by ``sve.bench.gpu_report``, whose docstring states the tolerances per dtype):

- ``methods``: every method config trains a few steps and evaluates through ``run()`` under ``trainer=gpu``
  with ``bf16-mixed`` and with ``16-mixed`` (Lightning's ``torch.amp.GradScaler``, checked present and
  finite at the end), on tiny BERT and tiny ViT; metrics and member logits finite; every SV layer's saved
  singular values >= 0.
- ``members``: SV layers (linear and convolution) on CUDA: each member, on each path (factored, cached,
  merged per call), against its ``merge(m)`` layer, in float32 and under bfloat16 and float16 autocast; and
  s >= 0 after an optimiser step that drives it below zero, float16 through a GradScaler.
- ``inference`` (``sve.bench.gpu_inference``): SVE's inference paths agree on BERT-base-shaped layers,
  M = 8; their latency (CUDA events) and peak memory at batch 1 and 16 against LoRA-Ensemble and Single.
- ``plan`` (``sve.bench.gpu_plan``): the memory plan against ``torch.cuda.max_memory_allocated`` for
  LLaMA-2-7B-shaped SVE at M = 4 and 16, with and without ``members_at_once=1``, as many layers as the
  card holds; the measured CUDA context.
- ``distributed`` (``sve.bench.gpu_ranks``, 2 or more GPUs): DDP and FSDP over NCCL equal one process.

Reviewed against the installed torch's documentation (docstrings of torch 2.14.1; no GPU was available when
this was written, so no line of the CUDA paths has run yet):

- ``torch.autocast(device_type, dtype)``: casts the inputs of eligible ops (matmuls, convolutions) to
  ``dtype`` inside the region; parameters stay in their dtype; backward must run outside the region (it
  runs in the dtype of the forward's ops). Used for the layer and plan steps, the backward outside.
- ``torch.amp.GradScaler("cuda")``: ``scale(loss).backward()``, then ``step(optimizer)`` (which unscales and
  skips the step when a gradient is inf/NaN) and ``update()``; ``unscale_`` before gradient clipping.
  Lightning's ``16-mixed`` creates it (``trainer.precision_plugin.scaler``); the module's chunked step
  divides kept gradients by ``get_scale()`` (``sve.training.module``).
- ``torch.cuda.Event(enable_timing=True)``: ``record()`` on the current stream, ``synchronize()`` on the end
  event before ``start.elapsed_time(end)`` (milliseconds); the time between the two records includes the
  GPU's idle gaps while the host launches kernels, which is what a batch-1 request waits for.
- ``torch.cuda.max_memory_allocated`` / ``reset_peak_memory_stats``: the caching allocator's peak of
  tensor bytes since the reset (rounded to its 512-byte blocks); the CUDA context and cuBLAS/cuDNN
  workspaces are outside it, ``memory_reserved`` adds the cached blocks, and ``mem_get_info`` is the
  device's free and total memory, all processes together (the context is measured from it).
- TF32: ``torch.backends.cuda.matmul.allow_tf32`` (default off) and ``torch.backends.cudnn.allow_tf32``
  (default on): both switched off here so float32 means float32; child processes get
  ``NVIDIA_TF32_OVERRIDE=0``.
"""

from __future__ import annotations

import math
import os
import tempfile
import traceback
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
from pytorch_lightning import Callback
from torch import nn

from sve.bench.gpu_report import Check, device_header, error_check, failed, relative_error, write_report
from sve.methods import registry

PARTS = ("methods", "members", "inference", "plan", "distributed")
BACKBONES = {"tiny_bert": "synthetic_text", "tiny_vit": "synthetic_image"}
PRECISIONS = ("bf16-mixed", "16-mixed")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def no_cuda_line() -> str:
    return (
        f"gpu-check: torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}) finds no CUDA GPU here; "
        "nothing checked, nothing written"
    )


def autocast(device: torch.device, dtype: torch.dtype):
    """Autocast to ``dtype`` on the device, or nothing for float32."""
    return nullcontext() if dtype == torch.float32 else torch.autocast(device.type, dtype=dtype)


# ----- part: every method under trainer=gpu ------------------------------------------------------------------
class PrecisionProbe(Callback):
    """Records what the precision plugin did in the last fit: whether a GradScaler ran and its final scale."""

    last: dict = {}

    def on_train_end(self, trainer, pl_module) -> None:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        PrecisionProbe.last = {
            "precision": str(trainer.precision),
            "scaler": scaler is not None,
            "scale": float(scaler.get_scale()) if scaler is not None else None,
        }


def method_overrides(method: str, backbone: str, precision: str, out: Path, trainer: str = "gpu") -> list[str]:
    """A tiny run of ``method`` (as tests/methods/test_methods_run.py runs every method): 3 training steps, one
    validation and one test batch, no checkpoints, the precision probe."""
    extra = ["method.marglik_steps=3"] if "marglik_steps" in registry.option_config(method) else []
    if registry.info(method).epoch_snapshots:  # one epoch-end checkpoint per member
        extra = ["trainer.max_epochs=2", "++trainer.limit_train_batches=2"]
    return [
        f"method={method}",
        f"backbone={backbone}",
        f"dataset={BACKBONES[backbone]}",
        f"trainer={trainer}",
        f"++trainer.precision={precision}",
        "trainer.max_epochs=1",
        "++trainer.limit_train_batches=3",
        "++trainer.limit_val_batches=1",
        "++trainer.limit_test_batches=1",
        "++trainer.enable_progress_bar=false",
        "callbacks=none",
        "+callbacks.precision_probe._target_=sve.bench.gpu_check.PrecisionProbe",
        "logger=csv",
        "ensemble_size=2",
        f"paths.output_dir={out}",
        *extra,
    ]


def judge_run(results: dict, out: Path, precision: str, probe: dict) -> tuple[bool, str]:
    """(passed, what failed or a summary) for one finished tiny run."""
    problems = []
    floats = {k: v for k, v in results["metrics"].items() if isinstance(v, float)}
    if not all(math.isfinite(v) for v in floats.values()):
        problems.append("non-finite metrics " + ", ".join(k for k, v in floats.items() if not math.isfinite(v)))
    logits = np.load(out / "predictions" / "test.npz")["member_logits"]  # (M, B, C)
    if logits.shape[0] != results["num_members"] or not np.isfinite(logits).all():
        problems.append(
            f"member logits {logits.shape}, finite {bool(np.isfinite(logits).all())}, "
            f"num_members {results['num_members']}"
        )
    if results["hardware"]["precision"] != precision:
        problems.append(f"ran in precision {results['hardware']['precision']}")
    if probe.get("scaler") != (precision == "16-mixed"):
        problems.append(f"GradScaler {'absent' if precision == '16-mixed' else 'present'}")
    if probe.get("scale") is not None and not (math.isfinite(probe["scale"]) and probe["scale"] > 0):
        problems.append(f"loss scale {probe['scale']}")
    sv = out / "singular_values.npz"
    lowest = None
    if sv.exists():
        with np.load(sv) as data:
            lowest = min(float(data[k].min()) for k in data.files if k.endswith(".members"))
        if lowest < 0:
            problems.append(f"a singular value is {lowest:.3g} < 0")
    summary = f"test/acc {results['metrics'].get('test/acc', float('nan')):.1f}, {results['num_members']} members"
    summary += f", loss scale {probe['scale']:.0f}" if probe.get("scale") is not None else ""
    summary += f", min s {lowest:.3g}" if lowest is not None else ""
    return not problems, "; ".join(problems) or summary


def methods_part(
    device: torch.device,
    out_root: Path,
    methods: list[str] | None = None,
    backbones=tuple(BACKBONES),
    precisions=PRECISIONS,
    trainer: str = "gpu",
) -> list[Check]:
    """One tiny run per method x backbone x precision (``trainer``: gpu; the tests run the same on the CPU)."""
    from sve.runs.resolvers import compose_run
    from sve.runs.run import run

    checks = []
    for backbone in backbones:
        for precision in precisions:
            for method in methods or registry.options():
                out = out_root / backbone / precision / method
                PrecisionProbe.last = {}
                name = f"{method} on {backbone}, {precision}"
                try:
                    results = run(compose_run(method_overrides(method, backbone, precision, out, trainer)))
                    passed, detail = judge_run(results, out, precision, PrecisionProbe.last)
                except Exception as err:  # noqa: BLE001 - reported as this check's failure; the rest go on
                    passed, detail = False, last_line(err)
                checks.append(Check("methods", name, passed, detail))
                print(f"[methods] {name}: {'pass' if passed else 'FAIL: ' + detail}", flush=True)
    return checks


def last_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"


# ----- part: members against their merged layers; s >= 0 ------------------------------------------------------
def sv_layers(device: torch.device, M: int = 4) -> dict[str, tuple[nn.Module, torch.Tensor]]:
    """A linear and a convolutional SV layer (random weights, members apart, per-member biases) with an input
    of M member blocks each."""
    from sve.layers import SVConv2d, SVLinear

    torch.manual_seed(0)
    layers = {
        "linear 96->64": (SVLinear.from_linear(nn.Linear(96, 64), M, sigma_init=0.2), torch.randn(M * 5, 96)),
        "conv 8->12, 3x3": (
            SVConv2d.from_conv(nn.Conv2d(8, 12, 3, padding=1), M, sigma_init=0.2),
            torch.randn(M * 2, 8, 10, 10),
        ),
    }
    for layer, _ in layers.values():
        with torch.no_grad():
            layer.biases.add_(0.1 * torch.randn_like(layer.biases))
    return {k: (layer.to(device), x.to(device)) for k, (layer, x) in layers.items()}


def members_equal_merged(device: torch.device, dtypes=DTYPES) -> list[Check]:
    """Each member on each path against ``merge(m)`` run on its block, under the same precision."""
    checks = []
    for label, (layer, x) in sv_layers(device).items():
        M = layer.num_members()
        blocks = x.chunk(M)
        for dtype in dtypes:
            errors = {}
            with torch.no_grad(), autocast(device, dtype):
                merged = [layer.merge(m)(blocks[m]) for m in range(M)]
                for path in ("factored", "cached", "merged"):
                    layer.eval()
                    layer.inference = path
                    out = layer(x).chunk(M)
                    for m in range(M):
                        errors[f"{path}, member {m}"] = relative_error(out[m], merged[m])
            layer.inference = "auto"
            checks.append(
                error_check("members", f"{label}: members = merge(m), {dtype_word(dtype)}", errors, dtype, "layer")
            )
    return checks


def dtype_word(dtype: torch.dtype) -> str:
    return "float32" if dtype == torch.float32 else f"{str(dtype).removeprefix('torch.')} autocast"


def singular_values_stay_nonnegative(device: torch.device, dtypes=DTYPES, steps: int = 30) -> list[Check]:
    """SGD steps large enough to drive singular values below zero (the gradient of |y|^2 w.r.t. s_i is
    2 s_i (v_i^T x)^2 >= 0 without a bias): after them every s is >= 0 and some are exactly 0, so the
    projection ran. float16 goes through a GradScaler, which skips the steps whose scaled gradients overflow
    (lowering its scale) until one goes through: up to ``steps`` tries."""
    from sve.layers import SVLinear

    checks = []
    for dtype in dtypes:
        torch.manual_seed(0)
        layer = SVLinear.from_linear(nn.Linear(32, 32, bias=False), 2, sigma_init=0.1).to(device).train()
        optimizer = torch.optim.SGD([layer.singular_values], lr=1e3)
        scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
        x = torch.randn(2 * 8, 32, device=device)
        tries = 0
        while tries < steps:
            tries += 1
            with autocast(device, dtype):
                loss = layer(x).float().pow(2).sum()
            (scaler.scale(loss) if scaler else loss).backward()
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if bool((layer.singular_values == 0).any()):
                break
        s = layer.singular_values.detach()
        zeros, lowest = int((s == 0).sum()), float(s.min())
        checks.append(
            Check(
                "members",
                f"s >= 0 after a step, {dtype_word(dtype)}",
                lowest >= 0 and zeros > 0,
                f"min s {lowest:.3g}, {zeros} of {s.numel()} projected to 0 after {tries} step(s)",
                {"min": lowest, "zeros": zeros, "steps": tries},
            )
        )
    return checks


def members_part(device: torch.device) -> list[Check]:
    return members_equal_merged(device) + singular_values_stay_nonnegative(device)


# ----- the command -----------------------------------------------------------------------------------------
def run_part(name: str, device: torch.device, outcome: dict, scratch: Path) -> None:
    """Runs one part into ``outcome``; an exception is the part's failure, and the other parts still run."""
    try:
        if name == "methods":
            outcome["checks"] += methods_part(device, scratch / "methods")
        elif name == "members":
            outcome["checks"] += members_part(device)
        elif name == "inference":
            from sve.bench.gpu_inference import inference_part

            checks, rows, note = inference_part(device)
            outcome["checks"] += checks
            outcome["tables"].update(latency=rows, latency_note=note)
        elif name == "plan":
            from sve.bench.gpu_plan import plan_part

            checks, rows, note = plan_part(scratch / "plan")
            outcome["checks"] += checks
            outcome["tables"].update(plan=rows, plan_note=note)
        else:
            from sve.bench.gpu_ranks import distributed_part

            outcome["checks"] += distributed_part(scratch / "distributed")
    except Exception as err:  # noqa: BLE001 - recorded as this part's failure
        traceback.print_exc()
        outcome["checks"].append(Check(name, "the part ran to its end", False, last_line(err)))


def check(parts: list[str], out: Path) -> int:
    """Runs the checks of ``parts`` on the GPU and writes their report into ``out``; the exit status (1: a check
    failed). Without CUDA, one line and nothing written (``sve-bench --gpu-check``: ``sve.cli.bench``)."""
    if not torch.cuda.is_available():
        print(no_cuda_line(), flush=True)
        return 0
    # float32 means float32 in every comparison (the tolerances assume it); children inherit it by the variable.
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    os.environ["NVIDIA_TF32_OVERRIDE"] = "0"
    os.environ.setdefault("SVE_SVD_CACHE", tempfile.mkdtemp(prefix="sve-gpu-check-svd-"))  # random weights
    device = torch.device("cuda")
    outcome = {"header": device_header(), "checks": [], "tables": {}}
    with tempfile.TemporaryDirectory(prefix="sve-gpu-check-") as scratch:
        for name in parts:
            print(f"[gpu-check] {name}", flush=True)
            run_part(name, device, outcome, Path(scratch))
    json_path, md_path = write_report(out, outcome)
    bad = failed(outcome["checks"])
    print(
        f"[gpu-check] {len(outcome['checks']) - len(bad)} of {len(outcome['checks'])} checks passed; "
        f"written to {md_path} and {json_path}",
        flush=True,
    )
    for c in bad:
        print(f"FAILED: {c.part}: {c.name}: {c.detail}", flush=True)
    return 1 if bad else 0
