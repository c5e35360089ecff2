"""Bayes-LoRA: a Laplace approximation over a MAP-trained single LoRA (Yang et al., 2024, "Bayesian low-rank
adaptation for large language models"), both rows of Table 3.

Training is plain single LoRA (MAP). ``after_fit`` fits a Kronecker-factored (KFAC, GGN) Laplace posterior
N(theta_MAP, (H + delta I)^-1) and sets the scalar prior precision delta by maximising the Laplace marginal
likelihood (laplace-torch ``optimize_prior_precision(method="marglik")``):

- ``bayes_lora_llla`` (last-layer Laplace): over the classification head, on features of the MAP backbone.
  This is laplace-torch end to end (``KronLaplace`` with its default curvlinops backend on an ``nn.Linear``).
- ``bayes_lora_la``: over all LoRA factors A and B, the head kept at its MAP value. laplace-torch's KFAC
  backends do not handle our LoRA factors, so ``sve.methods.kfac.LoRAKFAC`` computes the factors; the rest
  is laplace-torch.

Evaluation draws ``num_samples`` weight samples once per forward and returns their logits as members,
(S, B, C): for LA the samples become the LoRA layers' member set (``MemberLayer.use_bank``) and run like any
ensemble's members; for LLLA they are head weights on one backbone pass. This is the sampled ("nn") predictive; Yang et
al. report the linearised (GLM) one, which needs per-example Jacobians. For LLLA the two coincide, since the
logits are linear in the head's weights.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch
from laplace import KronLaplace
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from sve.inject import LINEAR_TYPES
from sve.methods.base import mask_choices
from sve.methods.kfac import LoRAKFAC, LoRAKronLaplace
from sve.methods.lora import SingleLoRA

log = logging.getLogger(__name__)


def to_device(batch: dict, device) -> dict:
    return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}


class _MAPLogits(nn.Module):
    """The MAP model as laplace-torch wants it: batch dict -> (B, C) logits."""

    def __init__(self, method: "BayesLoRA"):
        super().__init__()
        self.method = method

    def forward(self, batch: dict) -> Tensor:
        return self.method.map_logits(to_device(batch, self.method.heads.weight.device))[0]  # (B, C)


class BayesLoRA(SingleLoRA):
    """Args:
    num_samples: posterior samples at evaluation.
    prior_precision: initial prior precision before the marginal-likelihood optimisation.
    marglik_steps: Adam steps of that optimisation (laplace-torch default 100).
    """

    shared_head = True
    refit_after_loading = True  # the posterior is a laplace-torch object, not part of the state dict

    def __init__(self, backbone, ensemble_size: int, num_classes: int, num_samples: int = 10,
                 prior_precision: float = 1.0, marglik_steps: int = 100, **kwargs):
        super().__init__(backbone, ensemble_size, num_classes, **kwargs)
        self.num_samples = num_samples
        self.init_prior_precision = prior_precision
        self.marglik_steps = marglik_steps
        self.laplace = None  # set by after_fit

    def num_members(self) -> int:
        return 1 if self.training or self.laplace is None else self.num_samples

    def map_logits(self, batch: dict) -> Tensor:
        """(1, B, C) logits of the MAP model, whether or not a posterior has been fitted."""
        return mask_choices(self.member_logits(batch, [0]), batch)

    def forward(self, batch: dict) -> Tensor:
        if self.num_members() == 1:
            return super().forward(batch)
        with self.posterior_samples(self.num_samples):
            return super().forward(batch)

    def after_fit(self, datamodule) -> None:
        device = "cuda" if torch.cuda.is_available() else self.heads.weight.device
        self.to(device).eval()
        self.laplace = self.fit_laplace(datamodule.train_dataloader())
        log.info("%s: prior precision %.4g (marginal likelihood)", type(self).__name__,
                 float(self.laplace.prior_precision))

    def report(self) -> dict:
        facts = {**super().report(), "num_samples": self.num_samples}
        if self.laplace is not None:
            facts.update(prior_precision=float(self.laplace.prior_precision),
                         laplace_parameters=int(self.laplace.n_params))
        return facts

    def fit_laplace(self, loader: DataLoader):  # pragma: no cover - abstract
        raise NotImplementedError

    def posterior_samples(self, S: int):  # pragma: no cover - abstract
        """Context in which the S members are S posterior samples."""
        raise NotImplementedError


class BayesLoRALLLA(BayesLoRA):
    """Last-layer Laplace: Kronecker-factored posterior over the head."""

    @torch.no_grad()
    def features(self, batch: dict) -> Tensor:
        return self.backbone(to_device(batch, self.heads.weight.device))  # (B, D)

    def fit_laplace(self, loader: DataLoader):
        feats, labels = zip(*[(self.features(b), b["labels"]) for b in loader])
        head = nn.Linear(self.heads.weight.shape[2], self.num_classes).to(self.heads.weight.device)
        with torch.no_grad():
            head.weight.copy_(self.heads.weight[0])
            head.bias.copy_(self.heads.bias[0])
        data = TensorDataset(torch.cat(feats).to(head.weight.dtype), torch.cat(labels).to(head.weight.device))
        la = KronLaplace(nn.Sequential(head), "classification", prior_precision=self.init_prior_precision)
        la.fit(DataLoader(data, batch_size=loader.batch_size or 32))
        la.optimize_prior_precision(method="marglik", n_steps=self.marglik_steps)
        return la

    @contextmanager
    def posterior_samples(self, S: int) -> Iterator[None]:
        C = self.num_classes
        theta = self.laplace.sample(S)  # (S, C*D + C): weight, then bias
        self._head_samples = theta[:, :-C].reshape(S, C, -1), theta[:, -C:]
        try:
            yield
        finally:
            self._head_samples = None

    def member_logits(self, batch: dict, members: list[int]) -> Tensor:
        if getattr(self, "_head_samples", None) is None:
            return super().member_logits(batch, members)
        W, b = (t[members] for t in self._head_samples)  # (K, C, D), (K, C)
        features = self.features(batch)  # (B, D): one backbone pass for all samples
        return torch.einsum("bd,kcd->kbc", features.to(W.dtype), W) + b[:, None]


class BayesLoRALA(BayesLoRA):
    """Laplace over all LoRA factors (KFAC), the head at its MAP value. Linear layers only: the KFAC backend
    has no convolution factors, so a backbone whose targets are convolutions is refused at start."""

    layer_types = LINEAR_TYPES

    def fit_laplace(self, loader: DataLoader):
        trainable = [p for p in self.heads.parameters() if p.requires_grad]
        for p in trainable:  # the posterior covers the LoRA factors only
            p.requires_grad_(False)
        try:
            la = LoRAKronLaplace(_MAPLogits(self), "classification", backend=LoRAKFAC,
                                 prior_precision=self.init_prior_precision)
            la.fit(loader)
        finally:
            for p in trainable:
                p.requires_grad_(True)
        la.optimize_prior_precision(method="marglik", n_steps=self.marglik_steps)
        return la

    @contextmanager
    def posterior_samples(self, S: int) -> Iterator[None]:
        theta = self.laplace.sample(S)  # (S, P) in the order of laplace.params: A, B of every layer
        pieces = torch.split(theta, [p.numel() for p in self.laplace.params], dim=1)
        with ExitStack() as stack:
            for i, layer in enumerate(self.lora_layers()):  # lora_layers() and laplace.params share the order
                A = pieces[2 * i].reshape(S, *layer.lora_A.shape[1:])
                B = pieces[2 * i + 1].reshape(S, *layer.lora_B.shape[1:])
                stack.enter_context(layer.use_bank(lora_A=A, lora_B=B))
            yield
