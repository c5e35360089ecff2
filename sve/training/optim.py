"""Learning-rate schedules of Table 7: linear warmup, then cosine or linear decay to zero, per step."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

KINDS = ("cosine", "linear", "constant")


def warmup_schedule(
    optimizer: Optimizer,
    total_steps: int,
    kind: str = "cosine",
    warmup_epochs: float = 0.0,
    warmup_fraction: float = 0.0,
    max_epochs: int | None = None,
) -> LambdaLR:
    """Per-step LambdaLR. Warmup is given in epochs (vision recipes) or as a fraction of all steps (NLP).

    Args:
        total_steps: optimiser steps of the whole run (Lightning's ``estimated_stepping_batches``).
        warmup_epochs: converted to steps with ``total_steps / max_epochs``.
        warmup_fraction: e.g. 0.05 for "5%".
    """
    if kind not in KINDS:
        raise ValueError(f"scheduler kind={kind!r} is not valid; choose one of {list(KINDS)}")
    warmup = warmup_fraction * total_steps
    if warmup_epochs:
        if not max_epochs:
            raise ValueError("warmup_epochs needs max_epochs to convert epochs to steps")
        warmup = max(warmup, warmup_epochs * total_steps / max_epochs)
    warmup = min(int(round(warmup)), max(total_steps - 1, 0))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return 0.5 * (1 + math.cos(math.pi * progress)) if kind == "cosine" else 1.0 - progress

    return LambdaLR(optimizer, factor)
