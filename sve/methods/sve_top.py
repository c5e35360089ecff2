"""Top-r SV-Ensemble (``method=sve_top``): SVE's members on the top ``top_rank`` singular directions of every
target weight, the remainder frozen and shared (``sve.layers.sv_top``). Beyond the paper, whose SVE is full
rank (``method=sve``): an option for memory and latency, measured against LoRA-Ensemble in the benchmark."""

from __future__ import annotations

from torch import nn

from sve.layers.member import CONV_TYPES
from sve.layers.sv_top import SVTopConv, SVTopLinear
from sve.methods.sve import SVE


class SVETop(SVE):
    """Args (beside SVE's):
    top_rank: r, the singular directions per layer whose values each member owns (a layer with fewer keeps all).
    """

    display_name = "SVE (top-8)"  # beyond the paper
    option_display_names = {"sve_top32": "SVE (top-32)"}
    trains = "each member's top singular values (and biases) and its head"

    def __init__(self, backbone, ensemble_size: int, num_classes: int, top_rank: int = 8, **kwargs):
        self.top_rank = top_rank
        super().__init__(backbone, ensemble_size, num_classes, **kwargs)

    def make_layer(self, layer: nn.Module) -> SVTopLinear:
        convert = SVTopConv.from_conv_top if isinstance(layer, CONV_TYPES) else SVTopLinear.from_linear_top
        return convert(
            layer,
            self.top_rank,
            ensemble_size=self.ensemble_size,
            sigma_init=self.sigma_init,
            member_bias=self.member_bias,
            svd_dtype=self.svd_dtype,
            factor_dtype=self.factor_dtype,
            cache=self.svd_cache,
        )
