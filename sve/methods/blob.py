"""BLoB: Bayesian LoRA by backpropagation (Wang et al., 2024); the "Blob" rows of Table 3.

Every target layer becomes a ``BLoBLayer`` (Gaussian posterior over LoRA's A, deterministic B); the backbone
is frozen and there is one head. Training minimises the per-example negative ELBO

    L = CE(one posterior sample per example) + kl_weight * KL(q(A) || p(A)),

where kl_weight plays the role of 1/N (BLoB divides the KL by the number of training examples). Evaluation
averages ``num_samples`` posterior samples (default 10), returned as (S, B, C) members from one batched
forward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sve.inject import inject
from sve.layers.adapter import ADAPTABLE_TYPES
from sve.layers.blob import BLoBLayer
from sve.members import check_member_logits, repeat_batch, split_members
from sve.methods.base import EnsembleMethod, count_parameters, mask_choices


class BLoB(EnsembleMethod):
    """Args:
    rank, alpha: LoRA rank and alpha (8, 8 as for the other LoRA baselines).
    init_std: initial scale of G (sigma = G^2).
    prior_std: std of the Gaussian prior on A.
    kl_weight: weight of the KL term, about 1 / (number of training examples).
    num_samples: posterior samples at evaluation (Table 3: 10).
    target_modules: overrides the backbone's patterns.
    """

    fixed_ensemble_size = 1

    def __init__(self, backbone, ensemble_size: int, num_classes: int, rank: int = 8, alpha: float = 8.0,
                 init_std: float = 0.05, prior_std: float = 0.2, kl_weight: float = 1e-4, num_samples: int = 10,
                 target_modules: list[str] | None = None, lr: float | None = None):
        super().__init__(backbone, ensemble_size, num_classes, lr)
        self.base_parameter_count = count_parameters(backbone)
        backbone.requires_grad_(False)
        self.kl_weight = kl_weight
        self.num_samples = num_samples
        self.wrapped = inject(
            backbone.model,
            target_modules or backbone.target_modules,
            lambda layer: BLoBLayer(layer, rank, alpha, init_std, prior_std),
            types=ADAPTABLE_TYPES,
        )
        self.layers = [m for m in backbone.modules() if isinstance(m, BLoBLayer)]
        self.log_summary(self.wrapped)

    def forward(self, batch: dict) -> Tensor:
        S = 1 if self.training else self.num_samples
        for layer in self.layers:  # training: one sample per row; evaluation: sample s for block s
            layer.samples = None if self.training else S
        features = split_members(self.backbone(repeat_batch(batch, S)), S)  # (S, B, D)
        W, b = self.heads.weight[0], self.heads.bias[0]
        logits = features.to(W.dtype) @ W.t() + b  # (S, B, C)
        return check_member_logits(mask_choices(logits, batch), S)

    def kl(self) -> Tensor:
        return torch.stack([layer.kl() for layer in self.layers]).sum()

    def loss(self, member_logits: Tensor, labels: Tensor) -> Tensor:
        return super().loss(member_logits, labels) + self.kl_weight * self.kl()

    def report(self) -> dict:
        return {"num_samples": self.num_samples, "kl_weight": self.kl_weight}
