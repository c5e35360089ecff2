"""SVE + LoRA (``method=sve_lora``): SV-Ensemble with a LoRA update on the same layers, the combination the
paper's Sec. 6 leaves to future work. The variants (where the update lives, who owns it) are in
``sve.layers.sv_lora``; everything else (init noise, member biases, SVD cache, inference paths, the
non-negative singular values) is SVE's. Trainable parameters: SVE's plus, per adapter,
q (in + out) per layer in ``weight`` space or 2 q r in ``basis`` space (r = min(in, out)).
"""

from __future__ import annotations

from torch import nn

from sve.errors import InputError
from sve.layers.member import CONV_TYPES
from sve.layers.sv_lora import LoRATerm, SVLoRAConv, SVLoRALinear
from sve.methods.sve import SVE


class SVELoRA(SVE):
    """Args (beside SVE's):
    lora_rank: q, the rank of each update.
    lora_alpha: the update is scaled by lora_alpha / lora_rank (LoRA's convention).
    lora_space: ``weight`` (W_m = U diag(s_m) V^T + B_m A_m) or ``basis`` (W_m = U (diag(s_m) + B_m A_m) V^T).
    lora_members: ``per_member`` (one update per member) or ``shared`` (one for all).
    sv_lr: the singular values' own learning rate (None: the method's, like every other tensor). One rate for
      both lets the tuning pick the adapter's, at which the singular values barely leave their initial noise
      (the miniature's hybrids: spread 0.9% against sigma_init 1% on SST-2); SVE alone tunes to a rate about
      30 times higher there.
    """

    display_name = "SVE + LoRA"  # beyond the paper (its Sec. 6 future work)
    option_display_names = {
        "sve_lora_shared": "SVE + shared LoRA",
        "sve_lora_rates": "SVE + LoRA (own SV rate)",
    }  # sv_lr tuned apart from the adapters' rate
    trains = "each member's singular values (and biases), the LoRA updates and the heads"

    def __init__(
        self,
        backbone,
        ensemble_size: int,
        num_classes: int,
        lora_rank: int = 8,
        lora_alpha: float = 8.0,
        lora_space: str = "weight",
        lora_members: str = "per_member",
        sv_lr: float | None = None,
        **kwargs,
    ):
        if sv_lr is not None and (isinstance(sv_lr, bool) or not isinstance(sv_lr, (int, float)) or not sv_lr > 0):
            raise InputError(
                f"method.sv_lr={sv_lr!r}: the singular values' learning rate must be a positive number, "
                "or null to train them at the method's learning rate"
            )
        self.lora_options = dict(rank=lora_rank, alpha=lora_alpha, space=lora_space, members=lora_members)
        self.sv_lr = None if sv_lr is None else float(sv_lr)
        super().__init__(backbone, ensemble_size, num_classes, **kwargs)

    def parameter_groups(self) -> list[dict]:
        if self.sv_lr is None:
            return super().parameter_groups()
        values = [m.singular_values for m in self.modules() if isinstance(m, LoRATerm)]
        chosen = {id(v) for v in values}
        rest = [p for p in self.trainable_parameters() if id(p) not in chosen]
        return [{"params": values, "lr": self.sv_lr}, {"params": rest}]

    def make_layer(self, layer: nn.Module) -> SVLoRALinear:
        convert = SVLoRAConv.from_conv if isinstance(layer, CONV_TYPES) else SVLoRALinear.from_linear
        sv = convert(
            layer,
            ensemble_size=self.ensemble_size,
            sigma_init=self.sigma_init,
            member_bias=self.member_bias,
            svd_dtype=self.svd_dtype,
            factor_dtype=self.factor_dtype,
            cache=self.svd_cache,
        )
        sv.add_lora(**self.lora_options)
        return sv
