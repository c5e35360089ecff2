"""What every backbone wrapper provides to the methods and data modules."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch._subclasses.fake_tensor import is_fake

log = logging.getLogger(__name__)

FINGERPRINT_VALUES = 1024  # values per tensor of the sampled fingerprint (adapter files of version 1)


@dataclass
class Usage:
    """Which parts of ``model`` produce the features, from one probe forward (``Backbone.probe_usage``).

    ``unused_modules``: names (relative to ``model``) of the probed layers whose output never reaches the
    features: heads, poolers whose output is not read, ``lm_head``. ``unused_parameters``: parameters with
    no path to the features; trainable ones would get no gradient (and DDP would stop), so methods freeze them.
    """

    unused_modules: set[str]
    unused_parameters: list[nn.Parameter]


class Backbone(nn.Module):
    """A pretrained network without its classification head.

    ``forward(batch)`` maps a batch dict (``pixel_values`` for images; ``input_ids`` and ``attention_mask``
    for text) to features of shape (N, feature_dim). Attributes read by the rest of the framework:

    - ``model``: the wrapped network, the tree that methods inject adapters into;
    - ``target_modules``: name patterns of the layers adapted by SVE and the adapter baselines (Sec. 4);
    - ``modality``: ``"image"`` or ``"text"``;
    - ``feature_dim``;
    - for images: ``image_size``, ``mean``, ``std``; for text: ``tokenizer``;
    - ``initial_head(task, num_classes)``: a head the pretrained model already has for the run's task, if
      any (the CIFAR ResNets' CIFAR-10 classifier for ``task == "cifar10"`` only, never because the class
      count matches; a causal LM's answer-letter rows of ``lm_head``).
    """

    modality: str
    feature_dim: int
    target_modules: list[str]

    def __init__(self, model: nn.Module, target_modules: list[str]):
        super().__init__()
        self.model = model
        # A bare string is one pattern (backbone.target_modules=query), "all" every adaptable layer (resolved by
        # the method, which knows its layer types).
        self.target_modules = [target_modules] if isinstance(target_modules, str) else list(target_modules)

    def forward(self, batch: dict) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def probe_batch(self) -> dict | None:
        """A tiny valid input (one example) for ``probe_usage``; None if the wrapper cannot make one."""
        return None

    def initial_head(self, task: str | None, num_classes: int) -> tuple[Tensor, Tensor] | None:
        """(weight (C, D), bias (C,)) to start every member's head from, or None for fresh heads."""
        return None

    def probe_usage(self, types: tuple[type, ...] = (nn.Linear, nn.Conv2d)) -> Usage | None:
        """Runs ``probe_batch`` once and follows the autograd graph back from the features.

        A layer of ``types`` is used when one of its outputs is a node of that graph, or when it is never called
        but its own (untied) weight is read into the graph by its owner; a parameter is used when its gradient
        accumulator is. Nothing is computed backwards, and modes, ``requires_grad`` flags and
        (eval mode) BatchNorm statistics are left as they were.
        """
        batch = self.probe_batch()
        if batch is None:
            log.warning("%s has no probe input: heads are recognised by name only", type(self).__name__)
            return None
        from sve.layers.member import ADAPTABLE_TYPES

        types = tuple(types) + ADAPTABLE_TYPES
        # A model whose only parameters were its head's has none left here: its inputs stay where they are.
        tensors = [v for v in batch.values() if isinstance(v, Tensor)]
        device = next(self.parameters(), tensors[0] if tensors else torch.empty(0)).device
        batch = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}
        modes = {m: m.training for m in self.modules()}
        flags = {p: p.requires_grad for p in self.parameters()}
        outputs: dict[str, list] = {}
        hooks = [
            module.register_forward_hook(lambda _m, _i, out, name=name: outputs.setdefault(name, []).append(out))
            for name, module in self.model.named_modules()
            if name and isinstance(module, types)
        ]
        try:
            self.eval()
            self.requires_grad_(True)
            with torch.enable_grad():
                features = self(batch)
            nodes, leaves = _graph(features.grad_fn)
        finally:
            for h in hooks:
                h.remove()
            for m, mode in modes.items():
                m.training = mode
            for p, flag in flags.items():
                p.requires_grad_(flag)
        used = {n for n, outs in outputs.items() if any(isinstance(o, Tensor) and o.grad_fn in nodes for o in outs)}
        probed = {n: m for n, m in self.model.named_modules() if n and isinstance(m, types)}
        # A layer that is never called but whose weight reaches the features is read by its owner (timm's
        # BEiT/EVA qkv, nn.MultiheadAttention.out_proj): it is used. Not so for a weight tied to another
        # module (an lm_head sharing the input embedding): that one reaches the features through its twin.
        owners: dict[int, int] = {}
        for m in self.model.modules():
            for p in m.parameters(recurse=False):
                owners[id(p)] = owners.get(id(p), 0) + 1
        for n, m in probed.items():
            w = getattr(m, "weight", None)
            if n not in outputs and isinstance(w, Tensor) and id(w) in leaves and owners.get(id(w)) == 1:
                used.add(n)
        all_probed = set(probed)
        unused_params = [p for p in self.parameters() if id(p) not in leaves]
        return Usage(unused_modules=all_probed - used, unused_parameters=unused_params)

    def fingerprint(self) -> Fingerprint:
        """``model``'s fingerprint now: the base an adapter file records (``sve.api.adapter_files``)."""
        return fingerprint(self.model)

    def extra_repr(self) -> str:
        return f"target_modules={self.target_modules}"


class Fingerprint(str):
    """The sha256 of every tensor's name, dtype, shape and bytes, with ``sampled``: the fingerprint that adapter
    files of version 1 recorded (``FINGERPRINT_VALUES`` evenly spaced values per tensor), so that those files
    are still checked as they were."""

    sampled: str


def fingerprint(model: nn.Module, without: str | None = None) -> Fingerprint:
    """The ``Fingerprint`` of every tensor of ``model``'s state dict, except those of the module ``without``
    (a head not yet replaced by the backbone's feature tap). Every value counts: a base whose weights differ
    in a few rows of one wide layer predicts differently, and a sample of 1,024 values per tensor missed that;
    hashing the bytes runs at the speed of reading them (seconds for a 7B model)."""
    full, sampled = hashlib.sha256(), hashlib.sha256()
    skip = f"{without}." if without else None
    for name, tensor in sorted(model.state_dict().items()):
        if not isinstance(tensor, Tensor) or (skip and name.startswith(skip)):
            continue
        for digest in (full, sampled):
            digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        if tensor.device.type == "meta" or is_fake(tensor) or tensor.numel() == 0:
            continue  # no values: a model built for a memory plan (sve.runs.plan)
        flat = tensor.detach().reshape(-1)
        full.update(memoryview(flat.contiguous().cpu().view(torch.uint8).numpy()))  # any dtype, bfloat16 included
        if flat.numel() > FINGERPRINT_VALUES:
            # Integer steps: a float32 linspace rounds the last index of a large tensor past its end.
            index = (
                torch.arange(FINGERPRINT_VALUES, device=flat.device) * (flat.numel() - 1) // (FINGERPRINT_VALUES - 1)
            )
            flat = flat[index]
        sampled.update(flat.to(torch.float64).cpu().numpy().tobytes())
    result = Fingerprint(full.hexdigest())
    result.sampled = sampled.hexdigest()
    return result


def keep_batchnorm_statistics(model: nn.Module) -> None:
    """Every BatchNorm of ``model`` in eval mode: members stacked in one batch must not mix their statistics."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.eval()


def _graph(root) -> tuple[set, set[int]]:
    """All autograd nodes reachable from ``root``, and the ids of the leaf tensors they accumulate into."""
    nodes, leaves, stack = set(), set(), [root]
    while stack:
        node = stack.pop()
        if node is None or node in nodes:
            continue
        nodes.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad: the leaf it writes
        if variable is not None:
            leaves.add(id(variable))
        stack.extend(fn for fn, _ in node.next_functions)
    return nodes, leaves
