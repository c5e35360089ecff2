"""Hugging Face backbones: any encoder (BERT, RoBERTa, MiniLM, ...), decoder (LLaMA, GPT-2, OPT, ...),
encoder-decoder (T5, BART, ...) or vision transformer (ViT, DeiT, DINOv2, ...), by hub id or local directory.

``name_or_path`` is a hub id or a local ``save_pretrained`` directory (``~`` is expanded); with
``pretrained: false`` the architecture is built from ``config`` (or the directory's config.json) with random
weights, which is how the tiny test backbones work offline. The feature width is read from the model's
actual output on a probe input, not from ``hidden_size`` (OPT with a projection, for one, differs).

Features: text models pool the last hidden state (``cls``, ``mean`` or ``last`` token); an encoder-decoder
feeds the input to both halves and pools the decoder (``last``, as BART's classification head does); a vision
transformer uses its CLS token (``cls``) or the mean of its patch tokens (``mean``).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import torch
import transformers
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

from sve.backbones.base import Backbone
from sve.backbones.tokenizers import char_tokenizer
from sve.errors import InputError, OfflineError
from sve.offline import OFFLINE_HINT, hub_offline, hub_reachable

log = logging.getLogger(__name__)

POOLINGS = ("cls", "mean", "last")
PROBE_TEXT = "a short probe sentence"


def _dtype(name: str | None) -> torch.dtype | None:
    return None if name in (None, "auto") else getattr(torch, name)


def local_or_hub(name_or_path: str | None, key: str = "backbone.name_or_path", model: bool = True) -> str | None:
    """Expands ``~``; a path that looks local (``/``, ``.``, ``~``) must exist, and a model's hold config.json
    (a tokenizer's directory need not: ``key`` names the setting in the error)."""
    if not name_or_path:
        return name_or_path
    if name_or_path.startswith(("~", "/", ".")):
        path = Path(name_or_path).expanduser()
        if model and not (path / "config.json").exists():
            raise FileNotFoundError(
                f"{key}={name_or_path}: no config.json in {path}; expected a save_pretrained "
                "directory (config.json, weights, tokenizer files)"
            )
        if not path.exists():
            raise FileNotFoundError(
                f"{key}={name_or_path}: {path} does not exist; expected a directory with "
                "tokenizer files (tokenizer.json, or a vocabulary)"
            )
        return str(path)
    return name_or_path


def pool(hidden: Tensor, attention_mask: Tensor | None, pooling: str) -> Tensor:
    """(N, T, D) hidden states -> (N, D) features: the first real token (``cls``), the mean over real tokens or
    the last real token. Padding may be on either side: the framework's tokenizers pad on the right, but a
    LLaMA tokenizer a user brings to ``sve.wrap`` pads on the left, and "the last position" would be padding."""
    if attention_mask is None:
        attention_mask = torch.ones(hidden.shape[:2], device=hidden.device, dtype=torch.long)
    # With a key/value cache (generation) the mask covers the cached positions too, the hidden states only the
    # new ones: those are the mask's last columns.
    attention_mask = attention_mask[:, attention_mask.shape[1] - hidden.shape[1] :]
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    if pooling == "cls":
        return hidden[rows, attention_mask.long().argmax(1)]  # argmax: the first position of a real token
    if pooling == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1)
    if pooling == "last":
        positions = torch.arange(hidden.shape[1], device=hidden.device)
        return hidden[rows, (attention_mask.long() * positions).argmax(1)]  # the last position of a real token
    raise InputError(f"pooling={pooling!r} is not valid; choose one of {list(POOLINGS)}")


class HFBackbone(Backbone):
    """Any Hugging Face model loaded with ``auto_class``; the modality follows the config.

    Args:
        target_modules: name patterns of the layers to adapt (e.g. ``['query', 'value']``, ``['c_attn']``).
        name_or_path: hub id or local directory.
        pretrained: load the weights (else random init from ``config`` or the directory's config.json).
        config: keyword arguments of ``AutoConfig.for_model`` (``model_type`` plus sizes) for random models.
        tokenizer: ``char`` (offline test tokenizer), a hub id or directory, or None to use ``name_or_path``.
        pooling: ``cls``, ``mean`` or ``last``.
        max_length: token limit used by the data modules.
        torch_dtype: ``float32``, ``bfloat16``, ... or None for the checkpoint's.
        gradient_checkpointing: trade compute for activation memory (large models).
        image_size: input resolution of a vision model (default: the config's).
    """

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
        image_size: int | None = None,
    ):
        if pooling not in POOLINGS:
            raise InputError(f"backbone.pooling={pooling!r} is not valid; choose one of {list(POOLINGS)}")
        name_or_path = local_or_hub(name_or_path)
        if pretrained:
            if not name_or_path:
                raise InputError("backbone.name_or_path is required when backbone.pretrained=true")
            online = Path(name_or_path).exists() or hub_reachable()
            try:
                with hub_offline(not online):  # no network: the cache only, no half a minute of retries
                    model_class = self.checkpoint_class(AutoConfig.from_pretrained(name_or_path))
                    model = model_class.from_pretrained(name_or_path, dtype=_dtype(torch_dtype))
            except OSError as err:
                reason = str(err) if online else OFFLINE_HINT
                raise (OfflineError if not online else OSError)(
                    f"could not load '{name_or_path}' ({reason}). Without network access, set "
                    "backbone.name_or_path to a local directory holding config.json and the weights, or use "
                    "backbone.pretrained=false."
                ) from None if not online else err
        else:
            if not config and not name_or_path:
                raise InputError(
                    "backbone.pretrained=false needs backbone.config (model_type and sizes) or a "
                    "backbone.name_or_path whose config.json to use"
                )
            hf_config = AutoConfig.for_model(**config) if config else AutoConfig.from_pretrained(name_or_path)
            model = self.checkpoint_class(hf_config).from_config(hf_config, dtype=_dtype(torch_dtype))
        model.train()  # from_pretrained returns eval mode; fine-tuning uses the model's dropout as trained
        if gradient_checkpointing:  # each block recomputed as it ran: a member chunk's selection, exact draws
            from sve.layers.recompute import enable_checkpointing

            enable_checkpointing(model)
        super().__init__(model, target_modules)
        cfg = model.config
        self.is_encoder_decoder = bool(getattr(cfg, "is_encoder_decoder", False))
        is_image = getattr(cfg, "num_channels", None) and not getattr(cfg, "vocab_size", None)
        self.modality = "image" if is_image else "text"
        self.pooling = pooling
        self.max_length = max_length
        self.max_positions = position_limit(model)  # the longest text the model can read (None: no table)
        if self.modality == "image":
            self._init_image(cfg, image_size, tokenizer or name_or_path)
        else:
            self._init_text(tokenizer, name_or_path)
        with torch.no_grad():  # the width the model really outputs (OPT's project_out, ...), on a probe input
            was = model.training
            self.eval()
            self.feature_dim = int(self(self.probe_batch()).shape[-1])
            model.train(was)

    def checkpoint_class(self, config):
        """``auto_class``, unless the checkpoint is the encoder alone of an encoder-decoder family (its config
        names ``T5EncoderModel``, say): ``AutoModel`` would build the whole encoder-decoder around it, with a
        decoder of random weights and no decoder inputs to give it."""
        if self.auto_class is AutoModel:
            for name in getattr(config, "architectures", None) or []:
                if name.endswith("EncoderModel") and hasattr(transformers, name):
                    return getattr(transformers, name)
        return self.auto_class

    def _init_text(self, tokenizer: str | None, name_or_path: str | None) -> None:
        if tokenizer == "char":
            self.tokenizer = char_tokenizer()
        else:
            source = local_or_hub(tokenizer, "backbone.tokenizer", model=False) or name_or_path
            try:
                with hub_offline(not (Path(source).exists() or hub_reachable())):
                    self.tokenizer = AutoTokenizer.from_pretrained(source)
            except (OSError, ValueError, TypeError) as err:
                raise OSError(
                    f"could not load a tokenizer from '{source}' ({type(err).__name__}: {err}); the model directory "
                    "needs its tokenizer files (tokenizer.json or vocab files), or set backbone.tokenizer to a "
                    "directory or hub id that has them"
                ) from err
        if self.tokenizer.pad_token is None:  # LLaMA/GPT-2 tokenizers ship without one
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.unk_token
        self.tokenizer.padding_side = "right"
        probe = self.tokenizer(PROBE_TEXT)["input_ids"]
        if len(probe) == 0 or all(t == self.tokenizer.unk_token_id for t in probe):
            raise InputError(
                f"the tokenizer of backbone '{name_or_path}' turns text into no usable tokens ({probe}); check its "
                "tokenizer files or set backbone.tokenizer"
            )
        starts = getattr(self.tokenizer, "cls_token_id", None) or getattr(self.tokenizer, "bos_token_id", None)
        if self.pooling == "cls" and (starts is None or probe[0] != starts):
            # T5's and sentence encoders' tokenizers put no summary token first: "cls" reads the first word.
            log.warning(
                "backbone.pooling=cls reads the first token, but the tokenizer of '%s' starts a text with "
                "no [CLS]-like token (it starts with %r); backbone.pooling=mean is the usual choice for "
                "such models",
                tokenizer if tokenizer and tokenizer != "char" else name_or_path,
                self.tokenizer.convert_ids_to_tokens(probe[:1])[0],
            )

    def _init_image(self, cfg, image_size: int | None, source: str | None) -> None:
        size = image_size or getattr(cfg, "image_size", 224)
        self.image_size = size[0] if isinstance(size, (list, tuple)) else int(size)
        self.mean, self.std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet, unless the processor says
        processor = preprocessor_config(source)
        if processor is None:
            log.info(
                "%s has no preprocessor_config.json here: images are normalised with ImageNet's mean and std", source
            )
            return
        self.mean = tuple(processor.get("image_mean", self.mean))
        self.std = tuple(processor.get("image_std", self.std))

    def probe_batch(self) -> dict:
        if self.modality == "image":
            return {"pixel_values": torch.zeros(1, 3, self.image_size, self.image_size)}
        enc = self.tokenizer([PROBE_TEXT], return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    def hidden_states(self, batch: dict) -> Tensor:
        """(N, T, D) last hidden states of a text model (the decoder's for an encoder-decoder)."""
        base = self.model.base_model
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        # No key-value cache: features need one pass, and a decoder's cache would hold every layer's keys and
        # values for the whole batch (4 GiB for LLaMA-2-7B's evaluation at M = 16, length 512; sve-train plan=true).
        cache = {"use_cache": False} if getattr(self.model.config, "use_cache", None) is not None else {}
        if self.is_encoder_decoder:
            out = base(input_ids=ids, attention_mask=mask, decoder_input_ids=ids, decoder_attention_mask=mask, **cache)
        else:
            out = base(input_ids=ids, attention_mask=mask, **cache)
        return out.last_hidden_state

    def forward(self, batch: dict) -> Tensor:
        if self.modality == "image":
            out = self.model.base_model(pixel_values=batch["pixel_values"].to(self.model.dtype))
            hidden = out.last_hidden_state
            if hidden.dim() == 4:  # a CNN (ConvNeXt, ResNet, RegNet, ...): (N, C, H, W), no tokens to pool
                pooled = getattr(out, "pooler_output", None)  # what the model's own classifier reads
                return pooled.flatten(1) if pooled is not None else hidden.mean((2, 3))
            if self.pooling == "mean":
                return hidden[:, 1:].mean(1)  # patch tokens, CLS left out
            return pool(hidden, None, self.pooling)
        return pool(self.hidden_states(batch), batch.get("attention_mask"), self.pooling)


def position_limit(model: nn.Module) -> int | None:
    """Tokens a text model can read: the rows of its learned position table (``position_embeddings``, GPT-2's
    ``wpe``, OPT's and BART's ``embed_positions``), less the rows its positions skip (RoBERTa counts from its
    padding index + 1, OPT and BART from ``offset``); None for models without one (rotary, relative)."""
    limits = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) and re.search(r"(^|\.)(position_embeddings|wpe|embed_positions)$", name):
            skipped = getattr(module, "offset", 0) or (module.padding_idx + 1 if module.padding_idx is not None else 0)
            limits.append(module.num_embeddings - skipped)
    return min(limits) if limits else None


def preprocessor_config(source: str | None) -> dict | None:
    """The image processor's settings (``preprocessor_config.json``) of a local model directory or a Hub model
    (downloaded, or from the cache without network); None where there is none. A Hub model's own mean and std
    matter: many are not ImageNet's (Google's ViTs use 0.5)."""
    if not source:
        return None
    local = Path(source).expanduser() / "preprocessor_config.json"
    if local.is_file():
        return json.loads(local.read_text())
    if Path(source).expanduser().exists():
        return None
    try:
        from transformers.utils import cached_file

        with hub_offline(not hub_reachable()):
            path = cached_file(source, "preprocessor_config.json", _raise_exceptions_for_missing_entries=False)
    except (OSError, ValueError):  # not on the Hub (or no valid repo id), or not cached without network
        return None
    return json.loads(Path(path).read_text()) if path else None


class HFEncoderBackbone(HFBackbone):
    """BERT-style encoder or any ``AutoModel`` (vision transformers included); CLS or mean features."""


class HFCausalLMBackbone(HFBackbone):
    """Decoder-only LM (``AutoModelForCausalLM``, keeps ``lm_head``); features are the last token's state."""

    auto_class = AutoModelForCausalLM

    def __init__(self, *args, pooling: str = "last", **kwargs):
        super().__init__(*args, pooling=pooling, **kwargs)
