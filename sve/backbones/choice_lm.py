"""A causal LM that answers multiple-choice questions with the logits of the option letters.

The LM's next-token logit of letter L at the answer position is ``lm_head.weight[id(L)] . h`` with ``h``
the last token's final hidden state (after the final norm). So a member head initialised with the
``lm_head`` rows of the answer letters (and zero bias), applied to the last-token features, reproduces
"softmax over the option-letter logits" exactly at initialisation; training then adapts it like any head.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from sve.backbones.hf import HFCausalLMBackbone


def letter_token_ids(tokenizer, letters: list[str], prefix: str = "Answer:") -> list[int]:
    """Token id of each letter as the LM would write it after ``prefix`` (e.g. " A" in BPE vocabularies)."""
    base = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    ids = []
    for letter in letters:
        full = tokenizer(f"{prefix} {letter}", add_special_tokens=False)["input_ids"]
        if full[: len(base)] != base or len(full) != len(base) + 1:
            full = tokenizer(letter, add_special_tokens=False)["input_ids"]  # the letter alone, as a fallback
            if len(full) != 1:
                raise ValueError(f"answer letter {letter!r} is not a single token for this tokenizer")
        ids.append(full[-1])
    if len(set(ids)) != len(ids):
        raise ValueError(f"answer letters {letters} map to repeated token ids {ids}")
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
        super().__init__(*args, name_or_path=name_or_path, **kwargs)
        self.answer_tokens = list(answer_tokens) if answer_tokens else None

    @torch.no_grad()
    def initial_head(self, task: str | None, num_classes: int) -> tuple[Tensor, Tensor] | None:
        """The lm_head rows of the answer letters that the data module declared (any letter-answer task)."""
        if not self.answer_tokens or len(self.answer_tokens) != num_classes:
            return None
        ids = letter_token_ids(self.tokenizer, self.answer_tokens)
        weight = self.model.get_output_embeddings().weight[ids].detach().float().clone()  # (C, D)
        bias = torch.zeros(num_classes)
        lm_bias = getattr(self.model.get_output_embeddings(), "bias", None)
        if lm_bias is not None:
            bias = lm_bias[ids].detach().float().clone()
        return weight, bias
