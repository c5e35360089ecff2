"""Single model: standard full fine-tuning of the backbone with one head (the paper's "Single")."""

from __future__ import annotations

from sve.methods.base import EnsembleMethod, count_parameters


class Single(EnsembleMethod):
    """All backbone weights and the head are trained; one member."""

    fixed_ensemble_size = 1

    def __init__(self, backbone, ensemble_size: int, num_classes: int, lr: float | None = None):
        super().__init__(backbone, ensemble_size, num_classes, lr)
        self.base_parameter_count = count_parameters(backbone)
        backbone.requires_grad_(True)
        self.log_summary()
