"""BatchEnsemble (Wen et al., 2020) on a pretrained backbone (C.3: lr 1e-4).

Every target layer becomes a ``BatchEnsembleLayer``: the pretrained weight is the shared "slow" weight, each
member adds rank-one "fast" weights (r_m, s_m), initialised to one, and its own bias, initialised to the
pretrained bias, so every member starts as the pretrained model; each member has its own head. As in Wen et
al., the shared weights train too (the whole backbone, with the small full-fine-tuning learning rate of C.3);
``train_backbone: false`` freezes them and trains only fast weights, member biases and heads.

What tells the members apart is their heads (drawn independently). When the backbone supplies a pretrained
head (its own task), every member starts as the same model and sees the same batches, so with fast weights at
exactly one the members stay identical: ``init_std`` > 0 draws the fast weights around one instead (a
warning says so when it is 0 there).

Trainable parameters with ``train_backbone: false``: sum_l M (in_l + out_l [+ out_l with a bias]) plus the
heads; with ``true`` add the backbone minus the target layers' pretrained biases (which became member biases).
"""

from __future__ import annotations

from torch import nn

from sve.layers.batch_ensemble import BatchEnsembleLayer
from sve.methods.base import EnsembleMethod


class BatchEnsemble(EnsembleMethod):
    """Args:
    train_backbone: also train the shared weights (Wen et al.) rather than only the fast weights.
    init_std: standard deviation of the fast weights around one at init (module docstring).
    """

    display_name = "Batch Ensemble"
    trains = "each member's fast weights, biases and head, and (train_backbone) the shared weights"

    def __init__(
        self,
        backbone,
        ensemble_size: int,
        num_classes: int,
        train_backbone: bool = True,
        init_std: float = 0.0,
        **common,
    ):
        super().__init__(backbone, ensemble_size, num_classes, **common)
        self.train_backbone = train_backbone
        self.init_std = init_std
        self.warn_if_members_start_alike("method.init_std", init_std)  # fast weights all start at one
        self.adapt()

    def make_layer(self, layer: nn.Module) -> BatchEnsembleLayer:
        return BatchEnsembleLayer(layer, self.ensemble_size, self.init_std)

    def report(self) -> dict:
        return {**super().report(), "init_std": self.init_std}
