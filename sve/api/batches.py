"""The user's inputs and loaders as the framework's batches: forms taken, example counts, finite inputs, and
the member logits of a whole loader."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sve.api.module_backbone import ARG, to_batch
from sve.errors import InputError
from sve.members import non_finite_rows


def examples(batch: dict) -> int | None:
    """The batch's example count (the leading dimension of its first tensor that has one); None without one."""
    return next((v.shape[0] for v in batch.values() if isinstance(v, Tensor) and v.dim() > 0), None)


def refuse_non_finite(batch: dict, doing: str, first_row: int = 0) -> None:
    """An error naming the inputs and rows (counted from ``first_row``) that hold NaN or inf: the members would
    predict NaN for them, and a NaN's arg-max is class 0, without a word."""
    bad = non_finite_rows(batch)
    if bad:
        where = "; ".join(
            f"{'input ' + k[len(ARG) :] if k.startswith(ARG) else k} in row(s) "
            f"{[first_row + r for r in rows[:10]]}{' ...' if len(rows) > 10 else ''}"
            for k, rows in bad.items()
        )
        raise InputError(
            f"{doing} got NaN or inf values: {where}; the inputs must be finite, as training requires "
            "(fix or drop those examples)"
        )


class Batches:
    """A loader's batches as the framework's dicts, with the ``dataset`` (its length) that Laplace fits read."""

    def __init__(self, loader):
        self.loader = loader
        dataset = getattr(loader, "dataset", None)
        self.dataset = dataset if dataset is not None else range(sum(len(as_batch(b)["labels"]) for b in loader))

    def __iter__(self):
        return (as_batch(b) for b in self.loader)

    def __len__(self) -> int:
        return len(self.loader)


def as_batch(batch, labelled: bool = True) -> dict:
    """A loader's batch as the framework's dict: (inputs, labels), ((args...), labels), or a dict (labels under
    ``labels``); with ``labelled=False`` also bare inputs (a tensor, or a 1-tuple as a TensorDataset gives)."""
    if isinstance(batch, dict):
        return dict(batch)
    if not labelled and isinstance(batch, Tensor):
        return to_batch((batch,), {})
    if not labelled and isinstance(batch, (tuple, list)) and len(batch) == 1:
        return to_batch(tuple(batch), {})
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        size = f" of {len(batch)}" if isinstance(batch, (tuple, list)) else ""
        raise InputError(
            f"a batch of {type(batch).__name__}{size} is not one of the forms taken: (inputs, labels), "
            "((args...), labels), a dict of the model's keyword arguments (labels under 'labels')"
            + ("" if labelled else ", or bare inputs")
        )
    inputs, labels = batch
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    return {**to_batch(args, {}), "labels": labels}


def loader_logits(
    ensemble: nn.Module, loader, progress: bool, doing: str, labelled_for: str | None = None
) -> tuple[Tensor, Tensor | None]:
    """Member logits (M, N, C) of every example of ``loader`` (on the CPU, float32), and its labels (or None
    when a batch has none; an error naming ``labelled_for``, the call that needs them, where given), in
    evaluation mode; the mode is restored. Batches go
    to the ensemble's device; ``doing`` names the work in the progress bar and in errors."""
    from tqdm.auto import tqdm

    from sve.members import to_device

    device = next((p.device for p in ensemble.parameters()), torch.device("cpu"))
    was_training, logits, labels = ensemble.training, [], []
    ensemble.eval()
    try:
        with torch.no_grad():
            seen = 0  # examples before this batch: errors name rows of the whole loader
            for raw in tqdm(loader, desc=f"sve: {doing}", disable=not progress, leave=False):
                batch = to_device(as_batch(raw, labelled=False), device)
                labels.append(batch.pop("labels", None))
                refuse_non_finite(batch, doing, seen)
                logits.append(ensemble(batch).float().cpu())
                seen += examples(batch)
    finally:
        ensemble.train(was_training)
    if not logits:
        raise InputError("the loader gave no batches")
    known = None if any(y is None for y in labels) else torch.cat([y.cpu() for y in labels])
    if labelled_for and known is None:
        raise InputError(
            f"{labelled_for} needs labelled batches: (inputs, labels) pairs or dicts with 'labels'; predict_loader "
            "takes unlabelled ones"
        )
    return torch.cat(logits, 1), known
