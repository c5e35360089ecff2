"""Data modules; see ``sve.data.base`` for the batch format."""

from sve.data.base import ClassificationData, ImageClassificationData, TextClassificationData
from sve.data.sst2 import SST2Data
from sve.data.synthetic import SyntheticImageData, SyntheticTextData

__all__ = [
    "ClassificationData",
    "ImageClassificationData",
    "TextClassificationData",
    "SST2Data",
    "SyntheticImageData",
    "SyntheticTextData",
]
