"""A causal LM that answers multiple-choice questions with the logits of the option letters.

The LM's next-token logit of letter L at the answer position is ``lm_head.weight[id(L)] . h`` with ``h``
the last token's final hidden state (after the final norm). So a member head initialised with the
``lm_head`` rows of the answer letters (and zero bias), applied to the last-token features, reproduces
"softmax over the option-letter logits" exactly at initialisation; training then adapts it like any head.

Cloze scoring (``score_options``, set by ``dataset.scoring=cloze``): the batch holds one sequence per option
(stem, then the option's text; ``sve.data.arc``) and the features are the C option scores, the mean
log-probability of each option's tokens under the LM (length-normalised, so long options are not penalised
for their length). The initial head is then the identity with zero bias: at initialisation the member logits
*are* the cloze scores, and the member-specific part (SVE's singular values, LoRA factors, ...) acts inside
the LM. A member's scores come from its own forward pass through the LM, lm_head included.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path

import torch
from torch import Tensor

from sve.backbones.hf import HFCausalLMBackbone
from sve.errors import InputError
from sve.layers.member import rows_times
from sve.layers.recompute import is_checkpointing


def letter_token_ids(tokenizer, letters: list[str], prefix: str = "Answer:") -> list[int]:
    """Token id of each letter as the LM would write it after ``prefix`` (e.g. " A" in BPE vocabularies)."""
    base = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    ids = []
    for letter in letters:
        full = tokenizer(f"{prefix} {letter}", add_special_tokens=False)["input_ids"]
        if full[: len(base)] != base or len(full) != len(base) + 1:
            full = tokenizer(letter, add_special_tokens=False)["input_ids"]  # the letter alone, as a fallback
            if len(full) != 1:
                raise InputError(f"answer letter {letter!r} is not a single token for this tokenizer")
        ids.append(full[-1])
    if len(set(ids)) != len(ids):
        raise InputError(f"answer letters {letters} map to repeated token ids {ids}")
    return ids


class ChoiceCausalLMBackbone(HFCausalLMBackbone):
    """``HFCausalLMBackbone`` with ``initial_head``: the lm_head rows of ``answer_tokens``.

    ``answer_tokens`` is set by a multiple-choice data module in ``attach`` (``sve.data.arc``) or in the
    config; while it is None (or its length differs from the number of classes) the heads start random.
    """

    def __init__(self, *args, answer_tokens: list[str] | None = None, name_or_path: str | None = None, **kwargs):
        if name_or_path and name_or_path.startswith(("~", "/", ".")):  # a local directory, not a hub id
            path = Path(name_or_path).expanduser()
            if kwargs.get("pretrained", True) and not (path / "config.json").exists():
                raise FileNotFoundError(
                    f"backbone: no model at {path} (backbone.name_or_path); expected a save_pretrained directory "
                    "(config.json, *.safetensors, tokenizer files). For smollm2_135m create it once with "
                    "`python scripts/convert_smollm2.py`"
                )
            name_or_path = str(path)
        self.num_options: int | None = None  # set by score_options: cloze scoring of option texts
        super().__init__(*args, name_or_path=name_or_path, **kwargs)
        self.answer_tokens = list(answer_tokens) if answer_tokens else None

    def score_options(self, num_options: int) -> None:
        """Switches to cloze scoring: features are ``num_options`` option scores (module docstring)."""
        self.num_options = num_options
        self.feature_dim = num_options

    def probe_batch(self) -> dict:
        batch = super().probe_batch()
        if self.num_options is None:
            return batch
        ids = batch["input_ids"][:, -2:]  # the probe text's last two tokens stand for every option
        expand = lambda t: t.unsqueeze(1).expand(-1, self.num_options, -1).contiguous()  # noqa: E731
        return {**batch, "option_ids": expand(ids), "option_mask": expand(torch.ones_like(ids))}

    def forward(self, batch: dict) -> Tensor:
        if "option_ids" not in batch:
            return super().forward(batch)
        return self.option_scores(batch)

    def option_scores(self, batch: dict) -> Tensor:
        """(N, C) mean log-probability of each option's tokens after its stem; 0 for an empty slot.

        The stem runs once and its keys and values are shared by the C continuations (about 3x fewer tokens
        than C full sequences on ARC). Gradient checkpointing in training disables Hugging Face's cache, so
        there each option runs as one full sequence (stem, then option), which gives the same scores."""
        stem, stem_mask = batch["input_ids"], batch["attention_mask"]
        option, option_mask = batch["option_ids"], batch["option_mask"]
        (N, C, L), S = option.shape, stem.shape[1]
        option, option_mask = option.reshape(N * C, L), option_mask.reshape(N * C, L)
        continuations = rows_times(self.model, C)  # the member-major batch grows by the C continuations of each stem
        base = self.model.base_model
        stem_length = stem_mask.sum(1)  # the stems are right-padded
        repeat = lambda t: t.repeat_interleave(C, dim=0)  # noqa: E731 - stem n -> its C rows, member-major kept
        mask = torch.cat([repeat(stem_mask), option_mask], 1)  # the stem's padding is masked out
        if is_checkpointing(self.model) and self.training:
            with continuations:
                hidden = base(
                    input_ids=torch.cat([repeat(stem), option], 1),
                    attention_mask=mask,
                    position_ids=(mask.cumsum(1) - 1).clamp_min(0),
                ).last_hidden_state
            last_stem, continued = hidden[torch.arange(N * C), repeat(stem_length) - 1], hidden[:, S:]
        else:
            out = base(input_ids=stem, attention_mask=stem_mask, use_cache=True)
            name = cache_keyword(base)
            cache = getattr(out, name)
            cache.batch_repeat_interleave(C)
            positions = repeat(stem_length)[:, None] + torch.arange(L, device=stem.device)
            with continuations:
                continued = base(
                    input_ids=option, attention_mask=mask, position_ids=positions, **{name: cache}
                ).last_hidden_state
            last_stem = repeat(out.last_hidden_state[torch.arange(N), stem_length - 1])
        # Option token l is predicted at the position before it: the stem's last token for l = 0. Only those
        # positions go through lm_head (the vocabulary is large; options are a few tokens).
        predicting = torch.cat([last_stem[:, None], continued[:, :-1]], 1)[option_mask.bool()]  # (P, D)
        log_probs = self.model.get_output_embeddings()(predicting).float().log_softmax(-1)
        log_probs = log_probs.gather(-1, option[option_mask.bool()][:, None]).squeeze(-1)
        owner = torch.arange(N * C, device=stem.device)[:, None].expand(-1, L)[option_mask.bool()]
        total = torch.zeros(N * C, device=stem.device, dtype=log_probs.dtype).index_add_(0, owner, log_probs)
        return (total / option_mask.sum(1).clamp_min(1)).reshape(N, C)

    @torch.no_grad()
    def initial_head(self, task: str | None, num_classes: int) -> tuple[Tensor, Tensor] | None:
        """The lm_head rows of the answer letters that the data module declared (any letter-answer task);
        with cloze scoring the identity (logits = option scores)."""
        if self.num_options is not None:
            return (torch.eye(num_classes), torch.zeros(num_classes)) if self.num_options == num_classes else None
        if not self.answer_tokens or len(self.answer_tokens) != num_classes:
            return None
        ids = letter_token_ids(self.tokenizer, self.answer_tokens)
        weight = self.model.get_output_embeddings().weight[ids].detach().float().clone()  # (C, D)
        bias = torch.zeros(num_classes)
        lm_bias = getattr(self.model.get_output_embeddings(), "bias", None)
        if lm_bias is not None:
            bias = lm_bias[ids].detach().float().clone()
        return weight, bias


def cache_keyword(model) -> str:
    """The key/value cache's argument and output name: ``cache`` from transformers 5.25 (``past_key_values``
    warns there), ``past_key_values`` before. Cached per class: it is asked at every forward."""
    return _cache_keyword(type(model))


@functools.cache
def _cache_keyword(model_class: type) -> str:
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"
