"""Any timm model (vision transformers, CNNs, ...), by model name (online) or with a local weights file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import timm
import torch
from torch import Tensor, nn

from sve.backbones.base import Backbone
from sve.errors import InputError, OfflineError
from sve.offline import OFFLINE_HINT, hub_offline, hub_reachable

# Training augmentation (sve.data.vision): ImageNet's random resized crop, or the CIFAR recipe (pad by an
# eighth, random crop, flip), which suits small images upsampled to the input size.
TRAIN_CROPS = ("random_resized", "pad")


class TimmBackbone(Backbone):
    """A timm model created with ``num_classes=0`` so that it returns pooled features (the CLS token).

    Args:
        model_name: timm name with pretrained tag, e.g. ``vit_small_patch16_224.dino``.
        pretrained: load pretrained weights (downloaded by timm, or read from ``checkpoint_path``).
        target_modules: name patterns of the layers to adapt.
        checkpoint_path: local ``.safetensors``/``.bin``/``.pth`` weights used instead of a download.
        image_size: input resolution; position embeddings are resampled by timm when it differs (passed as
            ``img_size`` only to models that take one: CNNs run at any size).
        model_kwargs: extra keyword arguments for ``timm.create_model`` (used by the tiny test model).
        train_crop: ``random_resized`` (ImageNet's augmentation) or ``pad`` (the CIFAR recipe).
    """

    modality = "image"

    def __init__(
        self,
        model_name: str,
        target_modules: list[str],
        pretrained: bool = True,
        checkpoint_path: str | None = None,
        image_size: int = 224,
        model_kwargs: dict | None = None,
        train_crop: str = "random_resized",
    ):
        if train_crop not in TRAIN_CROPS:
            raise InputError(f"backbone.train_crop={train_crop!r} is not valid; choose one of {list(TRAIN_CROPS)}")
        kwargs = plain(dict(model_kwargs or {}))  # OmegaConf containers would reach timm as ListConfig
        model = self.create_model(model_name, pretrained, checkpoint_path, image_size, kwargs)
        super().__init__(model, target_modules)
        self.image_size = image_size
        self.train_crop = train_crop  # read by sve.data.vision: how training images are augmented
        data_cfg = model.pretrained_cfg or {}
        self.mean = tuple(data_cfg.get("mean", (0.485, 0.456, 0.406)))
        self.std = tuple(data_cfg.get("std", (0.229, 0.224, 0.225)))
        with torch.no_grad():  # the width the model really outputs, on a probe input
            was = model.training
            self.eval()
            self.feature_dim = int(self(self.probe_batch()).shape[-1])
            model.train(was)

    def create_model(
        self, model_name: str, pretrained: bool, checkpoint_path: str | None, image_size: int, kwargs: dict
    ) -> nn.Module:
        """The timm model with ``num_classes=0``: downloaded, read from ``checkpoint_path`` or random."""
        if pretrained and checkpoint_path:
            path = Path(checkpoint_path).expanduser()  # ~ works
            if not path.exists():
                hint = " (make vit-s14 converts it there)" if "vit_s14_focus" in str(path) else ""
                raise InputError(f"backbone.checkpoint_path={checkpoint_path} does not exist{hint}")
            kwargs = {**kwargs, "pretrained_cfg_overlay": {"file": str(path)}}
        online = not pretrained or "file" in kwargs.get("pretrained_cfg_overlay", {}) or hub_reachable()
        try:
            with hub_offline(not online):  # no network: the cache only, no half a minute of retries
                return create_timm(model_name, pretrained=pretrained, image_size=image_size, num_classes=0, **kwargs)
        except Exception as err:  # network errors come from several libraries; re-raise with the fix
            if not pretrained or isinstance(err, TypeError):  # a bad model_kwargs key is not a network problem
                raise
            reason = f"{type(err).__name__}: {err}" if online else OFFLINE_HINT
            raise (OfflineError if not online else RuntimeError)(
                f"could not load pretrained timm model '{model_name}' ({reason}). Without network access, download "
                "the weights elsewhere and set backbone.checkpoint_path=/path/to/model.safetensors, or use "
                "backbone.pretrained=false."
            ) from None if not online else err

    def probe_batch(self) -> dict:
        return {"pixel_values": torch.zeros(1, 3, self.image_size, self.image_size)}

    def forward(self, batch: dict) -> Tensor:
        return self.model(batch["pixel_values"])  # (N, D) pooled features


def create_timm(model_name: str, pretrained: bool, image_size: int, **kwargs) -> nn.Module:
    """``timm.create_model`` with ``img_size=image_size`` for the architectures that take one.

    Vision transformers need ``img_size`` (their position table is sized, or resampled, for it); CNNs such as
    EfficientNet or ResNet have no such argument and their constructor rejects it, while they run at any input
    size anyway. timm offers no way to ask a model class for its arguments before building it, so the size is
    offered first and dropped only when the constructor refuses exactly that keyword. An ``img_size`` given in
    ``model_kwargs`` is always passed.
    """
    if "img_size" in kwargs:
        return timm.create_model(model_name, pretrained=pretrained, **kwargs)
    try:
        return timm.create_model(model_name, pretrained=pretrained, img_size=image_size, **kwargs)
    except TypeError as err:
        if "unexpected keyword argument 'img_size'" not in str(err):
            raise
    return timm.create_model(model_name, pretrained=pretrained, **kwargs)


def plain(value):
    """Nested mappings and sequences as dicts and tuples (timm compares sizes with tuples)."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(plain(v) for v in value)
    return value
