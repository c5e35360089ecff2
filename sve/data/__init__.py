"""Data modules; see ``sve.data.base`` for the batch format."""

from sve.data.arc import ARCEasyData
from sve.data.base import ClassificationData, ImageClassificationData, TextClassificationData
from sve.data.cifar_c import CIFAR100CData
from sve.data.image_folder import ImageFolderData
from sve.data.image_sets import (
    CIFAR10Data,
    CIFAR100Data,
    DTDData,
    FashionMNISTData,
    Flowers102Data,
    OxfordPetsData,
)
from sve.data.sst2 import SST2Data
from sve.data.synthetic import SyntheticImageData, SyntheticTextData
from sve.data.text_table import TextTableData

__all__ = [
    "ClassificationData",
    "ImageClassificationData",
    "TextClassificationData",
    "SST2Data",
    "ARCEasyData",
    "Flowers102Data",
    "DTDData",
    "OxfordPetsData",
    "CIFAR100Data",
    "CIFAR100CData",
    "CIFAR10Data",
    "FashionMNISTData",
    "SyntheticImageData",
    "SyntheticTextData",
    "ImageFolderData",
    "TextTableData",
]
