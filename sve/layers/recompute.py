"""Gradient checkpointing that recomputes a block as it first ran.

A checkpointed block (Hugging Face gradient checkpointing, non-reentrant) runs a second time in the backward,
after the contexts it first ran in have ended: a member chunk's selection (``MemberLayer.select``, or a bank of
stand-ins) with the member-major rows the method announced (``MemberLayer.expect_rows``), and the exact dropout
draws (``sve.layers.draws.seeded_draws``). PyTorch restores the random state for the recomputation; the rest
is restored here. ``recompute_context`` is the checkpoint's ``context_fn``: at the block's forward it notes
that state, and it puts it back around the recomputation. Without it, a chunk's recomputation would run every
member (PyTorch's CheckpointError on the shapes), and exact draws would be redrawn per process (masks that
differ from the forward's: silently wrong gradients).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext

from torch import nn

from sve.layers import draws
from sve.layers.member import running_layers


def recompute_context():
    """(forward context, recomputation context) for one checkpointed block (its ``context_fn``). Only the
    layers running a selection, bank or rows now are noted (``running_layers``): no walk of the model per block."""
    noted = [(layer, layer.running()) for layer in running_layers()], draws.draw_state()
    return nullcontext(), _as_noted(noted)


@contextmanager
def _as_noted(noted) -> Iterator[None]:
    layers, drawn = noted
    with ExitStack() as stack:
        for layer, state in layers:
            stack.enter_context(layer.running_as(state))
        stack.enter_context(draws.drawing_as(drawn))
        yield


# transformers 5.25 renamed gradient checkpointing to activation checkpointing; the old names warn there and go in
# v6. Each helper below takes the new name where the model has it.


def enable_checkpointing(model: nn.Module, **kwargs) -> None:
    """Hugging Face gradient checkpointing, non-reentrant, with each block recomputed as it ran."""
    options = {"use_reentrant": False, "context_fn": recompute_context, **kwargs}
    if hasattr(type(model), "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)


def disable_checkpointing(model: nn.Module) -> None:
    if hasattr(type(model), "activation_checkpointing_disable"):
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()


def is_checkpointing(model: nn.Module) -> bool:
    """Whether a Hugging Face model recomputes its blocks; False for any other module."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


__all__ = ["disable_checkpointing", "enable_checkpointing", "is_checkpointing", "recompute_context"]
