"""Export: one member of an ensemble, or the mean of its members' weights, as a plain model of the user's own
class (peft's ``merge_and_unload``), every member layer folded into a plain layer and the head put back.

Member k of SVE is the model with W_k = U diag(s_k) V^T (and its member bias) in every adapted layer and its own
head; of a LoRA method, W_0 + (alpha / r) B_k A_k; of BatchEnsemble, its fast weights folded in. The exported
model is a deep copy of the base model (the frozen weights are copied, the user's model is left as it is) in
which each member layer becomes the plain ``nn.Linear`` or convolution of ``MemberLayer.merge`` (a Hugging
Face ``Conv1D`` becomes the ``nn.Linear`` computing the same function) and the head is an ``nn.Linear`` with the
member's weights, in the place of the head the model had. Every parameter of it trains, as in a model built
afresh.

A method whose members are not weights of their own cannot be merged: samples (MC dropout, BLoB, the Laplace
methods), epoch snapshots (the checkpoint ensemble) and a deep ensemble's whole copies of the backbone.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from sve.api.module_backbone import ModuleBackbone
from sve.errors import InputError
from sve.layers.member import member_layers
from sve.methods.deep_ensemble import DeepEnsemble
from sve.methods.kinds import SampledMethod, SnapshotMethod


def refusal(method) -> str | None:
    """Why the members of ``method`` cannot be merged into plain weights, or None when they can."""
    if isinstance(method, SampledMethod) or method.stochastic:
        return "its members are samples of one model (each pass draws anew), not weights of their own"
    if isinstance(method, SnapshotMethod):
        return "its members are snapshots of the training run held beside the model, not in its layers"
    if isinstance(method, DeepEnsemble) and type(method).train_backbone:
        return "its members are whole copies of the backbone (ensemble.method.members), not member layers"
    return None


def merge(ensemble, member: int | None = None, mean: bool = False) -> nn.Module:
    """A plain model of the wrapped model's class computing member ``member`` of ``ensemble``, or, with
    ``mean=True``, the model whose every adapted weight, bias and head is the mean of the members' (module
    docstring). The mean-weight model is one network, not the ensemble: its prediction is not the ensemble's
    predictive (the mean of the members' probabilities), and it has no member disagreement to report."""
    method, name = ensemble.method, ensemble.config["method"]
    if (member is None) == (not mean):
        raise InputError("merge takes one of member=k (one member's model) or mean=True (the mean of the weights)")
    why = refusal(method)
    if why:
        raise InputError(f"merge: method={name!r} cannot be merged into one plain model: {why}")
    backbone = method.backbone
    if not isinstance(backbone, ModuleBackbone) or backbone.tap is None or backbone.combined_heads:
        raise InputError(
            f"merge: the model has no head of its own to put the member's head in (head="
            f"{getattr(backbone, 'head_name', None)!r}); merge exports models wrapped by sve.wrap that read "
            "their features at one head"
        )
    members = range(method.ensemble_size)
    if member is not None and member not in members:
        raise InputError(f"merge: member={member!r} is not one of the {method.ensemble_size} members")
    chosen = list(members) if mean else [member]
    heads = method.heads
    with torch.no_grad():
        rows = [k if heads.weight.shape[0] > 1 else 0 for k in chosen]  # a shared head serves every member
        head = nn.Linear(heads.weight.shape[2], heads.weight.shape[1])
        head.weight.copy_(heads.weight[rows].mean(0))
        head.bias.copy_(heads.bias[rows].mean(0))
        # deepcopy's memo stands the plain layers in for the member layers (and the head for the tap), so
        # only the frozen base is copied, never the factors or adapters of every member.
        memo = {id(backbone.tap): head.to(heads.weight)}
        for layer in member_layers(backbone.model):
            weights = [layer.member_weight(k) for k in chosen]
            biases = [layer.member_bias(k) for k in chosen]
            bias = None if biases[0] is None else torch.stack([b.float() for b in biases]).mean(0)
            memo[id(layer)] = layer.plain(torch.stack(weights).mean(0), bias)
        model = copy.deepcopy(backbone.model, memo)
    return model.requires_grad_(True).train(ensemble.training)
