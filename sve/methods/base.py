"""The method interface: wrap a backbone, return member logits in the (M, B, C) layout of ``sve.members``."""

from __future__ import annotations

import logging
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sve.backbones.base import Backbone
from sve.members import check_member_logits, repeat_batch, split_members

log = logging.getLogger(__name__)


class MemberHeads(nn.Module):
    """M independent linear classification heads evaluated in one einsum.

    Each member's head is initialised like an ``nn.Linear`` with its own random draw, which is itself a
    source of member diversity.
    """

    def __init__(self, ensemble_size: int, in_features: int, num_classes: int):
        super().__init__()
        heads = [nn.Linear(in_features, num_classes) for _ in range(ensemble_size)]
        self.weight = nn.Parameter(torch.stack([h.weight.detach() for h in heads]))  # (M, C, D)
        self.bias = nn.Parameter(torch.stack([h.bias.detach() for h in heads]))  # (M, C)

    def forward(self, features: Tensor) -> Tensor:
        """(M, B, D) -> (M, B, C)."""
        return torch.einsum("mbd,mcd->mbc", features.to(self.weight.dtype), self.weight) + self.bias[:, None]


class EnsembleMethod(nn.Module):
    """Base class. Subclasses prepare the backbone in ``__init__`` and may override ``forward``.

    The default ``forward`` stacks the batch M times member-major, runs the shared backbone once, and applies
    one head per member: the pattern of every implicit ensemble whose layers split the batch by member.

    Class attributes:
        fixed_ensemble_size: set for methods with a fixed member count (``single``, ``svf``); a different
            requested ``ensemble_size`` is ignored with a warning and the fixed count is recorded.
    """

    fixed_ensemble_size: int | None = None

    def __init__(self, backbone: Backbone, ensemble_size: int, num_classes: int, lr: float | None = None):
        super().__init__()
        if not isinstance(ensemble_size, int) or ensemble_size < 1:
            raise ValueError(f"ensemble_size must be a positive integer, got {ensemble_size!r}")
        if self.fixed_ensemble_size is not None and ensemble_size != self.fixed_ensemble_size:
            warnings.warn(
                f"{type(self).__name__} has {self.fixed_ensemble_size} member(s); ignoring "
                f"ensemble_size={ensemble_size} (results record ensemble_size={self.fixed_ensemble_size})",
                stacklevel=2,
            )
            ensemble_size = self.fixed_ensemble_size
        self.backbone = backbone
        self.ensemble_size = ensemble_size
        self.num_classes = num_classes
        self.lr = lr  # method-specific learning rate (Appendix C.3); None uses the recipe's optimizer.lr
        self.heads = MemberHeads(ensemble_size, backbone.feature_dim, num_classes)
        # A backbone may supply the initial head (e.g. a causal LM's lm_head rows of the answer letters).
        initial = getattr(backbone, "initial_head", None)
        if initial is not None and (init := initial(num_classes)) is not None:
            with torch.no_grad():
                self.heads.weight.copy_(init[0].expand_as(self.heads.weight))
                self.heads.bias.copy_(init[1].expand_as(self.heads.bias))

    def forward(self, batch: dict) -> Tensor:
        M = self.ensemble_size
        features = self.backbone(repeat_batch(batch, M))  # (M*B, D)
        logits = self.heads(split_members(features, M))  # (M, B, C)
        return check_member_logits(mask_choices(logits, batch), M)

    # Hooks for methods that do more than train jointly (all optional).
    def on_train_epoch_end(self, module) -> None:
        """Called by the LightningModule after every training epoch (e.g. to snapshot a checkpoint)."""

    def after_fit(self, datamodule) -> None:
        """Called by ``run`` after training, before testing (e.g. to fit a Laplace approximation)."""

    def next_round(self) -> bool:
        """Called by ``run`` after each fit; True asks for one more fit with a fresh trainer (a sequential
        deep ensemble trains its members round by round)."""
        return False

    def report(self) -> dict:
        """Method-specific facts for results.json (e.g. the deep-ensemble mode that ran, sample counts)."""
        return {}

    def loss(self, member_logits: Tensor, labels: Tensor) -> Tensor:
        """Eq. 6: the mean over members of each member's cross-entropy."""
        M, B, C = member_logits.shape
        return F.cross_entropy(member_logits.reshape(M * B, C).float(), labels.repeat(M))

    def constrain_(self) -> None:
        """Called after every optimiser step (e.g. to keep singular values non-negative)."""

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def parameter_counts(self) -> dict[str, int]:
        """Trainable, total, and backbone parameter counts (shared tensors counted once)."""
        seen: set[int] = set()
        total = trainable = 0
        for p in self.parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            total += p.numel()
            trainable += p.numel() if p.requires_grad else 0
        return {"trainable": trainable, "total": total}

    def log_summary(self, wrapped: list[str] | None = None) -> None:
        counts = self.parameter_counts()
        base = getattr(self, "base_parameter_count", None)
        share = f" ({100 * counts['trainable'] / base:.2f}% of the backbone's {base:,})" if base else ""
        if wrapped is not None:
            log.info("%s wrapped %d modules: %s", type(self).__name__, len(wrapped), ", ".join(wrapped))
        log.info("%s: %s trainable parameters%s", type(self).__name__, f"{counts['trainable']:,}", share)


def mask_choices(logits: Tensor, batch: dict) -> Tensor:
    """Sets the logits of absent answer options to -inf when a batch has ``choice_mask`` (B, C) (multiple
    choice with a varying number of options, e.g. ARC's 3 to 5)."""
    mask = batch.get("choice_mask")
    if mask is None:
        return logits
    return logits.masked_fill(~mask.bool().unsqueeze(0), float("-inf"))


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
