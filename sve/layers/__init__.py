"""Layers that hold per-member parameters around a frozen pretrained weight (one protocol: MemberLayer)."""

from sve.layers.batch_ensemble import BatchEnsembleLayer
from sve.layers.blob import BLoBLayer
from sve.layers.lora import LoRALayer
from sve.layers.member import ADAPTABLE_TYPES, CONV_TYPES, MemberLayer, MemberLayoutError, member_layers, weight_matrix
from sve.layers.sv_conv import SVConv, SVConv2d
from sve.layers.sv_linear import SVLinear

__all__ = [
    "MemberLayer",
    "MemberLayoutError",
    "member_layers",
    "SVLinear",
    "SVConv",
    "SVConv2d",
    "weight_matrix",
    "LoRALayer",
    "BatchEnsembleLayer",
    "BLoBLayer",
    "ADAPTABLE_TYPES",
    "CONV_TYPES",
]
