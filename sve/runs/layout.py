"""Where a run trains, read from its trainer config: device, processes, strategy, precision, accumulation
(``Layout``, for the memory plan: ``sve.runs.plan``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from omegaconf import DictConfig, OmegaConf

from sve.errors import InputError

GIB = 2**30
STRATEGIES = ("auto", "single_device", "ddp", "fsdp")  # ddp_spawn, ddp_find_unused_parameters_true, ...: ddp
# Lightning precision -> (how, dtype): autocast around the step, or the whole module cast (true half precision).
PRECISIONS = {
    "32": None,
    "32-true": None,
    "64": None,
    "64-true": None,
    "bf16-mixed": ("autocast", torch.bfloat16),
    "16-mixed": ("autocast", torch.float16),
    "bf16-true": ("cast", torch.bfloat16),
    "16-true": ("cast", torch.float16),
    "bf16": ("autocast", torch.bfloat16),
    "16": ("autocast", torch.float16),
}
# What a CUDA process holds before its first tensor (the context, cuBLAS's workspace): an estimate, typical of
# CUDA 12-13 with lazily loaded kernels; counted into the peaks of a GPU plan.
CUDA_CONTEXT = GIB // 2


@dataclass
class Layout:
    """Where the run trains: ``device`` (cpu or cuda), ``devices`` (processes), ``strategy`` (single, ddp or
    fsdp), ``precision`` (Lightning's name) and ``accumulate`` (micro-batches per optimiser step)."""

    device: str
    devices: int
    strategy: str
    precision: str
    accumulate: int
    notes: list[str] = field(default_factory=list)


def device_layout(cfg: DictConfig) -> Layout:
    """The trainer config read as a layout; an unknown strategy or precision is an error naming the valid ones."""
    get = lambda key, default=None: OmegaConf.select(cfg, key, default=default)  # noqa: E731
    notes = []
    accelerator = str(get("trainer.accelerator", "cpu"))
    device = (
        "cuda" if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()) else "cpu"
    )
    devices = get("trainer.devices", 1)
    if isinstance(devices, (list, tuple)) or OmegaConf.is_list(devices):
        devices = len(devices)
    elif devices in (-1, "-1", "auto", None):
        found = torch.cuda.device_count() if device == "cuda" else 1
        notes.append(
            f"trainer.devices={devices}: planned for {max(found, 1)} device(s), as many as this machine "
            "has; set trainer.devices=N to plan for N"
        )
        devices = max(found, 1)
    else:
        try:
            devices = int(devices)
        except (TypeError, ValueError):
            devices = 0
        if devices < 1:
            raise InputError(
                f"trainer.devices={get('trainer.devices')!r} cannot be planned; expected a positive "
                "integer, a list of device ids or -1"
            )
    devices *= int(get("trainer.num_nodes", 1) or 1)
    strategy = get("trainer.strategy", "auto")
    if isinstance(strategy, DictConfig):  # a strategy object: planned by its class
        target = str(strategy.get("_target_", ""))
        strategy = "fsdp" if "fsdp" in target.lower() else "ddp" if "ddp" in target.lower() else target
    strategy = str(strategy or "auto")
    if strategy.startswith("ddp"):
        strategy = "ddp"
    if strategy not in STRATEGIES:
        raise InputError(f"trainer.strategy={strategy!r} cannot be planned; choose one of {list(STRATEGIES)}")
    if strategy in ("auto", "single_device"):
        strategy = "ddp" if devices > 1 else "single"
    precision = str(get("trainer.precision", "32-true") or "32-true")
    if precision not in PRECISIONS:
        raise InputError(f"trainer.precision={precision!r} cannot be planned; choose one of {list(PRECISIONS)}")
    return Layout(device, devices, strategy, precision, int(get("trainer.accumulate_grad_batches", 1) or 1), notes)


def gib(n: int) -> str:
    return f"{n / GIB:.3f}"
