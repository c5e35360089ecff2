"""BatchEnsemble (Wen et al., 2020) on a pretrained backbone (C.3: lr 1e-4).

Every target layer becomes a ``BatchEnsembleLayer``: the pretrained weight is the shared "slow" weight, each
member adds rank-one "fast" weights (r_m, s_m), initialised to one, and its own bias, initialised to the
pretrained bias, so every member starts as the pretrained model; each member has its own head. As in Wen et
al., the shared weights train too (the whole backbone, with the small full-fine-tuning learning rate of C.3);
``train_backbone: false`` freezes them and trains only fast weights, member biases and heads.

Trainable parameters with ``train_backbone: false``: sum_l M (in_l + out_l [+ out_l with a bias]) plus the
heads; with ``true`` add the backbone minus the target layers' pretrained biases (which became member biases).
"""

from __future__ import annotations

from sve.inject import inject
from sve.layers.adapter import ADAPTABLE_TYPES
from sve.layers.batch_ensemble import BatchEnsembleLayer
from sve.methods.base import EnsembleMethod, count_parameters


class BatchEnsemble(EnsembleMethod):
    """Args:
    train_backbone: also train the shared weights (Wen et al.) rather than only the fast weights.
    target_modules: overrides the backbone's patterns.
    """

    def __init__(self, backbone, ensemble_size: int, num_classes: int, train_backbone: bool = True,
                 target_modules: list[str] | None = None, lr: float | None = None):
        super().__init__(backbone, ensemble_size, num_classes, lr)
        self.base_parameter_count = count_parameters(backbone)
        backbone.requires_grad_(train_backbone)
        M = self.ensemble_size
        self.wrapped = inject(
            backbone.model,
            target_modules or backbone.target_modules,
            lambda layer: BatchEnsembleLayer(layer, M),
            types=ADAPTABLE_TYPES,
        )
        self.log_summary(self.wrapped)
