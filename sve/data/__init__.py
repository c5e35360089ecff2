"""Data modules; see ``sve.data.base`` for the batch format.

The classes are imported on first use (``sve.data.SST2Data``, a config's ``_target_``), so that
``sve.data.options`` checks a config's values without torch (``sve.runs.validate``)."""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ClassificationData": "base",
    "ImageClassificationData": "base",
    "TextClassificationData": "base",
    "SST2Data": "sst2",
    "ARCEasyData": "arc",
    "Flowers102Data": "image_sets",
    "DTDData": "image_sets",
    "OxfordPetsData": "image_sets",
    "CIFAR100Data": "image_sets",
    "CIFAR100CData": "cifar_c",
    "CIFAR10Data": "image_sets",
    "FashionMNISTData": "image_sets",
    "SyntheticImageData": "synthetic",
    "SyntheticTextData": "synthetic",
    "ImageFolderData": "image_folder",
    "TextTableData": "text_table",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
