"""Backbone wrappers: timm vision transformers and Hugging Face encoders / causal LMs."""

from sve.backbones.base import Backbone
from sve.backbones.hf import HFCausalLMBackbone, HFEncoderBackbone, package_path
from sve.backbones.timm_vit import TimmBackbone

__all__ = ["Backbone", "TimmBackbone", "HFEncoderBackbone", "HFCausalLMBackbone", "package_path"]
