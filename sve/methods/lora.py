"""LoRA-Ensemble (Muehlematter et al., 2024; Wang et al., 2023) and its one-member case, single LoRA
(Hu et al., 2022; the paper's "Single w/ LoRA").

Every target layer (the backbone's ``target_modules``, the same as SVE's: attention projections and MLP
linears, C.3) becomes a ``LoRALayer`` with one rank-r adapter per member; the backbone is frozen and each
member has its own head. All members run in one batched forward (the default ``EnsembleMethod.forward``),
and their adapters live in the module's ``state_dict``. Trainable parameters: M * sum_l r (in_l + out_l)
plus M heads.
"""

from __future__ import annotations

from sve.inject import inject
from sve.layers.adapter import ADAPTABLE_TYPES
from sve.layers.lora import LoRALayer
from sve.methods.base import EnsembleMethod, count_parameters


def inject_lora(method: EnsembleMethod, ensemble_size: int, rank: int, alpha: float,
                target_modules: list[str] | None) -> list[str]:
    """Freezes the backbone and wraps its target layers with M-member LoRA layers; returns their names."""
    backbone = method.backbone
    method.base_parameter_count = count_parameters(backbone)
    backbone.requires_grad_(False)
    return inject(
        backbone.model,
        target_modules or backbone.target_modules,
        lambda layer: LoRALayer(layer, ensemble_size, rank, alpha),
        types=ADAPTABLE_TYPES,
    )


class LoRAEnsemble(EnsembleMethod):
    """Args:
    rank: LoRA rank r (C.3: 8).
    alpha: LoRA alpha (C.3: 8); the update is scaled by alpha / r.
    target_modules: overrides the backbone's patterns.
    """

    def __init__(self, backbone, ensemble_size: int, num_classes: int, rank: int = 8, alpha: float = 8.0,
                 target_modules: list[str] | None = None, lr: float | None = None):
        super().__init__(backbone, ensemble_size, num_classes, lr)
        self.wrapped = inject_lora(self, self.ensemble_size, rank, alpha, target_modules)
        self.log_summary(self.wrapped)

    def lora_layers(self) -> list[LoRALayer]:
        return [m for m in self.modules() if isinstance(m, LoRALayer)]


class SingleLoRA(LoRAEnsemble):
    """One LoRA adapter and one head ("Single w/ LoRA")."""

    fixed_ensemble_size = 1
