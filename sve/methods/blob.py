"""BLoB: Bayesian LoRA by backpropagation (Wang et al., 2024); the "Blob" rows of Table 3.

Every target layer becomes a ``BLoBLayer`` (Gaussian posterior over LoRA's A, deterministic B); the backbone
is frozen and there is one head. Training minimises the per-example negative ELBO

    L = CE(one posterior sample per example) + kl_weight * KL(q(A) || p(A)),

where kl_weight plays the role of 1/N (BLoB divides the KL by the number of training examples). Evaluation
averages ``num_samples`` posterior samples (default 10), returned as (S, B, C) members: each forward draws
its samples once (``BLoBLayer.draw``) and installs them as the layers' member set, so the samples run like
any ensemble's members (batched, or in chunks with ``members_at_once``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch
from torch import Tensor, nn

from sve.layers.blob import BLoBLayer
from sve.layers.draws import rows_to_draw
from sve.methods.base import batch_size
from sve.methods.kinds import SampledMethod


class BLoB(SampledMethod):
    """Args:
    rank, alpha: LoRA rank and alpha (8, 8 as for the other LoRA baselines).
    init_std: initial scale of G (sigma = G^2).
    prior_std: std of the Gaussian prior on A.
    kl_weight: weight of the KL term, about 1 / (number of training examples).
    num_samples: posterior samples at evaluation (Table 3: 10).
    """

    display_name = "Blob"
    trains = "a Gaussian posterior over LoRA's A, LoRA's B and the head"

    def __init__(
        self,
        backbone,
        ensemble_size: int,
        num_classes: int,
        rank: int = 8,
        alpha: float = 8.0,
        init_std: float = 0.05,
        prior_std: float = 0.2,
        kl_weight: float = 1e-4,
        num_samples: int = 10,
        **common,
    ):
        super().__init__(backbone, ensemble_size, num_classes, **common)
        self.rank, self.alpha, self.init_std, self.prior_std = rank, alpha, init_std, prior_std
        self.kl_weight = kl_weight
        self.num_samples = num_samples
        self.adapt()

    def make_layer(self, layer: nn.Module) -> BLoBLayer:
        return BLoBLayer(layer, self.rank, self.alpha, self.init_std, self.prior_std)

    @contextmanager
    def samples(self, K: int) -> Iterator[None]:
        """K fresh posterior samples as every layer's member set, inside the context. In training they are
        drawn for the whole global batch and this micro-batch keeps its examples' (``sve.layers.draws``)."""
        count, mine = rows_to_draw(K) if self.training else (K, slice(None))
        with ExitStack() as stack:
            for layer in self.member_layers():
                stack.enter_context(layer.use_bank(**{k: v[mine] for k, v in layer.draw(count).items()}))
            yield

    def forward(self, batch: dict) -> Tensor:
        with self.samples(batch_size(batch) if self.training else self.num_samples):
            return super().forward(batch)

    def member_features(self, batch: dict, members: list[int]) -> Tensor:
        if not self.training:
            return super().member_features(batch, members)
        # Training: sample b serves example b, so the B examples are B members of one row each; where the layers
        # are not called batch-first (``stacks_members``, decided before this pass), one sample for the batch.
        B = batch_size(batch)
        if B > 1 and not self.stacks_members(batch):
            with self.samples(1):
                return self.backbone(batch).unsqueeze(0)
        with self.expect_rows(B):
            return self.backbone(batch).unsqueeze(0)  # (1, B, D)

    def kl(self) -> Tensor:
        return torch.stack([layer.kl() for layer in self.member_layers()]).sum()

    def loss(self, member_logits: Tensor, labels: Tensor, ensemble_size: int | None = None) -> Tensor:
        # One training member (each example its own sample), so a step is never split into member chunks.
        return super().loss(member_logits, labels, ensemble_size) + self.kl_weight * self.kl()

    def report(self) -> dict:
        return {**super().report(), "num_samples": self.num_samples, "kl_weight": self.kl_weight}
