"""Backbone wrappers: timm vision transformers and CNNs, Hugging Face encoders / causal LMs, CIFAR ResNets."""

from sve.backbones.base import Backbone
from sve.backbones.choice_lm import ChoiceCausalLMBackbone
from sve.backbones.hf import HFCausalLMBackbone, HFEncoderBackbone
from sve.backbones.resnet_cifar import ResNetCIFARBackbone
from sve.backbones.timm_cnn import TimmCNNBackbone
from sve.backbones.timm_vit import TimmBackbone

__all__ = [
    "Backbone",
    "TimmBackbone",
    "TimmCNNBackbone",
    "HFEncoderBackbone",
    "HFCausalLMBackbone",
    "ChoiceCausalLMBackbone",
    "ResNetCIFARBackbone",
]
