"""Any ``nn.Module`` as a backbone: the user's own model, a Hugging Face model or a timm model, as it is.

The framework's backbones are built from a config; ``ModuleBackbone`` takes a model someone already has. Its
features are the input of the model's classification head: the head is found (``head="auto"``), replaced by a
``FeatureTap`` that records what reaches it, and the model then runs as it always does. So nothing about the
model's own forward (its arguments, its pooling, a dropout before the head) has to be re-implemented, and the
head's weights are kept to start every member from (``initial_head``) when no new class count is asked for.

How the head is found, in order: a timm model's ``get_classifier()``; otherwise, on one probe input, the
linear layer whose output *is* the model's output (the tensor itself, or the ``logits`` of a Hugging Face
output or of a dict). A model whose output comes from no such layer has no head: its output is the features.

Inputs are carried as the framework's batch dicts: positional arguments under ``_arg0``, ``_arg1``, ...,
keyword arguments under their names (``to_batch``), so the member machinery (stacking members along the
batch, chunks, ``share_inputs``) works on any signature whose tensors are batch-first.

BatchNorm keeps its running statistics (eval mode) whatever the mode, as for the framework's CNN backbones:
members are stacked in one batch, and batch statistics would mix them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from sve.backbones.base import Backbone, keep_batchnorm_statistics
from sve.backbones.hf import POOLINGS, pool
from sve.errors import InputError
from sve.layers.inject import adaptable
from sve.layers.member import ADAPTABLE_TYPES
from sve.members import MemberLayoutError

log = logging.getLogger(__name__)

ARG = "_arg"  # batch keys of positional arguments: _arg0, _arg1, ...


def to_batch(args: tuple, kwargs: dict) -> dict:
    """A model call's arguments as a batch dict; a single dict argument is taken as the keyword arguments."""
    if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
        return dict(args[0])
    return {**{f"{ARG}{i}": a for i, a in enumerate(args)}, **kwargs}


def from_batch(batch: dict, skip: tuple[str, ...] = ("labels",)) -> tuple[list, dict]:
    """The inverse of ``to_batch``: (positional arguments, keyword arguments)."""
    positional = sorted((int(k[len(ARG) :]), v) for k, v in batch.items() if re.fullmatch(rf"{ARG}\d+", k))
    kwargs = {k: v for k, v in batch.items() if not re.fullmatch(rf"{ARG}\d+", k) and k not in skip}
    return [v for _, v in positional], kwargs


class FeatureTap(nn.Module):
    """Stands where the head was: keeps the tensor the head would have read and passes it on."""

    def __init__(self):
        super().__init__()
        self.features: Tensor | None = None

    def forward(self, x: Tensor, *args, **kwargs) -> Tensor:
        self.features = x
        return x


def model_output(out) -> Tensor | None:
    """The tensor a model returns: itself, the ``logits`` of a Hugging Face output or of a plain dict, else its
    ``last_hidden_state`` (a headless encoder's output, e.g. ``BertModel``'s: (N, T, D), for ``pooling=``), or a
    tuple's first element."""
    if isinstance(out, Tensor):
        return out
    for key in ("logits", "last_hidden_state"):
        found = out.get(key) if isinstance(out, Mapping) else getattr(out, key, None)
        if isinstance(found, Tensor):
            return found
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor):
        return out[0]
    return None


def built_image_size(model: nn.Module) -> tuple[int, ...] | None:
    """The image size a timm model was built at when it differs from its pretrained config's: a ViT's
    ``patch_embed.img_size``, or the model's own ``img_size`` (MaxViT, CoAtNet); None when it keeps neither."""
    for size in (getattr(getattr(model, "patch_embed", None), "img_size", None), getattr(model, "img_size", None)):
        if isinstance(size, int) and not isinstance(size, bool):
            return (size, size)
        if isinstance(size, (tuple, list)) and size and all(isinstance(n, int) for n in size):
            return tuple(size)
    return None


def warn_pad_inside_mask(model: nn.Module, batch: dict) -> None:
    """Hugging Face's decoder classifiers (GPT-2, LLaMA, Qwen2, ...) read the last token that is not the pad id;
    ``pooling="last"`` reads the last token the attention mask keeps. Where the pad id is also a real token of
    the text (pad = end-of-sequence, and texts end with it) the two read different tokens, and the ensemble is not
    the model even at initialisation: say so, on the example the wrap was given."""
    pad = getattr(getattr(model, "config", None), "pad_token_id", None)
    ids, mask = batch.get("input_ids"), batch.get("attention_mask")
    if not isinstance(pad, int) or not isinstance(ids, Tensor) or not isinstance(mask, Tensor):
        return
    inside = int(((ids == pad) & (mask != 0)).sum())
    if inside:
        log.warning(
            "the example's input_ids hold the pad id %d at %d position(s) the attention mask keeps (pad = "
            "end-of-sequence?): %s's own classifier reads the last token that is not the pad id, "
            "pooling='last' the last token the mask keeps, so they read different tokens. Give the "
            "tokenizer a pad token no text holds (e.g. tokenizer.pad_token = tokenizer.unk_token, and "
            "model.config.pad_token_id to match)",
            pad,
            inside,
            type(model).__name__,
        )


def described_input(model: nn.Module) -> dict | None:
    """A one-example input for models that describe their own: timm's ``pretrained_cfg['input_size']`` (the
    size the model was built at first, ``built_image_size``), a
    Hugging Face text model's vocabulary, a Hugging Face vision model's ``image_size``; None otherwise. Images
    take the dtype and device of the model's first floating-point parameter (a bf16 model refuses float32)."""
    floating = next((p for p in model.parameters() if p.is_floating_point()), None)
    like = {} if floating is None else {"dtype": floating.dtype, "device": floating.device}
    size = built_image_size(model)
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
    if isinstance(cfg, dict) and cfg.get("input_size"):
        channels, *pixels = cfg["input_size"]
        return {f"{ARG}0": torch.zeros(1, channels, *(size or pixels), **like)}
    config = getattr(model, "config", None)
    name = getattr(model, "main_input_name", None)
    if config is None or name is None:
        return None
    if name == "input_ids" and getattr(config, "vocab_size", None):
        ids = torch.arange(1, 5, device=like.get("device")).clamp_max(config.vocab_size - 1)[None]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if name == "pixel_values" and getattr(config, "image_size", None):
        size = config.image_size if isinstance(config.image_size, int) else config.image_size[0]
        return {"pixel_values": torch.zeros(1, getattr(config, "num_channels", 3), size, size, **like)}
    return None


def refuse_meta(model: nn.Module) -> None:
    """A model whose tensors are on the meta device has shapes but no values: nothing could run or train."""
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        if t.device.type == "meta":
            raise InputError(
                f"{type(model).__name__} has tensors on the meta device (e.g. {name}): shapes without "
                "values, as torch.device('meta') or accelerate's init_empty_weights builds them; load "
                "its weights first (model.to_empty(device='cpu') then load_state_dict, or build it on "
                "a real device), then wrap it"
            )


def other_shapes(batch: dict, example: dict) -> list[str]:
    """The tensors of ``batch`` whose shape past the leading (batch) dimension is not the example's, said as
    'input 0 of shape (5, 17), where the example it was wrapped with has (1, 16): 17 in dimension 1, not 16'."""
    found = []
    for k, v in batch.items():
        known = example.get(k)
        if not isinstance(v, Tensor) or not isinstance(known, Tensor) or v.dim() == 0 or known.dim() == 0:
            continue
        if v.shape[1:] == known.shape[1:]:
            continue
        name = f"input {k[len(ARG) :]}" if k.startswith(ARG) else k
        if v.dim() != known.dim():
            found.append(
                f"{name} of shape {tuple(v.shape)}, where the example it was wrapped with has "
                f"{tuple(known.shape)}: {v.dim()} dimensions, not {known.dim()}"
            )
            continue
        dims = [f"{a} in dimension {i}, not {b}" for i, (a, b) in enumerate(zip(v.shape, known.shape)) if i and a != b]
        found.append(
            f"{name} of shape {tuple(v.shape)}, where the example it was wrapped with has "
            f"{tuple(known.shape)}: {', '.join(dims)}"
        )
    return found


def first_example(batch: dict) -> dict:
    """The batch's first example: every tensor whose leading dimension is the batch's (the first tensor's)
    cut to one row; tensors the examples share (a mask, a 0-d scale) as they are."""
    tensors = [v for v in batch.values() if isinstance(v, Tensor) and v.dim() > 0]
    rows = tensors[0].shape[0] if tensors else None
    return {k: v[:1] if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == rows else v for k, v in batch.items()}


class ModuleBackbone(Backbone):
    """A user's model as a backbone (module docstring).

    Args:
        model: the network, with or without its head.
        target_modules: name patterns of the layers to adapt; None: every adaptable layer on the feature path.
        head: the head's module name, ``"auto"`` (found, module docstring) or None (the output is the features).
        pooling: for a head that reads a sequence (N, T, D): the first real token (``cls``), the ``mean`` or
            the ``last`` real token, from the batch's ``attention_mask`` (padding on either side); None refuses
            such a head.
        example_input: one input as the model takes it (a tensor, a tuple of arguments or a dict of keyword
            arguments); needed unless the model describes its own (``described_input``).
        freeze_bn: BatchNorm keeps its running statistics in every mode (module docstring).
    """

    modality = "any"

    def __init__(
        self,
        model: nn.Module,
        target_modules: list[str] | None = None,
        head: str | None = "auto",
        pooling: str | None = None,
        example_input=None,
        freeze_bn: bool = True,
    ):
        if pooling is not None and pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r} is not valid; choose one of {list(POOLINGS)} or None")
        refuse_meta(model)
        super().__init__(model, target_modules or [])
        self.pooling = pooling
        self.keep_head = False  # set by ``wrap`` when the members keep the model's classes
        self.head_hint = ""  # why a model's head was not found, when a likely one was seen (``selecting_head``)
        self.combined_heads: list[str] = []  # the heads of a model that combines several (``find_head``)
        self.freeze_bn = freeze_bn
        if example_input is None:
            self.example = described_input(model)
            if self.example is None:
                raise ValueError(
                    f"{type(model).__name__} does not say what input it takes: pass example_input= "
                    "(one batch as the model takes it: a tensor, a tuple of arguments or a dict of "
                    "keyword arguments)"
                )
        else:
            args = example_input if isinstance(example_input, tuple) else (example_input,)
            self.example = to_batch(args, {})
        if pooling == "last":
            warn_pad_inside_mask(model, self.example)
        self.example = first_example(self.example)
        self.probing_described = example_input is None  # until the model has run once on its described input
        explicit_same_padding(model)
        self.head_name = self.find_head(head)
        self.head_weights: tuple[Tensor, Tensor] | None = None
        self.tap: FeatureTap | None = None
        if self.head_name is not None:
            self.head_weights = head_weights(model.get_submodule(self.head_name))
            self.tap = FeatureTap()
            parent, _, child = self.head_name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, self.tap)
        with torch.no_grad():
            was = model.training
            self.eval()
            self.feature_dim = int(self(self.probe_batch()).shape[-1])
            self.train(was)
        self.probing_described = False
        self.targets_by_default = not self.target_modules  # the method resolves them for its types (``adapt``)
        if self.targets_by_default:
            self.target_modules = self.default_targets()

    def call_model(self, args: list, kwargs: dict):
        """The model on its arguments. A failure on an input whose shape is not the example's is named as such
        (``other_shapes``): the error from deep inside the model (a reshape, a matmul) does not say so. While
        the model's own description of its input is probed, a failure is named as such too: the model was most
        likely built for another input (a timm model built at another image size that it does not record)."""
        if not self.probing_described:
            try:
                return self.model(*args, **kwargs)
            except (RuntimeError, ValueError, TypeError, AssertionError, IndexError) as err:
                differ = other_shapes(to_batch(tuple(args), kwargs), self.example)
                if isinstance(err, MemberLayoutError) or not differ:  # the layout error is the method's to handle
                    raise
                raise InputError(
                    f"{type(self.model).__name__} fails on {'; '.join(differ)} ({type(err).__name__}: {err})"
                ) from err
        try:
            return self.model(*args, **kwargs)
        except (RuntimeError, ValueError, TypeError, AssertionError, IndexError) as err:
            shapes = ", ".join(
                f"{'input' if k.startswith(ARG) else k} {tuple(v.shape)}"
                for k, v in self.example.items()
                if isinstance(v, Tensor)
            )
            raise InputError(
                f"{type(self.model).__name__} fails on the input it describes ({shapes}, from its own "
                f"config): {type(err).__name__}: {err}; pass example_input= one batch as the model "
                "takes it (a model built at another input size needs an input of that size)"
            ) from err

    # ----- the head ---------------------------------------------------------------------------------------------
    def find_head(self, head: str | None) -> str | None:
        if head is None:
            return None
        names = {m: n for n, m in self.model.named_modules() if n}
        if head != "auto":
            if head not in dict(self.model.named_modules()) or not head:
                linears = [n for m, n in names.items() if isinstance(m, ADAPTABLE_TYPES)]
                raise ValueError(
                    f"head={head!r} is not a module of {type(self.model).__name__}; its linear layers "
                    f"are: {', '.join(linears[-8:])} (or head='auto', or head=None: no head)"
                )
            return head
        get_classifier = getattr(self.model, "get_classifier", None)  # timm
        if callable(get_classifier):
            found = get_classifier()
            if isinstance(found, nn.Module) and found in names and not isinstance(found, nn.Identity):
                return names[found]
            if isinstance(found, nn.Identity) or found is None:
                return None
            several = [names[m] for m in found if m in names] if isinstance(found, (tuple, list)) else []
            if len(several) > 1:  # timm's distilled DeiT: a class head and a distillation head, averaged
                # Fresh member heads read the first head's input (the class token); no member can start as the
                # model itself, which combines the heads, so keeping the model's head is refused (``wrap``).
                self.combined_heads = several
                log.info(
                    "%s has %d heads (%s) whose outputs it combines; the features are the input of %r",
                    type(self.model).__name__,
                    len(several),
                    ", ".join(several),
                    several[0],
                )
                return several[0]
        # Each output is held (not only its id) until the probe ends: a freed output's id can be reused by a
        # later tensor, the model's output included, which would name a layer the output does not come from.
        outputs: dict[int, tuple[str, Tensor]] = {}
        shapes: list[tuple[str, torch.Size]] = []  # every call, in order: for the hint below

        def record(name: str):
            def hook(_module, _inputs, out) -> None:  # returns None: the output stays the layer's
                outputs[id(out)] = (name, out)
                shapes.append((name, out.shape))

            return hook

        hooks = [m.register_forward_hook(record(n)) for m, n in names.items() if isinstance(m, ADAPTABLE_TYPES)]
        # Eval mode: a model built in training mode would otherwise update its BatchNorm statistics from the
        # probe, changing the user's model (and its fingerprint, so its adapter files would not load again).
        modes = {m: m.training for m in self.model.modules()}
        try:
            args, kwargs = from_batch(self.example)
            self.model.eval()
            with torch.no_grad():
                out = model_output(self.call_model(args, kwargs))
        finally:
            for h in hooks:
                h.remove()
            for module, mode in modes.items():
                module.training = mode
        name, held = outputs.get(id(out), (None, None)) if out is not None else (None, None)
        name = name if held is out else None
        outputs.clear()
        if name is None:
            self.head_hint = selecting_head(shapes, out)
            # With a hint the output is most likely a classifier's, not features: say so louder.
            (log.warning if self.head_hint else log.info)(
                "%s: no layer produces the model's output; the output is the features%s",
                type(self.model).__name__,
                f" ({self.head_hint})" if self.head_hint else "",
            )
        return name

    def initial_head(self, task: str | None, num_classes: int) -> tuple[Tensor, Tensor] | None:
        """The model's own head, for members that keep its classes (``wrap`` asks only then)."""
        if not self.keep_head or self.head_weights is None:
            return None
        return self.head_weights if self.head_weights[0].shape[0] == num_classes else None

    # ----- features ---------------------------------------------------------------------------------------------
    def probe_batch(self) -> dict:
        return dict(self.example)

    def forward(self, batch: dict) -> Tensor:
        args, kwargs = from_batch(batch)
        if self.tap is not None:
            self.tap.features = None
        try:
            out = self.call_model(args, kwargs)
        except Exception:
            if self.tap is None or self.tap.features is None:
                raise
            # The head was reached, and the model's code after it failed on the features standing in for the
            # head's output (DeiT's distilled models average two heads' logits, say): only the features matter.
            out = None
        if self.tap is not None:
            features = self.tap.features
            self.tap.features = None
            if features is None:
                raise RuntimeError(
                    f"the head {self.head_name!r} was not called in this forward; name the head "
                    "the model calls (head=...) or use head=None"
                )
            where = f"the input of the head {self.head_name!r}"
        else:
            features = model_output(out)
            where = "the model's output"
            if features is None:
                raise TypeError(
                    f"{type(self.model).__name__} returns {type(out).__name__}, not a tensor; name the "
                    "module whose input is the features (head=...)"
                )
        if features.dim() == 3 and self.pooling is not None:
            features = pool(features, batch.get("attention_mask"), self.pooling)
        if features.dim() != 2:
            fix = (
                f"pooling= one of {list(POOLINGS)}"
                if features.dim() == 3
                else "head= the name of a module that reads one vector per example"
            )
            raise ValueError(f"{where} has shape {tuple(features.shape)}, not (N, D) features; give {fix}")
        return features

    def default_targets(self) -> list[str]:
        """Every adaptable layer that reaches the features, by exact name (``^`` anchors it to the root)."""
        usage = self.probe_usage()
        unused = usage.unused_modules if usage is not None else set()
        found = [f"^{re.escape(n)}" for n, m in self.model.named_modules() if n and adaptable(m) and n not in unused]
        if not found:  # otherwise the injection's "no target patterns" would be all the user sees
            layers = [
                f"{n} ({type(m).__name__})"
                for n, m in self.model.named_modules()
                if n and not list(m.children()) and n != self.head_name
            ]
            raise ValueError(
                f"{type(self.model).__name__} has no layer the methods can adapt on the way to its features: they "
                "adapt nn.Linear (and Hugging Face's Conv1D) and nn.Conv1d/2d/3d with groups = 1 and zero padding; its "
                + (
                    f"layers are {', '.join(layers[:12])}{' ...' if len(layers) > 12 else ''}"
                    if layers
                    else f"only layer is its head {self.head_name!r}"
                )
            )
        return found

    def train(self, mode: bool = True):
        super().train(mode)
        if getattr(self, "freeze_bn", False):
            keep_batchnorm_statistics(self.model)
        return self


def selecting_head(calls: list[tuple[str, torch.Size]], out: Tensor | None) -> str:
    """Advice for a model that picks tokens *after* its head (GPT-2's and LLaMA's sequence classifiers score
    every token, then keep the last one): the last layer called that gives (N, T, C) for the model's (N, C)."""
    if out is None or out.dim() != 2:
        return ""
    if calls and calls[-1][1] == out.shape:  # the last layer called gives the output's shape: a step after it
        name = calls[-1][0]
        return (
            f"if the output is class scores, its head is likely its last layer {name!r}, which gives the "
            f"output's shape {tuple(out.shape)} before a step such as a softmax; pass head={name!r} to read "
            "the features at its input"
        )
    for name, shape in reversed(calls):
        if len(shape) == 3 and shape[0] == out.shape[0] and shape[-1] == out.shape[-1]:
            return (
                f"its layer {name!r} gives {tuple(shape)}, one row per token, and the model's output "
                f"{tuple(out.shape)} picks one of them; "
                f"to keep it as the head, pass head={name!r} and pooling= one of {list(POOLINGS)} "
                "(the token the model itself reads)"
            )
    return ""


def head_weights(head: nn.Module) -> tuple[Tensor, Tensor] | None:
    """(weight (C, D), bias (C,)) of a linear head, copied; None for other heads (members start fresh)."""
    if not isinstance(head, nn.Linear):
        return None
    bias = head.bias if head.bias is not None else torch.zeros(head.out_features)
    return head.weight.detach().clone(), bias.detach().clone()


def explicit_same_padding(model: nn.Module) -> None:
    """timm's ``Conv2dSame`` (TF "same" padding computed in forward) as padding + a plain convolution, which
    member layers can replace (``sve.backbones.timm_cnn``); nothing without timm or such layers."""
    try:
        from timm.layers.conv2d_same import Conv2dSame

        from sve.backbones.timm_cnn import explicit_same_padding as rebuild
    except ImportError:  # pragma: no cover - timm is a dependency
        return
    if any(isinstance(m, Conv2dSame) for m in model.modules()):
        rebuild(model)
