"""ARC-Easy (Clark et al., 2018) as multiple choice for a causal LM.

Each question becomes a prompt with lettered options, ending where the model would write the answer letter::

    Question: Which gas do plants absorb?
    A. oxygen
    B. carbon dioxide
    C. nitrogen
    Answer:

The prediction is the softmax over the logits of the option-letter tokens at that last position. In this
framework that is a member head whose rows are the LM's output embeddings of the letters (the backbone's
``initial_head``, see ``sve.backbones.choice_lm``) applied to the last token's hidden state; the head has
five rows (A-E) and ``choice_mask`` (B, 5) masks the options a question lacks (ARC has 3 to 5), so the
member logits keep the (M, B, C) layout with C = 5.

Options are always shown as A, B, C, ... in their stored order, whatever the dataset's labels (ARC uses
``A-E`` for most questions and ``1-5`` for some); the target is the position of ``answerKey`` among them.

``scoring: cloze`` is the other common way to ask a small LM (the "cloze" form of multiple-choice evaluation):
no options in the prompt; each option's text is appended to ``Question: ...\nAnswer:`` and scored by the
mean log-probability of its tokens. Small models answer letter prompts at chance level but rank option texts
well above it. The batch then holds the stems and, separately, the option texts (``option_ids`` (B, 5, L));
the backbone turns them into five scores per question, which a head initialised as the identity maps to the
logits (``sve.backbones.choice_lm``), so the layout stays (M, B, 5).

Local layout (``dataset.root``): ``ARC-Easy-{train,validation,test}.jsonl``, one JSON object per line with
``question``, ``choices: {text: [...], label: [...]}`` and ``answerKey``; the file prefix is ``hub_config``
(``ARC-Challenge-*.jsonl`` with ``dataset=arc_challenge``, or any ARC-format set named by ``hub_config``).
Without ``root`` the splits come from the Hugging Face hub (``allenai/ai2_arc``, config ``ARC-Easy``).
Sizes: 2,251 / 570 / 2,376.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import torch

from sve.data.base import TextClassificationData
from sve.data.checks import load_hub_dataset, read_utf8, require_files
from sve.errors import InputError

LETTERS = ("A", "B", "C", "D", "E")
SCORINGS = ("letters", "cloze")
SPLITS = {"train": "train", "val": "validation", "test": "test"}
LAYOUT = (
    "{hub_config}-{{train,validation,test}}.jsonl (JSON lines with question, choices{{text,label}}, answerKey; "
    "e.g. ../shared/data/arc_easy for ARC-Easy)"
)
RECORD = "a JSON object with question, choices: {text: [...], label: [...]} and answerKey"


def to_example(row: dict, where: str = "question") -> tuple[str, int, int, str, tuple[str, ...]]:
    """(lettered prompt, index of the answer, number of options, cloze stem, option texts) from one record;
    a bad record is an ``InputError`` starting with ``where`` (e.g. the file and line)."""
    if not isinstance(row, dict):
        raise InputError(f"{where}: expected {RECORD}, got a JSON {type(row).__name__}")
    missing = [k for k in ("question", "choices", "answerKey") if k not in row]
    choices = row.get("choices")
    if not missing and not (
        isinstance(choices, dict) and isinstance(choices.get("text"), list) and isinstance(choices.get("label"), list)
    ):
        missing = ["choices.text", "choices.label"]
    if missing:
        raise InputError(f"{where}: the record lacks {missing}; expected {RECORD}")
    qid = row.get("id")
    texts, labels = choices["text"], [str(label) for label in choices["label"]]
    if len(texts) != len(labels):
        raise InputError(f"{where}: question {qid} has {len(texts)} option texts but {len(labels)} labels")
    if not 2 <= len(texts) <= len(LETTERS):
        raise InputError(
            f"{where}: question {qid} has {len(texts)} options; at least 2 and at most {len(LETTERS)} "
            f"are supported (the dataset has {len(LETTERS)} classes, options {LETTERS[0]}-{LETTERS[-1]})"
        )
    if not isinstance(row["question"], str) or not all(isinstance(t, str) for t in texts):
        raise InputError(f"{where}: question {qid}: the question and the option texts must be strings")
    if len(set(labels)) != len(labels):
        raise InputError(f"{where}: question {qid}: the option labels {labels} repeat; each option needs its own")
    answer = str(row["answerKey"]).strip()
    if answer not in labels:
        raise InputError(f"{where}: question {qid}: answerKey {answer!r} is not among the option labels {labels}")
    options = "\n".join(f"{letter}. {text}" for letter, text in zip(LETTERS, texts))
    stem = f"Question: {row['question']}\nAnswer:"
    return f"Question: {row['question']}\n{options}\nAnswer:", labels.index(answer), len(texts), stem, tuple(texts)


def read_jsonl(path: Path) -> list[tuple]:
    """The examples of one ARC file; any bad line is an error naming the file, the line and what is valid."""
    examples, lines = [], {}
    for n, line in enumerate(io.StringIO(read_utf8(path), newline=None), 1):  # lines as text-mode reading splits them
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(
                f"{path}, line {n}: not valid JSON ({err.msg}, column {err.colno}); expected {RECORD} on each line"
            ) from None
        examples.append(to_example(row, f"{path}, line {n}"))
        qid = row.get("id")
        if qid is not None:
            if qid in lines:
                raise InputError(
                    f"{path}, line {n}: question id {qid!r} repeats line {lines[qid]}; each question once per file"
                )
            lines[qid] = n
    if not examples:
        raise InputError(f"{path}: no questions (the file is empty); expected {RECORD} on each line")
    return examples


class ARCEasyData(TextClassificationData):
    """Args:
    root: local directory (see module docstring); None loads ``allenai/ai2_arc`` with ``datasets``.
    hub_name, hub_config: the hub dataset (``ARC-Challenge`` works the same way).
    max_length: truncation length in tokens (Table 7: 512); ARC prompts are far shorter.
    scoring: ``letters`` (the paper's setting: the logits of the option letters) or ``cloze`` (each option's
        text scored by its mean token log-probability; module docstring).
    """

    num_classes = len(LETTERS)
    name = "arc_easy"
    model_keys = ("scoring", "max_length")  # letters: a head on the hidden state; cloze: on the option scores

    def __init__(
        self,
        root: str | None = None,
        hub_name: str = "allenai/ai2_arc",
        hub_config: str = "ARC-Easy",
        max_length: int = 512,
        scoring: str = "letters",
        **kwargs,
    ):
        super().__init__(max_length=max_length, **kwargs)
        if scoring not in SCORINGS:
            raise InputError(f"dataset.scoring={scoring!r} is not valid; choose one of {list(SCORINGS)}")
        self.scoring = scoring
        self.root = root
        self.hub_name, self.hub_config = hub_name, hub_config
        self.name = str(hub_config).lower().replace("-", "_")  # arc_easy, arc_challenge: in error messages

    def attach(self, backbone) -> None:
        super().attach(backbone)
        if self.scoring == "cloze":
            if not hasattr(backbone, "score_options"):
                raise InputError(
                    f"dataset.scoring=cloze needs a causal-LM backbone that scores option texts "
                    f"(sve.backbones.ChoiceCausalLMBackbone: smollm2_135m, llama2_7b), not "
                    f"{type(backbone).__name__}"
                )
            backbone.score_options(len(LETTERS))  # features: one score per option; the head starts as identity
        # The causal-LM backbone turns these into its initial head (lm_head rows of the letter tokens).
        elif hasattr(backbone, "answer_tokens"):
            backbone.answer_tokens = list(LETTERS)

    def read_splits(self):
        layout = LAYOUT.format(hub_config=self.hub_config)
        if self.root is not None:
            root = Path(self.root).expanduser()
            # The file prefix is the subset (hub_config), so ARC-Challenge and any ARC-format set load alike.
            names = {s: f"{self.hub_config}-{name}.jsonl" for s, name in SPLITS.items()}
            layout += f" ({self.key}.hub_config={self.hub_config!r} names the files)"
            require_files(root, list(names.values()), f"{self.key}.root", self.root, layout, self.what)
            self.notes = {s: str(root / name) for s, name in names.items()}
            return {s: read_jsonl(root / name) for s, name in names.items()}
        ds = load_hub_dataset(
            self.hub_name, self.hub_config, self.what, f"set {self.key}.root to a directory holding {layout}"
        )
        self.notes = {s: f"{self.hub_name}/{self.hub_config} {name}" for s, name in SPLITS.items()}
        return {
            s: [
                to_example(row, f"{self.hub_name}/{self.hub_config} {name} split, row {i}")
                for i, row in enumerate(ds[name])
            ]
            for s, name in SPLITS.items()
        }

    def collate(self, examples: list[tuple]) -> dict:
        if self.scoring == "cloze":
            return self.collate_cloze(examples)
        prompts, labels, counts = zip(*(e[:3] for e in examples))
        tokenizer = self.backbone.tokenizer
        side, tokenizer.truncation_side = tokenizer.truncation_side, "left"  # never cut off "Answer:"
        try:
            batch = super().collate(list(zip(prompts, labels)))
        finally:
            tokenizer.truncation_side = side
        # (B, 5): True for the options a question has.
        batch["choice_mask"] = choice_mask(counts, self.num_classes)
        return batch

    def collate_cloze(self, examples: list[tuple]) -> dict:
        """The stems, right-padded: ``input_ids``/``attention_mask`` (B, S); each question's option texts,
        right-padded: ``option_ids``/``option_mask`` (B, 5, L), all zeros in the slots a question lacks. The
        backbone runs each stem once and its options as continuations (``sve.backbones.choice_lm``)."""
        tokenizer, pad = self.backbone.tokenizer, self.backbone.tokenizer.pad_token_id
        stems, options = [], []
        for _, _, count, stem, texts in examples:
            slots = [
                tokenizer(" " + texts[c], add_special_tokens=False)["input_ids"] if c < count else []
                for c in range(self.num_classes)
            ]
            longest = min(max(map(len, slots)), self.max_length - 1)
            options.append([o[:longest] for o in slots])
            stems.append(tokenizer(stem)["input_ids"][-(self.max_length - longest) :])  # cut the question's start
        S, L = max(map(len, stems)), max(len(o) for slots in options for o in slots)
        padded = lambda rows, width: torch.tensor([r + [pad] * (width - len(r)) for r in rows])  # noqa: E731
        present = lambda rows, width: torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])  # noqa: E731
        flat = [o for slots in options for o in slots]
        return {
            "input_ids": padded(stems, S),
            "attention_mask": present(stems, S),
            "option_ids": padded(flat, L).reshape(len(examples), self.num_classes, L),
            "option_mask": present(flat, L).reshape(len(examples), self.num_classes, L),
            "labels": torch.tensor([e[1] for e in examples], dtype=torch.long),
            "choice_mask": choice_mask([e[2] for e in examples], self.num_classes),
        }


def choice_mask(counts, num_classes: int) -> torch.Tensor:
    """(B, C): True for the options a question has."""
    return torch.arange(num_classes)[None] < torch.tensor(counts)[:, None]


__all__ = ["ARCEasyData", "to_example", "LETTERS", "SCORINGS"]
