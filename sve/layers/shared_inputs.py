"""Work every member would repeat, done once: the member-free layers that read the batch itself.

When members run one per backbone pass (``members_at_once`` 1, the CPU evaluation default), every pass starts
with the same layers on the same input: a ViT's patch embedding, BERT's token embeddings, any stem the method
did not adapt. Those layers hold no per-member parameter, so their output is the same for every member; M
dense models cannot share it, an ensemble on one backbone can. ``share_inputs`` computes it in the first
pass and hands it to the others.

What is shared, exactly: the outermost modules with no member layer inside (``MemberLayer``) whose call
receives one of the batch's own tensors. A module, or anything inside it, in training mode is never shared,
since it may be stochastic (MC dropout keeps its dropout layers training in evaluation); nor is anything
while autograd records or the model trains. A call is the same call when the module, its weights (by version
counter: loading other weights into it is another call) and its inputs are. Every pass gets its own copy of
the shared output, so a later layer that writes into it in place cannot reach the other passes (a copy costs
a small fraction of the layer it saves; version counters could not tell, since tensors made under
``torch.inference_mode``, as Lightning evaluates, have none).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_leaves, tree_map

from sve.layers.member import MemberLayer


def member_free_modules(root: nn.Module) -> list[nn.Module]:
    """The outermost modules under ``root`` that contain no member layer."""
    found = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if any(isinstance(m, MemberLayer) for m in child.modules()):
                visit(child)
            else:
                found.append(child)

    visit(root)
    return found


def version(t: Tensor) -> int:
    """The tensor's version counter; -1 for an inference tensor, which has none (and which nothing in a
    forward writes into between passes: the batch, weights made in inference mode)."""
    return -1 if t.is_inference() else t._version


def state(module: nn.Module) -> tuple:
    """What identifies the module's weights now: a copy loaded into them (a deep ensemble swapping its members
    through one backbone) changes their version counters."""
    return tuple((id(t), version(t)) for t in (*module.parameters(), *module.buffers()))


def copy_of(value):
    return tree_map(lambda t: t.clone() if isinstance(t, Tensor) else t, value)


@contextmanager
def share_inputs(root: nn.Module, batch: dict) -> Iterator[None]:
    """Inside the context, member-free modules of ``root`` called on a tensor of ``batch`` compute once per
    distinct call and return the first result to the later passes (module docstring)."""
    if root.training or torch.is_grad_enabled():
        yield
        return
    batch_tensors = {id(t) for t in batch.values() if isinstance(t, Tensor)}
    memo: dict[tuple, tuple] = {}  # call key -> (inputs kept alive, output)
    wrapped = []  # (module, its own instance-level forward if it had one)
    for module in member_free_modules(root):
        if any(m.training for m in module.modules()):
            continue
        wrapped.append((module, module.__dict__.get("forward")))
        module.forward = _sharing_forward(module, module.forward, batch_tensors, memo)
    try:
        yield
    finally:
        for module, own in wrapped:
            if own is None:
                del module.forward  # back to the class's forward
            else:
                module.forward = own
        memo.clear()


def _sharing_forward(module, forward, batch_tensors: set[int], memo: dict):
    def shared(*args, **kwargs):
        leaves = tree_leaves((args, kwargs))
        if not any(isinstance(t, Tensor) and id(t) in batch_tensors for t in leaves):
            return forward(*args, **kwargs)
        key = (
            id(module),
            tuple((id(v), version(v)) if isinstance(v, Tensor) else repr(v) for v in leaves),
            state(module),
        )
        if key not in memo:  # ids stay valid: the memo keeps the inputs alive
            memo[key] = (leaves, forward(*args, **kwargs))
        return copy_of(memo[key][1])

    return shared


__all__ = ["share_inputs", "member_free_modules"]
