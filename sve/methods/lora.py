"""LoRA-Ensemble (Muehlematter et al., 2024; Wang et al., 2023) and its one-member case, single LoRA
(Hu et al., 2022; the paper's "Single w/ LoRA").

Every target layer (the backbone's ``target_modules``, the same as SVE's: attention projections and MLP
linears, C.3) becomes a ``LoRALayer`` with one rank-r adapter per member; the backbone is frozen and each
member has its own head. All members run in one batched forward, and their adapters live in the module's
``state_dict``. Trainable parameters: M * sum_l r (in_l + out_l) plus M heads. ``dropout`` (0.0 by default)
drops the input of every adapter's low-rank path while training, as peft's ``lora_dropout``
(``sve.layers.lora``); Table 3's LoRA rows use Yang et al.'s 0.1.
"""

from __future__ import annotations

from torch import nn

from sve.errors import InputError
from sve.layers.lora import LoRALayer
from sve.methods.base import EnsembleMethod


class LoRAEnsemble(EnsembleMethod):
    """Args:
    rank: LoRA rank r (C.3: 8).
    alpha: LoRA alpha (C.3: 8); the update is scaled by alpha / r.
    dropout: LoRA dropout on the low-rank path's input in training (0.0: none; Yang et al., 2024: 0.1).
    init_scale: the factor on each member's initial A draw (1.0: peft's init): how far apart the members start,
        LoRA-Ensemble's own diversity knob (``sve.layers.lora.LoRALayer``).
    """

    display_name = "LoRA-Ensemble"
    trains = "one LoRA adapter and one head per member"

    adapters_per_member = True  # False: one adapter shared by all members (last-layer, checkpoint ensembles)

    def __init__(
        self,
        backbone,
        ensemble_size: int,
        num_classes: int,
        rank: int = 8,
        alpha: float = 8.0,
        dropout: float = 0.0,
        init_scale: float = 1.0,
        **common,
    ):
        super().__init__(backbone, ensemble_size, num_classes, **common)
        if not 0 <= dropout < 1:
            raise InputError(f"method.dropout={dropout} is not valid: the LoRA dropout must be in [0, 1)")
        if not (isinstance(init_scale, (int, float)) and not isinstance(init_scale, bool) and init_scale > 0):
            raise InputError(f"method.init_scale={init_scale!r} is not valid: it must be a positive number")
        self.rank, self.alpha, self.dropout, self.init_scale = rank, alpha, float(dropout), float(init_scale)
        self.adapt()

    def make_layer(self, layer: nn.Module) -> LoRALayer:
        members = self.ensemble_size if self.adapters_per_member else 1
        return LoRALayer(layer, members, self.rank, self.alpha, self.dropout, self.init_scale)

    def lora_layers(self) -> list[LoRALayer]:
        return [m for m in self.modules() if isinstance(m, LoRALayer)]


class SingleLoRA(LoRAEnsemble):
    """One LoRA adapter and one head ("Single w/ LoRA")."""

    display_name = "Single w/ LoRA"
    option_display_names = {"single_lora_yang": "Single (LoRA, Yang et al.)"}  # Table 3's rows, on LoRA as their source
    trains = "one LoRA adapter and the head"

    fixed_ensemble_size = 1
