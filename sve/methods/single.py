"""Single model: standard full fine-tuning of the backbone with one head (the paper's "Single")."""

from __future__ import annotations

from sve.methods.base import EnsembleMethod


class Single(EnsembleMethod):
    """All backbone weights that produce the features, and the head, are trained; one member."""

    display_name = "Single"
    trains = "the whole backbone and the head"

    fixed_ensemble_size = 1
    train_backbone = True

    def __init__(self, backbone, ensemble_size: int, num_classes: int, **common):
        super().__init__(backbone, ensemble_size, num_classes, **common)
        self.adapt()
