"""The one member layout used everywhere in this code base.

Every method returns **member logits of shape (M, B, C)**: ensemble member first, then the batch, then the
classes. Whenever the M members run through a shared backbone in one forward pass, their inputs are stacked
**member-major** along the batch dimension: row ``m * B + b`` of a ``(M*B, ...)`` tensor belongs to member
``m`` and example ``b``. ``repeat_members`` builds that layout from a plain batch and ``split_members`` undoes
it; layers that hold per-member parameters (the singular-value layer, BatchEnsemble, LoRA-Ensemble) reshape
their input with the same rule, so the three always agree.

Methods whose members are stochastic passes (MC dropout, BLoB, Laplace samples) use the same (M, B, C)
layout with M = number of samples at evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from sve.errors import InputError


class MemberLayoutError(ValueError):
    """A member layer saw an input that is not stacked member-major along its leading dimension (the rows the
    method announced to it, ``MemberLayer.expect_rows``), or its owner read ``.weight`` while several members
    ran batched; ``module`` names the layer."""

    def __init__(self, message: str, module: str | None = None):
        super().__init__(message)
        self.module = module


def repeat_members(x: Tensor, ensemble_size: int) -> Tensor:
    """(B, ...) -> (M*B, ...), member-major."""
    if ensemble_size == 1:
        return x
    return x.repeat(ensemble_size, *([1] * (x.dim() - 1)))


def split_members(x: Tensor, ensemble_size: int, caller: str = "split_members") -> Tensor:
    """(M*B, ...) -> (M, B, ...); ``caller`` (a layer) is named in the error message."""
    if x.shape[0] % ensemble_size:
        raise MemberLayoutError(
            f"{caller} with ensemble_size={ensemble_size} got a leading dimension of {x.shape[0]}; inputs must "
            "be stacked member-major (M*B, ...) with sve.members.repeat_members"
        )
    return x.reshape(ensemble_size, x.shape[0] // ensemble_size, *x.shape[1:])


def repeat_batch(
    batch: Mapping[str, Tensor], ensemble_size: int, skip: tuple[str, ...] = ("labels",), batch_size: int | None = None
) -> dict:
    """Applies ``repeat_members`` to every tensor of a batch dict whose leading dimension is the batch's
    (``batch_size``), except the targets. Other tensors (a 0-d scale, a vector or mask that every example
    shares: arguments of a user's model) are the same for every member and pass as they are."""

    def per_example(v: Tensor) -> bool:
        return batch_size is None or (v.dim() > 0 and v.shape[0] == batch_size)

    return {
        k: repeat_members(v, ensemble_size) if isinstance(v, Tensor) and k not in skip and per_example(v) else v
        for k, v in batch.items()
    }


def check_member_logits(logits: Tensor, ensemble_size: int | None = None, batch_size: int | None = None) -> Tensor:
    """Asserts the (M, B, C) layout; returns the tensor so it can wrap a return statement."""
    if logits.dim() != 3:
        raise ValueError(f"member logits must have shape (M, B, C), got {tuple(logits.shape)}")
    if ensemble_size is not None and logits.shape[0] != ensemble_size:
        raise ValueError(f"expected {ensemble_size} members, got {logits.shape[0]}")
    if batch_size is not None and logits.shape[1] != batch_size:
        raise ValueError(f"expected batch size {batch_size}, got {logits.shape[1]}")
    return logits


def predictive(logits: Tensor, aggregate: str = "probs") -> Tensor:
    """Ensemble predictive distribution (B, C) from member logits (M, B, C).

    ``probs`` averages member softmax probabilities (Eq. 2 of the paper); ``logits`` averages the logits
    first and then applies the softmax (what the authors' public code does). Computed in float64.
    """
    logits = logits.double()
    if aggregate == "probs":
        return logits.softmax(dim=-1).mean(dim=0)
    if aggregate == "logits":
        return logits.mean(dim=0).softmax(dim=-1)
    raise InputError(f"aggregate={aggregate!r} is not valid; choose one of ['probs', 'logits']")


def log_predictive(logits: Tensor, aggregate: str = "probs") -> Tensor:
    """The log of ``predictive`` (B, C), computed without taking the log of a rounded probability: for
    ``probs`` it is logsumexp over members of the members' log-softmax, minus log M. Float64."""
    logits = logits.double()
    if aggregate == "probs":
        return torch.logsumexp(logits.log_softmax(dim=-1), dim=0) - math.log(logits.shape[0])
    if aggregate == "logits":
        return logits.mean(dim=0).log_softmax(dim=-1)
    raise InputError(f"aggregate={aggregate!r} is not valid; choose one of ['probs', 'logits']")


__all__ = [
    "MemberLayoutError",
    "repeat_members",
    "split_members",
    "repeat_batch",
    "check_member_logits",
    "predictive",
    "log_predictive",
]


def non_finite_rows(batch: Mapping) -> dict[str, list[int]]:
    """The examples (rows of the leading dimension; [0] for a 0-d tensor) that hold NaN or inf, for every
    floating-point tensor of ``batch`` that has any."""
    found = {}
    for k, v in batch.items():
        if not isinstance(v, Tensor) or not (v.is_floating_point() or v.is_complex()) or bool(torch.isfinite(v).all()):
            continue
        rows = (~torch.isfinite(v)).reshape(v.shape[0], -1).any(1) if v.dim() else torch.ones(1, dtype=torch.bool)
        found[k] = rows.nonzero().flatten().tolist()
    return found


def to_device(batch: dict, device) -> dict:
    """A batch dict with its tensors on ``device`` (other values, e.g. a tokenizer's strings, as they are)."""
    return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}
