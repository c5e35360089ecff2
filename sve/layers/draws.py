"""Training draws that do not depend on how a global batch is spread over processes and accumulation steps.

With ``exact_draws`` (configs/train.yaml, on by default) every training micro-batch draws from a generator
seeded by (seed, optimiser step), so all micro-batches of a step, on every rank, start from one state; and
each per-example draw is made for the whole global batch, of which the micro-batch keeps its own rows
(``rows``, from the sampler). Each example then gets the dropout mask, or the weight sample, it gets on one
device without accumulation, and a resumed run draws what the uninterrupted one drew.

Training in member chunks (``members_at_once: k``) runs each chunk in its own ``seeded_draws`` from the
step's seed, naming its members: every dropout call then draws the masks of all M members, as one pass of
all members would, and keeps its chunk's. Each member gets the masks it gets when all members run at once.

What is covered: ``torch.nn.functional.dropout`` (which ``nn.Dropout`` and Hugging Face attention call), and
per-example weight samples that ask ``rows_to_draw`` (BLoB). Attention that fuses its dropout into one kernel
(timm's ``fused_attn``, PyTorch's SDPA in Hugging Face models) draws inside the kernel with the local batch's
shape, so where attention dropout is on it runs unfused (``unfuse_attention_dropout``; slower attention, the
price of exactness; ``exact_draws=false`` keeps the fused kernels and per-process draws). Other samplers (e.g.
timm's stochastic depth) draw per process.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Ambient, not arguments (docs/architecture.md#global-state): the dropout calls to reach are made by code this
# package does not own (``nn.Dropout.forward``, Hugging Face and timm attention, a user's model), which calls
# ``torch.nn.functional.dropout`` by name with its own arguments, so only a patched ``F.dropout`` reaches them;
# it is in place only inside ``seeded_draws``/``drawing_as``. ``_rows``/``_members`` are what it reads; BLoB's
# samples read them too (``rows_to_draw``), which as an argument would change every method's ``forward(batch)``.
# Module globals rather than a ContextVar: the patch itself is process-wide, so per-thread state would not make
# it per-thread.
_plain_dropout = F.dropout
_rows: tuple[int, int, int] | None = None  # (offset, local, total): this micro-batch's rows of the global batch
_members: tuple[list[int], int] | None = None  # (members, of): the member chunk running, of how many members
_warned: set[tuple[int, ...]] = set()


def rows_to_draw(local: int) -> tuple[int, slice]:
    """How many per-example samples to draw for a micro-batch of ``local`` examples, and which to keep."""
    if _rows is not None and _rows[1] == local:
        offset, _, total = _rows
        return total, slice(offset, offset + local)
    return local, slice(None)


def _global_dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    if not training or p == 0 or _rows is None:
        return _plain_dropout(input, p, training, inplace)
    offset, local, total = _rows
    if input.dim() == 0 or input.shape[0] % local:
        if tuple(input.shape) not in _warned:
            _warned.add(tuple(input.shape))
            warnings.warn(
                f"a dropout input of shape {tuple(input.shape)} is not batch-first for this micro-batch of "
                f"{local}: its mask is drawn per process (exact_draws)",
                stacklevel=2,
            )
        return _plain_dropout(input, p, training, inplace)
    K = input.shape[0] // local  # members stacked member-major: row k * local + j
    chunk, drawn = (_members[0], _members[1]) if _members is not None and len(_members[0]) == K else (None, K)
    # As the CPU kernel of F.dropout: a Bernoulli(1 - p) mask scaled by 1 / (1 - p), here for all global rows
    # (and, in a member chunk, for all members: the chunk keeps its own).
    noise = torch.empty((drawn, total, *input.shape[1:]), dtype=input.dtype, device=input.device).bernoulli_(1 - p)
    if chunk is not None:
        noise = noise[chunk]
    noise = noise[:, offset : offset + local].reshape(input.shape)
    noise = noise.div_(1 - p) if p < 1 else noise.zero_()
    return input.mul_(noise) if inplace else input * noise


@contextmanager
def seeded_draws(
    seed: int, rows: tuple[int, int] | None = None, local: int = 0, members: tuple[list[int], int] | None = None
) -> Iterator[None]:
    """Inside: draws seeded by ``seed`` and, with ``rows = (offset, total)`` (training), dropout drawn for
    the global batch of which this micro-batch of ``local`` examples holds those rows; with ``members =
    (chunk, M)``, drawn for all M members, of which the running chunk keeps its own. The global random
    state is as it was afterwards."""
    global _rows, _members
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    previous = _rows, _members
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        _rows = None if rows is None else (int(rows[0]), local, int(rows[1]))
        _members = None if members is None else (list(members[0]), int(members[1]))
        F.dropout = _global_dropout
        try:
            yield
        finally:
            F.dropout = _plain_dropout
            _rows, _members = previous


def draw_state() -> tuple:
    """How dropout draws now (inside or outside ``seeded_draws``), for ``drawing_as``."""
    return _rows, _members, F.dropout is _global_dropout


@contextmanager
def drawing_as(state: tuple) -> Iterator[None]:
    """Inside: dropout drawn as ``draw_state()`` noted it, the random state left as it is (a checkpointed
    block's recomputation, for which PyTorch restores the random state itself: ``sve.layers.recompute``)."""
    global _rows, _members
    previous = _rows, _members, F.dropout
    _rows, _members, exact = state
    F.dropout = _global_dropout if exact else _plain_dropout
    try:
        yield
    finally:
        _rows, _members, F.dropout = previous


def unfuse_attention_dropout(model: nn.Module) -> list[str]:
    """Runs attention whose dropout is on without fused kernels (their draws cannot be made per example).
    Returns the names of what changed."""
    changed = []
    for name, module in model.named_modules():
        drop = getattr(module, "attn_drop", None)
        if getattr(module, "fused_attn", False) and isinstance(drop, nn.Dropout) and drop.p > 0:
            module.fused_attn = False  # timm: the unfused path calls attn_drop, i.e. F.dropout
            changed.append(name)
    configs = {
        id(m.config): m.config for m in model.modules() if hasattr(getattr(m, "config", None), "_attn_implementation")
    }
    attention_dropout = any(getattr(m, "attention_dropout", 0) or 0 for m in model.modules()) or any(
        (getattr(c, "attention_probs_dropout_prob", 0) or 0) > 0 or (getattr(c, "attention_dropout", 0) or 0) > 0
        for c in configs.values()
    )
    for config in configs.values():
        if attention_dropout and config._attn_implementation not in (None, "eager"):
            config._attn_implementation = "eager"  # Hugging Face: eager attention calls F.dropout
            changed.append(f"{type(config).__name__}._attn_implementation=eager")
    return changed


def rng_states(batch: dict) -> tuple[Tensor, Tensor | None, torch.device | None]:
    """The states of the default generators a forward on ``batch`` draws from: the CPU's and the batch's GPU's."""
    device = next((v.device for v in batch.values() if isinstance(v, Tensor) and v.is_cuda), None)
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device is not None else None), device


def restore_rng_states(states: tuple[Tensor, Tensor | None, torch.device | None]) -> None:
    cpu, cuda, device = states
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)
