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

from contextlib import nullcontext
from pathlib import Path

import torch
from torch import Tensor

from sve.backbones.hf import HFCausalLMBackbone
from sve.members import expected_rows, member_rows


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
        C, (ids, mask) = self.num_options, (batch["input_ids"], batch["attention_mask"])
        option_mask = torch.zeros_like(mask, dtype=torch.bool)
        option_mask[:, -2:] = True  # the probe text's last two tokens stand for an option
        expand = lambda t: t.unsqueeze(1).expand(-1, C, -1).contiguous()  # noqa: E731
        return {"input_ids": expand(ids), "attention_mask": expand(mask), "option_mask": expand(option_mask)}

    def forward(self, batch: dict) -> Tensor:
        if "option_mask" not in batch:
            return super().forward(batch)
        return self.option_scores(batch)

    def option_scores(self, batch: dict) -> Tensor:
        """(N, C) mean log-probability of each option's tokens; 0 for a slot without option tokens."""
        ids, mask, option = batch["input_ids"], batch["attention_mask"], batch["option_mask"]
        N, C, T = ids.shape
        rows = expected_rows()  # the member-major batch grows by the C option sequences of each question
        with member_rows(rows * C) if rows is not None else nullcontext():
            hidden = self.model.base_model(input_ids=ids.reshape(N * C, T),
                                           attention_mask=mask.reshape(N * C, T)).last_hidden_state
        # Token t is predicted at position t - 1: only those positions go through lm_head (the vocabulary
        # is large; options are a few tokens).
        targets = option.reshape(N * C, T)[:, 1:]
        predicted = self.model.get_output_embeddings()(hidden[:, :-1][targets])  # (P, V)
        log_probs = predicted.float().log_softmax(-1).gather(-1, ids.reshape(N * C, T)[:, 1:][targets][:, None])
        seq = torch.arange(N * C, device=ids.device)[:, None].expand(-1, T - 1)[targets]  # owner of each token
        total = torch.zeros(N * C, device=ids.device).index_add_(0, seq, log_probs.squeeze(-1))
        count = targets.sum(1).clamp_min(1)
        return (total / count).reshape(N, C)

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
