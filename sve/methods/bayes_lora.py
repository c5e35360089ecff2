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
(S, B, C). For LLLA they are head weights on one backbone pass. For LA the samples become the LoRA layers'
member set (``MemberLayer.use_bank``) and run like any ensemble's members, with one of two predictives
(``predictive``):

- ``glm`` (default; the linearised predictive that Yang et al. report): member s has the logits of the model
  linearised at the MAP, f(theta*) + J (theta_s - theta*). J (theta_s - theta*) is a Jacobian-vector product,
  computed by forward-mode AD (``torch.func.jvp``) vmapped over the S offsets as tangents: the MAP pass runs
  once and no per-example Jacobian is ever formed, where S separate dual passes would each repeat the MAP
  pass. That pass runs under ``torch.func`` transforms, so a forward hook there sees functorch tensors
  and may not write through ``.data``; ``nn`` runs the samples as plain members.
- ``nn``: the network itself at theta_s. A Laplace posterior is fitted to the linearised model (its GGN
  curvature), so it is broad along directions that the data constrain only through the network's
  nonlinearity; sampling the network there can lose the MAP model entirely (Immer et al., 2021). On the
  miniature SST-2 (1,000 sentences, 331,776 LoRA parameters) it predicted at chance (47%) from a MAP model
  that scores 80%, while ``glm`` kept its MAP's accuracy (58.0% against 58.5%, for a MAP trained at 1e-4).

For LLLA the two coincide, since the logits are linear in the head's weights.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch
from laplace import KronLaplace
from torch import Tensor, nn
from torch.func import functional_call, jvp, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.data import DataLoader, TensorDataset

from sve.errors import InputError
from sve.layers.inject import LINEAR_TYPES
from sve.members import to_device
from sve.methods.base import mask_choices
from sve.methods.heads import apply_heads
from sve.methods.kfac import LoRAKFAC, LoRAKronLaplace
from sve.methods.kinds import FittedAfterTraining, SampledMethod
from sve.methods.lora import SingleLoRA

log = logging.getLogger(__name__)


class _MAPLogits(nn.Module):
    """The MAP model as laplace-torch wants it: batch dict -> (B, C) logits."""

    def __init__(self, method: BayesLoRA):
        super().__init__()
        self.method = method

    def forward(self, batch: dict) -> Tensor:
        return self.method.map_logits(to_device(batch, self.method.heads.weight.device))[0]  # (B, C)


class BayesLoRA(FittedAfterTraining, SampledMethod, SingleLoRA):
    """Args:
    num_samples: posterior samples at evaluation.
    prior_precision: initial prior precision before the marginal-likelihood optimisation.
    marglik_steps: Adam steps of that optimisation (laplace-torch default 100).
    """

    trains = "one LoRA adapter and the head (MAP); the posterior is fitted after training"

    def __init__(
        self,
        backbone,
        ensemble_size: int,
        num_classes: int,
        num_samples: int = 10,
        prior_precision: float = 1.0,
        marglik_steps: int = 100,
        **kwargs,
    ):
        super().__init__(backbone, ensemble_size, num_classes, **kwargs)
        self.num_samples = num_samples
        self.init_prior_precision = prior_precision
        self.marglik_steps = marglik_steps
        self.laplace = None  # set by after_fit

    def num_members(self) -> int:
        return 1 if self.laplace is None else super().num_members()  # the MAP model until the posterior is fitted

    def map_logits(self, batch: dict) -> Tensor:
        """(1, B, C) logits of the MAP model, whether or not a posterior has been fitted."""
        return mask_choices(self.member_logits(batch, [0]), batch)

    def forward(self, batch: dict) -> Tensor:
        if self.num_members() == 1:
            return super().forward(batch)
        with self.posterior_samples(self.num_samples):
            return super().forward(batch)

    def after_fit(self, datamodule) -> None:
        if self.laplace is not None:  # restored with the checkpoint of a run that had fitted it
            log.info("%s: posterior restored from the checkpoint, not refitted", type(self).__name__)
            return
        self.eval()  # on the device the module trains on (the heads' device)
        self.laplace = self.fit_laplace(datamodule.train_dataloader(), datamodule.batch_size)
        log.info(
            "%s: prior precision %.4g (marginal likelihood)", type(self).__name__, float(self.laplace.prior_precision)
        )

    # The posterior is part of the method's state, so a checkpoint written after the fit carries it: a resumed
    # or re-evaluated run samples from the same posterior instead of fitting a new one.
    def get_extra_state(self) -> dict:
        if self.laplace is None:
            return {}
        state = dict(self.laplace.state_dict())
        state["likelihood"] = str(state["likelihood"])  # plain types only: checkpoints load with weights_only
        return {"laplace": state}

    def set_extra_state(self, state: dict) -> None:
        if not state.get("laplace"):
            self.laplace = None
            return
        laplace = self.empty_laplace()
        laplace.load_state_dict(state["laplace"])
        self.laplace = laplace

    def report(self) -> dict:
        facts = {**super().report(), "num_samples": self.num_samples}
        if self.laplace is not None:
            facts.update(
                prior_precision=float(self.laplace.prior_precision), laplace_parameters=int(self.laplace.n_params)
            )
        return facts

    def fit_laplace(self, loader: DataLoader, batch_size: int):  # pragma: no cover - abstract
        raise NotImplementedError

    def empty_laplace(self):  # pragma: no cover - abstract
        """An unfitted posterior object of the right kind and size, to load a saved state into."""
        raise NotImplementedError

    def posterior_samples(self, S: int):  # pragma: no cover - abstract
        """Context in which the S members are S posterior samples."""
        raise NotImplementedError


class BayesLoRALLLA(BayesLoRA):
    """Last-layer Laplace: Kronecker-factored posterior over the head."""

    display_name = "Bayes-LoRA (LLLA)"

    @torch.no_grad()
    def features(self, batch: dict) -> Tensor:
        return self.backbone(to_device(batch, self.heads.weight.device))  # (B, D)

    def empty_laplace(self) -> KronLaplace:
        head = nn.Linear(self.heads.weight.shape[2], self.num_classes).to(self.heads.weight.device)
        with torch.no_grad():  # the MAP head: the posterior's mean
            head.weight.copy_(self.heads.weight[0])
            head.bias.copy_(self.heads.bias[0])
        return KronLaplace(nn.Sequential(head), "classification", prior_precision=self.init_prior_precision)

    def fit_laplace(self, loader: DataLoader, batch_size: int):
        feats, labels = zip(*[(self.features(b), b["labels"]) for b in loader])
        la = self.empty_laplace()
        device = self.heads.weight.device
        data = TensorDataset(torch.cat(feats).to(self.heads.weight.dtype), torch.cat(labels).to(device))
        la.fit(DataLoader(data, batch_size=batch_size))  # the recipe's batch (a loader's may be a sampler's)
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
        return apply_heads(features, W, b)


PREDICTIVES = ("glm", "nn")


class BayesLoRALA(BayesLoRA):
    """Laplace over all LoRA factors (KFAC), the head at its MAP value. Linear layers only: the KFAC backend
    has no convolution factors, so a backbone whose targets are convolutions is refused at start.

    Args:
        predictive: ``glm`` (linearised at the MAP) or ``nn`` (the sampled network); module docstring.
    """

    display_name = "Bayes-LoRA (LA)"

    layer_types = LINEAR_TYPES

    def __init__(self, *args, predictive: str = "glm", **kwargs):
        if predictive not in PREDICTIVES:
            raise InputError(f"method.predictive={predictive!r} is not valid; choose one of {list(PREDICTIVES)}")
        super().__init__(*args, **kwargs)
        self.predictive = predictive

    def report(self) -> dict:
        return {**super().report(), "predictive": self.predictive}

    def forward(self, batch: dict) -> Tensor:
        if self.num_members() == 1 or self.predictive == "nn":
            return super().forward(batch)
        return self.glm_logits(batch)

    def glm_logits(self, batch: dict) -> Tensor:
        """(S, B, C): member s is f(theta*) + J (theta_s - theta*). One forward-mode pass through the MAP model
        (``torch.func.jvp``) vmapped over the S offsets as tangents only: the MAP part is computed once, the
        tangent part for all samples in batched operators (an earlier version repeated the batch S times with
        dual tensors, computing the MAP part S times: about twice the work)."""
        theta = self.laplace.sample(self.num_samples) - self.laplace.mean  # (S, P), laplace.params' order
        pieces = torch.split(theta, [p.numel() for p in self.laplace.params], dim=1)
        wrapper = _MAPLogits(self)
        names_of = {id(p): name for name, p in wrapper.named_parameters()}
        names, primals, tangents = [], [], []
        for i, layer in enumerate(self.lora_layers()):  # lora_layers() and laplace.params share the order
            for j, attr in enumerate(("lora_A", "lora_B")):
                own = getattr(layer, attr)
                names.append(names_of[id(own)])
                primals.append(own.detach())
                tangents.append(pieces[2 * i + j].reshape(-1, *own.shape).to(own.dtype))
        # functorch refuses inference mode (Lightning evaluates in it) and inference tensors (the batch, the
        # samples drawn in it: cloned outside it; the primals are parameters); the fused attention kernels have
        # no forward-mode formula, so the plain (math) attention runs.
        with torch.inference_mode(False), torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
            batch = {k: v.clone() if isinstance(v, Tensor) else v for k, v in batch.items()}
            tangents = [t.clone() for t in tangents]

            def logits(*params):
                return functional_call(wrapper, dict(zip(names, params)), (batch,))  # (B, C)

            # randomness="same": a random operator in the forward (none in evaluation; a hook building a layer)
            # draws once for all samples instead of failing.
            at_map, offsets = vmap(lambda *t: jvp(logits, tuple(primals), t), out_dims=(None, 0), randomness="same")(
                *tangents
            )
        return at_map + offsets  # (S, B, C)

    @contextmanager
    def lora_only(self) -> Iterator[None]:
        """The posterior covers the LoRA factors only: the head is frozen while laplace-torch looks."""
        trainable = [p for p in self.heads.parameters() if p.requires_grad]
        for p in trainable:
            p.requires_grad_(False)
        try:
            yield
        finally:
            for p in trainable:
                p.requires_grad_(True)

    def empty_laplace(self) -> LoRAKronLaplace:
        with self.lora_only():
            return LoRAKronLaplace(
                _MAPLogits(self), "classification", backend=LoRAKFAC, prior_precision=self.init_prior_precision
            )

    def fit_laplace(self, loader: DataLoader, batch_size: int):
        la = self.empty_laplace()
        with self.lora_only():
            la.fit(loader)
        la.optimize_prior_precision(method="marglik", n_steps=self.marglik_steps)
        return la

    @contextmanager
    def posterior_samples(self, S: int) -> Iterator[None]:
        """The S members are S posterior samples of the LoRA factors (the ``nn`` predictive)."""
        theta = self.laplace.sample(S)  # (S, P) in the order of laplace.params: A, B of every layer
        pieces = torch.split(theta, [p.numel() for p in self.laplace.params], dim=1)
        with ExitStack() as stack:
            for i, layer in enumerate(self.lora_layers()):  # lora_layers() and laplace.params share the order
                bank = {}
                for j, name in enumerate(("lora_A", "lora_B")):
                    own = getattr(layer, name)
                    bank[name] = pieces[2 * i + j].reshape(S, *own.shape[1:]).to(own.dtype)
                stack.enter_context(layer.use_bank(**bank))
            yield
