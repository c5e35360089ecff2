"""Layers that hold per-member parameters around a frozen pretrained weight."""

from sve.layers.sv_linear import SVLinear, weight_matrix

__all__ = ["SVLinear", "weight_matrix"]
