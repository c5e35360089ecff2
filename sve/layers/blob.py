"""BLoB layer: Bayesian LoRA by backpropagation (Wang et al., 2024, "BLoB: Bayesian Low-Rank Adaptation by
Backpropagation for Large Language Models").

The LoRA matrix A gets a mean-field Gaussian posterior q(A) = N(mu, sigma^2) with sigma = G o G (BLoB's
parameterisation, which keeps sigma positive without a softplus); B stays deterministic and starts at zero,
so every sample equals the base layer at init. The KL to the prior N(0, prior_std^2) is closed form:

    KL = sum_ij [ log(prior_std / sigma_ij) + (sigma_ij^2 + mu_ij^2) / (2 prior_std^2) - 1/2 ]  (>= 0).

Samples are members: ``draw(K)`` gives K samples of (A, B) that the method installs as the layer's member
set (``use_bank``); in training every example draws its own (K = batch size, one row each: a batched matmul,
no flipout needed), at evaluation K = ``num_samples`` blocks of the repeated batch. Without a bank the
layer computes the posterior mean.
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

    def __init__(
        self, base: nn.Module, rank: int = 8, alpha: float = 8.0, init_std: float = 0.05, prior_std: float = 0.2
    ):
        super().__init__(base, ensemble_size=1, rank=rank, alpha=alpha)
        self.prior_std = prior_std
        self.lora_G = nn.Parameter(torch.empty_like(self.lora_A).uniform_(init_std / math.sqrt(2), init_std))

    def std(self) -> Tensor:
        return self.lora_G**2

    def draw(self, K: int) -> dict[str, Tensor]:
        """K posterior samples as a bank: A = mu + sigma * noise (K, r, in'), B shared (K, out, r)."""
        noise = torch.randn(K, *self.lora_A.shape[1:], device=self.lora_A.device, dtype=self.lora_A.dtype)
        return {"lora_A": self.lora_A + self.std() * noise, "lora_B": self.lora_B.expand(K, -1, -1)}

    def kl(self) -> Tensor:
        sigma, mu, p = self.std(), self.lora_A, self.prior_std
        return (math.log(p) - sigma.log() + (sigma**2 + mu**2) / (2 * p**2) - 0.5).sum()
