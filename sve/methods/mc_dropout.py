"""MC dropout (Gal and Ghahramani, 2016): one fully fine-tuned model whose dropout stays on at test time;
the members are ``num_samples`` stochastic passes (C.3: dropout 0.05, 10 passes, lr 1e-4).

Dropout sites are the backbone's own: every ``nn.Dropout`` (timm, BERT) and every rate a functional dropout
call reads (``RATE_ATTRIBUTES``: LLaMA's ``attention_dropout``, BART's and Whisper's ``dropout``). All get rate
``dropout``. At evaluation the
backbone is kept in training mode except for layers with running statistics (BatchNorm) and stochastic depth
(``is_drop_path``), because HF and timm attention read the *attention module's* ``training`` flag to decide
whether to drop attention probabilities; switching on only the ``nn.Dropout`` modules would leave that site
off.

The passes are the members: the batch is stacked ``num_samples`` times member-major (or in chunks, with
``members_at_once``), so each row gets its own dropout masks, and the one head reads every pass; the output
is (num_samples, B, C) in the usual layout.

``MCDropoutLoRA`` (``method=mc_dropout_lora``) is MC dropout as Yang et al. (2024) ran it on LLaMA-2-7B (the
MC Dropout row of Table 3): one LoRA adapter (rank 8, alpha 16, LoRA dropout 0.1) on a frozen backbone, whose
LoRA dropout (``sve.layers.lora``) stays on at evaluation. The backbone's own dropout sites are left as the
backbone has them, and off at evaluation. The passes run as above: the one adapter serves every row of the
member-major batch, and each row draws its own LoRA-dropout mask. In training it is the single LoRA with that
dropout (``method=single_lora method.dropout=0.1``), step for step.
"""

from __future__ import annotations

import logging

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from sve.errors import InputError
from sve.methods.kinds import SampledMethod
from sve.methods.lora import SingleLoRA

log = logging.getLogger(__name__)


# Float attributes that hold the rate of a functional dropout call (``F.dropout(x, p=self.dropout, ...)``): the
# module has no nn.Dropout for the site, so only its rate names it.
RATE_ATTRIBUTES = ("attention_dropout", "dropout", "activation_dropout")


def set_dropout(model: nn.Module, rate: float) -> int:
    """Sets every dropout site of ``model`` to ``rate``; returns the number of sites. The rates the model had
    are logged where they differ: a model built with dropout 0.5 samples at ``method.dropout`` from here on."""
    sites, before = 0, set()
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            before.add(module.p)
            module.p = rate
            sites += 1
            continue
        for key in RATE_ATTRIBUTES:  # a rate a functional dropout call reads (LLaMA's attention, BART, Whisper)
            if isinstance(getattr(module, key, None), float):
                before.add(getattr(module, key))
                setattr(module, key, rate)
                sites += 1
    if before - {rate}:
        log.info(
            "MC dropout: %d dropout site(s) set to method.dropout=%s (the model had %s)",
            sites,
            rate,
            ", ".join(str(r) for r in sorted(before)),
        )
    return sites


def is_drop_path(module: nn.Module) -> bool:
    """Stochastic depth (timm's ``DropPath``, Hugging Face's ``*DropPath`` copies, torchvision's
    ``StochasticDepth``): not a dropout site (its rate is not ``method.dropout``), so evaluation passes must not
    draw it, or they differ even at ``method.dropout=0``."""
    return type(module).__name__.endswith("DropPath") or type(module).__name__ == "StochasticDepth"


# Hugging Face switches, read at call time, for regularisers that act only in training mode and are not
# dropout sites: LayerDrop skips whole layers (a module's ``layerdrop`` or its config's, BART, Wav2Vec2), and
# SpecAugment masks spans of the input features (``apply_spec_augment``, Wav2Vec2, HuBERT; drawn from numpy's
# generator, so not even a torch seed repeats it). Their off values, while MC dropout's passes run.
LAYERDROP_KEYS = ("layerdrop", "encoder_layerdrop", "decoder_layerdrop")


def training_only_regularisers(model: nn.Module) -> list[tuple[object, str, object]]:
    """(owner, attribute, value that switches it off) for each LayerDrop rate above 0 and SpecAugment switch
    that is on, on the modules of ``model`` and their (shared) configs."""
    found, seen = [], set()
    for module in model.modules():
        for owner in (module, getattr(module, "config", None)):
            if owner is None or id(owner) in seen:
                continue
            seen.add(id(owner))
            found += [
                (owner, key, 0.0)
                for key in LAYERDROP_KEYS
                if isinstance(getattr(owner, key, None), float) and getattr(owner, key) > 0
            ]
            if owner is not module and getattr(owner, "apply_spec_augment", False) is True:
                found.append((owner, "apply_spec_augment", False))
    return found


class MCDropout(SampledMethod):
    """Args:
    dropout: rate at every dropout site (C.3: 0.05).
    num_samples: stochastic passes at evaluation (C.3: 10).
    """

    display_name = "MC Dropout"
    trains = "the whole backbone and the head"

    train_backbone = True
    stochastic = True  # each pass draws its own dropout masks

    def __init__(
        self, backbone, ensemble_size: int, num_classes: int, dropout: float = 0.05, num_samples: int = 10, **common
    ):
        super().__init__(backbone, ensemble_size, num_classes, **common)
        if not 0 <= dropout < 1 or num_samples < 1:
            raise InputError(f"need 0 <= dropout < 1 and num_samples >= 1, got {dropout} and {num_samples}")
        self.dropout = dropout
        self.num_samples = num_samples
        self.sites = set_dropout(backbone, dropout)
        if self.sites == 0:
            raise InputError(f"{type(backbone.model).__name__} has no dropout site (nn.Dropout or attention_dropout)")
        self.adapt()

    def train(self, mode: bool = True):
        super().train(mode)
        switched = self.__dict__.setdefault("_switched_off", [])  # (owner, attribute, value before)
        if not mode:  # keep dropout sampling at test time, but not batch statistics nor stochastic depth
            self.backbone.train()
            for module in self.backbone.modules():
                if isinstance(module, _BatchNorm) or is_drop_path(module):
                    module.eval()
            # Nor LayerDrop or SpecAugment, which the training flag turns on too: the passes draw dropout only.
            # Their settings come back for training, where they regularise as the model's config asks.
            if not switched:
                for owner, key, off in training_only_regularisers(self.backbone):
                    switched.append((owner, key, getattr(owner, key)))
                    setattr(owner, key, off)
        else:
            while switched:
                owner, key, value = switched.pop()
                setattr(owner, key, value)
        return self

    def report(self) -> dict:
        return {
            **super().report(),
            "num_samples": self.num_samples,
            "dropout": self.dropout,
            "dropout_sites": self.sites,
        }


class MCDropoutLoRA(SampledMethod, SingleLoRA):
    """Args:
    rank, alpha: the one LoRA adapter (Yang et al.: 8, 16).
    dropout: the LoRA dropout, in training and at evaluation (Yang et al.: 0.1).
    num_samples: stochastic passes at evaluation (Yang et al.: 10).
    """

    display_name = "MC Dropout (LoRA)"
    trains = "one LoRA adapter and the head"

    stochastic = True  # each pass draws its own LoRA-dropout masks

    def __init__(
        self,
        backbone,
        ensemble_size: int,
        num_classes: int,
        rank: int = 8,
        alpha: float = 16.0,
        dropout: float = 0.1,
        num_samples: int = 10,
        **common,
    ):
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise InputError(f"method.num_samples={num_samples!r} is not valid: passes are a positive integer")
        self.num_samples = num_samples
        super().__init__(backbone, ensemble_size, num_classes, rank=rank, alpha=alpha, dropout=dropout, **common)

    def train(self, mode: bool = True):
        super().train(mode)
        if not mode:  # the LoRA dropout keeps sampling at test time; the backbone stays in evaluation mode
            for layer in self.lora_layers():
                layer.train()
        return self

    def report(self) -> dict:
        return {**super().report(), "num_samples": self.num_samples, "dropout": self.dropout}
