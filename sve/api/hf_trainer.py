"""A wrapped model trained by Hugging Face's ``transformers.Trainer``: the model it trains, the callback that
takes the method's own steps, and the metrics of the ensemble predictive.

    ensemble = sve.wrap(model, method="sve", ensemble_size=4)
    trainer = Trainer(
        model=TrainerModel(ensemble),               # loss: Eq. 6; logits: the log of the predictive (B, C)
        args=TrainingArguments("out", ...),
        train_dataset=train, eval_dataset=val,     # datasets.Dataset of the model's inputs and "label(s)"
        compute_metrics=compute_metrics,           # eval_acc, eval_ece, eval_nll, eval_brier
        callbacks=[EnsembleCallback(ensemble)],    # the method's steps; adapter files in every checkpoint
    )
    trainer.train()
    ensemble.save_pretrained("my-adapter")

The Trainer reads what ``TrainerModel`` returns as it reads a Hugging Face model's output: ``loss`` when the
batch has labels, and ``logits``, which its prediction loop concatenates over batches. The logits are the log
of the ensemble predictive, so a softmax (or an argmax) of them reads the ensemble's prediction, as a
``compute_metrics`` written for a single model expects.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from types import MethodType

import torch
from torch import nn
from transformers import TrainerCallback
from transformers.modeling_outputs import SequenceClassifierOutput
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from sve.api.module_backbone import ModuleBackbone
from sve.api.wrap import Ensemble
from sve.members import log_predictive
from sve.metrics.scores import predictive_metrics

log = logging.getLogger(__name__)


class TrainerModel(nn.Module):
    """``ensemble`` as ``transformers.Trainer`` trains it: ``forward(labels=None, **inputs)`` gives a
    ``SequenceClassifierOutput`` with ``loss`` (``ensemble.loss``, the mean member cross-entropy, when labels
    are given) and ``logits``, the log of the predictive (``aggregate``: ``probs`` averages the members'
    probabilities, ``logits`` their logits), (B, C) in float64.

    Args:
        ensemble: what ``sve.wrap`` returned.
        aggregate: how the predictive is formed (``sve.members.predictive``).
        inputs: the dataset columns the model reads; by default the parameters of the model's own ``forward``
            (with the Trainer's ``remove_unused_columns``, the only columns its batches keep besides the labels).
    """

    # The loss is a mean over the batch: the Trainer scales it for gradient accumulation itself, and passes no
    # ``num_items_in_batch`` (which a model that accepts it must normalise by).
    accepts_loss_kwargs = False

    def __init__(self, ensemble: Ensemble, aggregate: str = "probs", inputs: list[str] | None = None):
        super().__init__()
        self.ensemble = ensemble
        self.aggregate = aggregate
        self.inputs = list(inputs) if inputs is not None else input_names(ensemble)
        # The Trainer keeps the dataset columns that the model's forward names (inspect.signature of the bound
        # method): this forward names the wrapped model's inputs, where the class's takes them all as **inputs.
        self.forward = MethodType(named_forward(self.inputs), self)
        # The Trainer's checkpoints hold this module's state dict: the trained tensors, as the adapter files do
        # (the frozen base is what the model was, U and V follow from it; a whole state dict would also hold
        # the SVD factors in a layout safetensors refuses). Resuming loads them into a model wrapped as before.
        self.register_state_dict_post_hook(keep_trained)
        self.register_load_state_dict_post_hook(frozen_not_missing)

    def forward(self, labels: torch.Tensor | None = None, **inputs) -> SequenceClassifierOutput:
        member_logits = self.ensemble(**inputs)
        loss = None if labels is None else self.ensemble.loss(member_logits, labels)
        return SequenceClassifierOutput(loss=loss, logits=log_predictive(member_logits, self.aggregate))


def trained_names(model: TrainerModel, prefix: str = "") -> set[str]:
    return {prefix + name for name, p in model.named_parameters() if p.requires_grad}


def keep_trained(model: TrainerModel, state: dict, prefix: str, local_metadata) -> None:
    trained = trained_names(model, prefix)
    for key in [k for k in state if k.startswith(prefix)]:
        if key in trained:
            state[key] = state[key].contiguous()
        else:
            del state[key]


def frozen_not_missing(model: TrainerModel, incompatible) -> None:
    """A state dict of ``keep_trained``'s is whole: the frozen tensors it leaves out are not missing."""
    trained = trained_names(model)
    # Keys are named from the module whose load_state_dict was called, which may hold this one (DDP's "module.").
    suffixes = lambda key: (key.split(".", i)[-1] for i in range(key.count(".") + 1))  # noqa: E731
    incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if any(s in trained for s in suffixes(k))]


def input_names(ensemble: Ensemble) -> list[str]:
    """The inputs a batch of ``ensemble`` holds: the keyword parameters of the user's model's ``forward``, or
    the keys of a framework backbone's probe batch."""
    backbone = ensemble.method.backbone
    if isinstance(backbone, ModuleBackbone):
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        parameters = inspect.signature(backbone.model.forward).parameters.values()
        return [p.name for p in parameters if p.kind in kinds and p.name != "labels"]
    probe = backbone.probe_batch()
    return [k for k in probe if k != "labels"] if isinstance(probe, dict) else []


def named_forward(names: list[str]):
    """``TrainerModel.forward`` with a signature that names ``names`` and ``labels``."""

    def forward(self, labels=None, **inputs):
        return TrainerModel.forward(self, labels, **inputs)

    keyword = inspect.Parameter.KEYWORD_ONLY
    forward.__signature__ = inspect.Signature(
        [
            inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            inspect.Parameter("labels", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
            *(inspect.Parameter(name, keyword, default=None) for name in names),
        ]
    )
    return forward


def compute_metrics(prediction) -> dict[str, float]:
    """The Trainer's ``compute_metrics``: ``acc``, ``ece``, ``nll`` and ``brier`` of the predictive
    (``sve.metrics.scores``, as ``train.py`` reports them) from the log-probabilities ``TrainerModel``
    returns; the Trainer logs them as ``eval_acc``, ...."""
    log_probs = prediction.predictions
    if isinstance(log_probs, (tuple, list)):
        log_probs = log_probs[0]
    probs = torch.as_tensor(log_probs, dtype=torch.float64).exp()
    return predictive_metrics(probs, torch.as_tensor(prediction.label_ids).long())


class EnsembleCallback(TrainerCallback):
    """The steps a method takes outside its loss, at the Trainer's events: after every optimizer step the
    method's projection (``constrain_``: SVE's singular values onto s >= 0; its optimizer hook does this
    already for an optimizer that steps the parameters themselves); after every epoch ``end_epoch`` (a
    checkpoint ensemble's snapshot); after training ``finish_training`` on the training batches (a Laplace
    posterior). With every checkpoint the Trainer saves, the adapter files go into the checkpoint's
    directory, so ``sve.from_pretrained(base, "<output_dir>/checkpoint-<step>")`` loads it."""

    def __init__(self, ensemble: Ensemble):
        self.ensemble = ensemble

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        check_learning_rates(self.ensemble, optimizer)

    def on_step_end(self, args, state, control, **kwargs):
        self.ensemble.method.constrain_()

    def on_epoch_end(self, args, state, control, **kwargs):
        self.ensemble.end_epoch()

    def on_train_end(self, args, state, control, train_dataloader=None, **kwargs):
        self.ensemble.finish_training(train_dataloader)

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.ensemble.save_pretrained(Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")


def check_learning_rates(ensemble: Ensemble, optimizer) -> None:
    """A warning when the method trains some tensors at a rate of their own (``sve_lora``'s ``sv_lr``) and the
    Trainer's optimizer, built from its one ``learning_rate``, does not."""
    if optimizer is None:
        return
    rate = {id(p): g.get("initial_lr", g["lr"]) for g in optimizer.param_groups for p in g["params"]}
    for group in ensemble.parameter_groups():
        if "lr" in group and any(rate.get(id(p), group["lr"]) != group["lr"] for p in group["params"]):
            log.warning(
                "the method trains %d tensors at lr=%g, but the Trainer's optimizer does not: pass "
                "optimizers=(torch.optim.AdamW(ensemble.parameter_groups(), lr=...), None) to the Trainer",
                len(group["params"]),
                group["lr"],
            )


__all__ = ["EnsembleCallback", "TrainerModel", "compute_metrics"]
