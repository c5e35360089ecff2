"""Layers that hold per-member parameters around a frozen pretrained weight."""

from sve.layers.batch_ensemble import BatchEnsembleLayer
from sve.layers.blob import BLoBLayer
from sve.layers.lora import LoRALayer
from sve.layers.sv_conv import SVConv2d
from sve.layers.sv_linear import SVLinear, weight_matrix

__all__ = ["SVLinear", "SVConv2d", "weight_matrix", "LoRALayer", "BatchEnsembleLayer", "BLoBLayer"]
