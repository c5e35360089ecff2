"""BLoB layer: Bayesian LoRA by backpropagation (Wang et al., 2024, "BLoB: Bayesian Low-Rank Adaptation by
Backpropagation for Large Language Models").

The LoRA matrix A gets a mean-field Gaussian posterior q(A) = N(mu, sigma^2) with sigma = G o G (BLoB's
parameterisation, which keeps sigma positive without a softplus); B stays deterministic and starts at zero,
so every sample equals the base layer at init. The KL to the prior N(0, prior_std^2) is closed form:

    KL = sum_ij [ log(prior_std / sigma_ij) + (sigma_ij^2 + mu_ij^2) / (2 prior_std^2) - 1/2 ]  (>= 0).

Sampling: with ``samples = None`` (training) every input row draws its own A (the rows are the K "members"
of a batched matmul, so this costs no more than one matmul and needs no flipout); with ``samples = K``
(evaluation) the input is stacked K times member-major and block k uses sample k.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from sve.layers.lora import LoRALayer


class BLoBLayer(LoRALayer):
    """Args:
    base: the layer to adapt.
    rank, alpha: as in LoRA.
    init_std: G is drawn from U(init_std / sqrt(2), init_std), so sigma = G^2 starts small.
    prior_std: std of the zero-mean Gaussian prior on A.
    """

    def __init__(self, base: nn.Module, rank: int = 8, alpha: float = 8.0, init_std: float = 0.05,
                 prior_std: float = 0.2):
        super().__init__(base, ensemble_size=1, rank=rank, alpha=alpha)
        self.prior_std = prior_std
        self.lora_G = nn.Parameter(torch.empty_like(self.lora_A).uniform_(init_std / math.sqrt(2), init_std))
        self.samples: int | None = None

    def std(self) -> Tensor:
        return self.lora_G**2

    def forward(self, x: Tensor) -> Tensor:
        if self._override is not None:
            return super().forward(x)
        K = x.shape[0] if self.samples is None else self.samples
        A = self.lora_A + self.std() * torch.randn(K, *self.lora_A.shape[1:], device=x.device)  # (K, r, in')
        y = self.base(x)
        return y + self.delta(x, A, self.lora_B.expand(K, -1, -1)).to(y.dtype)

    def kl(self) -> Tensor:
        sigma, mu, p = self.std(), self.lora_A, self.prior_std
        return (math.log(p) - sigma.log() + (sigma**2 + mu**2) / (2 * p**2) - 0.5).sum()
