"""``Ensemble.generate``: text from a wrapped causal LM, decoded from the members' predictive, with its scores.

The model is wrapped with its own ``lm_head`` as every member's head, read at the last token
(``sve.wrap(llama, method=..., pooling="last")``, no ``num_classes``), so a member's logits over the batch are
its next-token logits (M, B, V). Each decoding step runs every member on the tokens so far and picks the next
token from the predictive, the mean of the members' next-token distributions (greedy, or sampled with a
temperature and nucleus). Every member keeps its own key/value cache: the members run as a member-major
batch (row m*B + b: member m, prompt b) through the one model, with one cache per pass, whose rows are the
members' own; where the method runs its members one at a time (``members_at_once``, a layer that cannot take
the member layout, found before decoding starts, methods whose members are not one backbone's rows), each
member has a cache of its own.

Besides the answer, each member decodes its own greedy answer (the members' ``disagreement``), and
``num_samples`` answers are sampled from the predictive (``semantic_entropy``). The scores and their
definitions: ``sve.metrics.sequence``. Answers end at an end-of-sequence token, at a stop string (both kept
in the answer, as transformers' ``generate`` keeps them) or after ``max_new_tokens``.

Prompts are left-padded, as for transformers' ``generate``, so that every row's last position is a token of
its prompt and its position ids count its own tokens only.

A trained run's model decodes too (``sve-generate``, ``generate(method, ...)`` on the method of
``sve.runs.reevaluate.load_run``): its backbone is a Hugging Face causal LM (``HFCausalLMBackbone``, the ARC
runs' ``ChoiceCausalLMBackbone``), whose members' heads read the task's classes (the option letters, or the
option scores in cloze mode), not the vocabulary. There a member's next-token logits come from the LM's own
``lm_head`` on the last hidden state, computed under the member's adapted layers (its singular values, its LoRA
factors, its dropout masks): the members differ inside the LM, and the heads take no part in writing.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from sve.api.module_backbone import ModuleBackbone
from sve.backbones.choice_lm import cache_keyword
from sve.backbones.hf import HFCausalLMBackbone
from sve.errors import InputError
from sve.members import repeat_members, split_members
from sve.methods.base import EnsembleMethod
from sve.metrics import sequence


@dataclass
class Generation:
    """What ``Ensemble.generate`` returns, for B prompts, M members and K samples per prompt.

    Attributes:
        token_ids: (B, N) the answers' tokens, ``pad_token_id`` after each answer's end.
        lengths: (B,) each answer's length, its stop token included.
        texts: the decoded answers (with a tokenizer), else None.
        member_token_ids: (M, B, N') each member's own greedy answer, padded the same way.
        member_texts: [M][B] their decoded texts (with a tokenizer), else None.
        samples: [B][K] the answers sampled from the predictive (texts with a tokenizer, else token-id tuples).
        scores: each score (B,) of ``sve.metrics.sequence`` (``disagreement`` with more than one member,
            ``semantic_entropy`` with samples).
        token_scores: (B, N) per answer token: ``log_prob`` under the predictive, its ``entropy`` and the
            ``mutual_information``; 0 after the answer's end.
    """

    token_ids: Tensor
    lengths: Tensor
    texts: list[str] | None = None
    member_token_ids: Tensor | None = None
    member_texts: list[list[str]] | None = None
    samples: list[list] | None = None
    scores: dict[str, Tensor] = field(default_factory=dict)
    token_scores: dict[str, Tensor] = field(default_factory=dict)


def check_language_model(model) -> bool:
    """Whether ``model`` (an ``Ensemble`` of ``sve.wrap``, or a run's ``EnsembleMethod``) can write, and how its
    members' next-token logits are read: False, the wrapped model's ``lm_head`` as the members' heads at the last
    token; True, a Hugging Face causal LM's own ``lm_head`` under each member's layers (a trained run)."""
    method = model if isinstance(model, EnsembleMethod) else model.method
    if type(method).forward is not EnsembleMethod.forward:  # members drawn around forward (BLoB, ...)
        raise InputError(
            f"generate does not support {type(method).__name__}: its members are set up by its own "
            "forward, which a step with a key/value cache does not go through"
        )
    backbone = method.backbone
    if isinstance(backbone, HFCausalLMBackbone):
        if type(method).member_features is not EnsembleMethod.member_features:
            raise InputError(
                f"generate does not support {type(method).__name__} on a run's language model: its members are not "
                "one LM's adapted layers (a deep ensemble's whole copies, a last-layer ensemble's heads), so the "
                "LM's own lm_head cannot write for each of them"
            )
        if backbone.model.get_output_embeddings() is None:
            raise InputError(f"generate needs an lm_head; {type(backbone.model).__name__} has none")
        return True
    vocabulary = getattr(getattr(getattr(backbone, "model", None), "config", None), "vocab_size", None)
    config = getattr(model, "config", {}) if not isinstance(model, EnsembleMethod) else {}
    if not (
        isinstance(backbone, ModuleBackbone)
        and config.get("keep_head")
        and config.get("pooling") == "last"
        and method.num_classes == vocabulary
    ):
        raise InputError(
            "generate needs a causal LM wrapped with its own lm_head as the members' heads, read at the last "
            "token: sve.wrap(model, method=..., pooling='last') without num_classes, or a run whose backbone is "
            "a Hugging Face causal LM (sve-generate)"
        )
    return False


class Decoder:
    """The members' passes of one decoding run: which members share a pass, each pass's key/value cache."""

    def __init__(self, method: EnsembleMethod, prompt: dict, through_lm_head: bool = False):
        self.method = method
        self.members = list(range(method.num_members()))
        batched = type(method).member_features is EnsembleMethod.member_features  # one backbone's rows
        # One at a time where a layer cannot take the members stacked: decided on the prompt, before decoding.
        k = method.members_per_pass(prompt, len(self.members)) if batched else 1
        self.chunks = [self.members[i : i + k] for i in range(0, len(self.members), k)]
        self.model = method.backbone.model
        self.keyword = cache_keyword(self.model)
        self.through_lm_head = through_lm_head  # a run's LM: logits from its lm_head (check_language_model)
        self.last_only = "logits_to_keep" in inspect.signature(type(self.model).forward).parameters

    def start(self) -> None:
        from transformers import DynamicCache

        self.caches = [DynamicCache(config=self.model.config) for _ in self.chunks]

    def logits(self, tokens: Tensor, mask: Tensor, positions: Tensor) -> Tensor:
        """Member next-token logits (M, B, V); ``tokens`` (S, B, T) holds S = 1 sequence every member reads or
        S = M, one per member; ``mask`` (B, L) and ``positions`` (B, T) are the prompts'."""
        out = []
        for chunk, cache in zip(self.chunks, self.caches):
            ids = tokens[0] if len(tokens) == 1 else tokens[chunk].flatten(0, 1)  # (K*B, T) or (B, T)
            K, B = len(chunk), mask.shape[0]
            if len(tokens) == 1 and K > 1:
                ids = repeat_members(ids, K)
            batch = {
                "input_ids": ids,
                "attention_mask": repeat_members(mask, K),
                "position_ids": repeat_members(positions, K),
                "use_cache": True,
                self.keyword: cache,
            }
            if self.through_lm_head:
                out.append(split_members(self.next_token_logits(batch, chunk, K * B), K))
                continue
            if K == 1:  # any method: its own member_logits on one member's rows
                out.append(self.method.member_logits(batch, chunk))
                continue
            with self.method.select(chunk, rows=K * B):
                features = split_members(self.method.backbone(batch), K)  # (K, B, D)
            out.append(self.method.heads(features, chunk))
        return torch.cat(out)  # (M, B, V)

    def next_token_logits(self, batch: dict, chunk: list[int], rows: int) -> Tensor:
        """(rows, V) the LM's own next-token logits with the member layers running ``chunk``, member-major."""
        keep = {"logits_to_keep": 1} if self.last_only else {}  # lm_head on the last position only
        with self.method.select(chunk, rows=rows):
            return self.model(**batch, **keep).logits[:, -1]


def choose(log_probs: Tensor, do_sample: bool, temperature: float, top_p: float, generator) -> Tensor:
    """Next tokens (R,) from log-probabilities (R, V): the most likely, or a draw at ``temperature`` from the
    smallest set of tokens whose probability reaches ``top_p``."""
    if not do_sample:
        return log_probs.argmax(-1)
    probs = (log_probs / temperature).softmax(-1)
    if top_p < 1:
        sorted_probs, order = probs.sort(-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the tokens ranked above each
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return torch.multinomial(probs.float(), 1, generator=generator).squeeze(-1)


class Stopping:
    """Which sequences have ended: an end-of-sequence token, a stop string in the decoded answer."""

    def __init__(self, eos: set[int], stop_strings: Sequence[str], tokenizer):
        if stop_strings and tokenizer is None:
            raise InputError("stop_strings need a tokenizer (tokenizer=) to read the answers as text")
        self.eos, self.stop_strings, self.tokenizer = eos, list(stop_strings), tokenizer

    def ended(self, answers: Tensor, done: Tensor) -> Tensor:
        """(R,) rows of ``answers`` (R, n) that end at their last token; ``done`` rows are left as they are."""
        last = answers[:, -1]
        ended = torch.tensor([int(t) in self.eos for t in last.tolist()], dtype=torch.bool, device=last.device)
        if self.stop_strings:
            for r in (~done & ~ended).nonzero().flatten().tolist():
                text = self.tokenizer.decode(answers[r], skip_special_tokens=True)
                ended[r] = any(s in text for s in self.stop_strings)
        return ended


def decode(
    decoder: Decoder,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    own: bool,
    max_new_tokens: int,
    stopping: Stopping,
    pad_id: int,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator=None,
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """One decoding run from left-padded prompts (B, T). ``own``: every member decodes its own greedy answer;
    else one answer per prompt from the predictive. Returns the answers (S, B, N), their mask (S, B, N) (1 up
    to and with the stop token) and, for the predictive's answers, ``step_statistics`` stacked (B, N)."""
    M, B = len(decoder.members), prompt_ids.shape[0]
    S = M if own else 1
    decoder.start()
    tokens, mask = prompt_ids[None], prompt_mask
    positions = (mask.long().cumsum(-1) - 1).clamp_min(0)  # each row counts its own tokens (left padding)
    answers = prompt_ids.new_empty(S, B, 0)
    done = torch.zeros(S * B, dtype=torch.bool, device=prompt_ids.device)
    kept = []  # (S*B,) per step: whether the row was still answering when the token was chosen
    steps: list[dict[str, Tensor]] = []
    for _ in range(max_new_tokens):
        logits = decoder.logits(tokens.expand(S, -1, -1) if own and tokens.shape[0] == 1 else tokens, mask, positions)
        member_log_probs = logits.float().log_softmax(-1)  # (M, B, V)
        if own:
            chosen = member_log_probs.argmax(-1).flatten()  # (M*B,)
        else:
            log_predictive = torch.logsumexp(member_log_probs.double(), 0) - math.log(M)
            chosen = choose(log_predictive, do_sample, temperature, top_p, generator)
            steps.append(sequence.step_statistics(member_log_probs, chosen))
        chosen = chosen.masked_fill(done, pad_id)
        kept.append(~done)
        answers = torch.cat([answers, chosen.view(S, B, 1)], -1)
        done = done | stopping.ended(answers.flatten(0, 1), done)
        if bool(done.all()):
            break
        tokens = chosen.view(S, B, 1)
        mask = torch.cat([mask, mask.new_ones(B, 1)], 1)
        positions = positions[:, -1:] + 1
    answer_mask = torch.stack(kept, -1).view(S, B, -1) if kept else answers.new_zeros(S, B, 0, dtype=torch.bool)
    stacked = {k: torch.stack([s[k] for s in steps], -1) for k in steps[0]} if steps else {}
    return answers, answer_mask, stacked


def prompts_as_ids(prompts, tokenizer, chat: bool | None, device) -> tuple[Tensor, Tensor]:
    """Texts as left-padded ids and mask, through the tokenizer's chat template where it has one (``chat``:
    None uses it where present, False never, True requires it)."""
    if tokenizer is None:
        raise InputError("prompts as text need a tokenizer (tokenizer=), or give input_ids")
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    template = getattr(tokenizer, "chat_template", None)
    if chat and not template:
        raise InputError(f"chat=True, but {type(tokenizer).__name__} has no chat template")
    if template and chat is not False:
        prompts = [
            tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in prompts
        ]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoded = [tokenizer(p, add_special_tokens=not template or chat is False)["input_ids"] for p in prompts]
    width = max(len(e) for e in encoded)
    ids = torch.tensor([[pad or 0] * (width - len(e)) + e for e in encoded], device=device)
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded], device=device)
    return ids, mask


def eos_ids(model, tokenizer, eos_token_id) -> set[int]:
    """The end-of-sequence ids: the argument's, else the model's generation config's, else the tokenizer's."""
    if eos_token_id is None:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos_token_id is None and tokenizer is not None:
        eos_token_id = tokenizer.eos_token_id
    if eos_token_id is None:
        return set()
    return {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(t) for t in eos_token_id}


def trimmed(answers: Tensor, mask: Tensor, pad_id: int) -> tuple[Tensor, Tensor]:
    """Answers (..., N) with ``pad_id`` outside their mask, and their lengths (...)."""
    return answers.masked_fill(~mask, pad_id), mask.sum(-1)


@torch.no_grad()
def generate(
    ensemble,
    prompts: str | Sequence[str] | None = None,
    tokenizer=None,
    input_ids: Tensor | None = None,
    attention_mask: Tensor | None = None,
    max_new_tokens: int = 32,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    eos_token_id: int | Sequence[int] | None = None,
    stop_strings: Sequence[str] = (),
    chat: bool | None = None,
    member_answers: bool = True,
    num_samples: int = 0,
    meaning: str | Callable = "string",
    generator: torch.Generator | None = None,
) -> Generation:
    """``Ensemble.generate`` (module docstring); ``ensemble`` is an ``Ensemble`` or a run's method. Give
    ``prompts`` (text) with a ``tokenizer`` (a run's backbone's own when None; a run applies the tokenizer's chat
    template only with ``chat=True``, since it was trained on its data's plain prompts), or
    ``input_ids`` (left-padded, with ``attention_mask``). ``member_answers``: each member's own greedy answer
    and the ``disagreement``; ``num_samples`` answers sampled from the predictive at ``temperature``/``top_p``
    and the ``semantic_entropy``, their meanings compared by ``meaning`` (``sve.metrics.sequence``)."""
    through_lm_head = check_language_model(ensemble)
    if max_new_tokens < 1 or temperature <= 0 or not 0 < top_p <= 1 or num_samples < 0:
        raise InputError(
            f"need max_new_tokens >= 1, temperature > 0, 0 < top_p <= 1 and num_samples >= 0; got "
            f"{max_new_tokens}, {temperature}, {top_p}, {num_samples}"
        )
    method = ensemble if isinstance(ensemble, EnsembleMethod) else ensemble.method
    model, device = method.backbone.model, method.heads.weight.device
    if through_lm_head:  # a run reads prompts as its data wrote them: no chat template unless asked for
        tokenizer = method.backbone.tokenizer if tokenizer is None else tokenizer
        chat = False if chat is None else chat
    if input_ids is None:
        input_ids, attention_mask = prompts_as_ids(prompts, tokenizer, chat, device)
    attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    if bool((attention_mask[:, -1] == 0).any()):
        raise InputError("input_ids must be left-padded (attention_mask ends in 1 on every row), as for generate")
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    stopping = Stopping(eos_ids(model, tokenizer, eos_token_id), stop_strings, tokenizer)
    pad_id = getattr(tokenizer, "pad_token_id", None)
    pad_id = min(stopping.eos, default=0) if pad_id is None else pad_id
    text = (lambda ids: tokenizer.decode(ids, skip_special_tokens=True)) if tokenizer is not None else None
    classes = sequence.meaning_classes(meaning) if member_answers or num_samples else None
    options = {"do_sample": do_sample, "temperature": temperature, "top_p": top_p, "generator": generator}

    was_training = ensemble.training
    ensemble.eval()
    try:
        decoder = Decoder(method, {"input_ids": input_ids, "attention_mask": attention_mask}, through_lm_head)
        answers, mask, steps = decode(
            decoder, input_ids, attention_mask, False, max_new_tokens, stopping, pad_id, **options
        )
        token_ids, lengths = trimmed(answers[0], mask[0], pad_id)
        result = Generation(token_ids=token_ids, lengths=lengths)
        result.scores = sequence.answer_scores(steps, mask[0])
        result.token_scores = {
            "log_prob": steps["log_prob"] * mask[0],
            "entropy": steps["entropy"] * mask[0],
            "mutual_information": (steps["entropy"] - steps["expected_entropy"]) * mask[0],
        }
        if text is not None:
            result.texts = [text(ids[:n]) for ids, n in zip(token_ids, lengths.tolist())]
        if member_answers:
            own, own_mask, _ = decode(decoder, input_ids, attention_mask, True, max_new_tokens, stopping, pad_id)
            result.member_token_ids, member_lengths = trimmed(own, own_mask, pad_id)
            read = text or (lambda ids: tuple(ids.tolist()))
            member_texts = [
                [read(ids[:n]) for ids, n in zip(rows, lens.tolist())]
                for rows, lens in zip(result.member_token_ids, member_lengths)
            ]
            result.member_texts = member_texts if text is not None else None
            by_prompt = list(zip(*member_texts))  # [B][M]
            result.scores["disagreement"] = torch.tensor(
                [sequence.disagreement(meanings(classes, answers_b)) for answers_b in by_prompt], dtype=torch.float64
            )
        if num_samples:
            B = input_ids.shape[0]
            sampled = {**options, "do_sample": True}
            ids, ids_mask = (t.repeat_interleave(num_samples, 0) for t in (input_ids, attention_mask))
            drawn, drawn_mask, _ = decode(decoder, ids, ids_mask, False, max_new_tokens, stopping, pad_id, **sampled)
            drawn, drawn_lengths = trimmed(drawn[0], drawn_mask[0], pad_id)
            read = text or (lambda ids: tuple(ids.tolist()))
            flat = [read(row[:n]) for row, n in zip(drawn, drawn_lengths.tolist())]
            result.samples = [flat[b * num_samples : (b + 1) * num_samples] for b in range(B)]
            result.scores["semantic_entropy"] = torch.tensor(
                [sequence.semantic_entropy(meanings(classes, s)) for s in result.samples], dtype=torch.float64
            )
    finally:
        ensemble.train(was_training)
    return result


def meanings(classes: Callable, answers: Sequence) -> list[int]:
    """Meaning classes of answers; token-id tuples (no tokenizer) are compared exactly."""
    if answers and not isinstance(answers[0], str):
        return sequence.string_classes([" ".join(map(str, a)) for a in answers])
    return classes(answers)
