"""Open-ended answers of a trained run to multiple-choice questions, judged against the options.

A run trained on ARC (any run whose backbone is a causal LM and whose data are multiple-choice questions) is
asked each test question *without its options*: the prompt is the run's own cloze stem ("Question: ...\\nAnswer:",
after ``shots`` training questions with their answers where the protocol asks for them; 0 in ``PROTOCOL``),
and the ensemble writes an answer (``sve.api.generation``): greedy from the predictive, each member's own greedy
answer (for the disagreement) and ``num_samples`` answers sampled from the predictive (for the semantic entropy).

The rule that judges an answer was fixed before any answer was written (``PROTOCOL``):

- **correct**: the answer's MiniLM sentence embedding (all-MiniLM-L6-v2, ``sve.metrics.sequence.minilm_embedder``)
  is closer, in cosine similarity, to the correct option's text than to every other option's, and that
  similarity is at least ``floor``; an empty answer is wrong.
- **exact** (reported beside it): the normalised answer (``sve.metrics.sequence.normalized``) equals the
  normalised correct option.

The rule's rate for an *unrelated* answer is measured beside it (``unrelated_hits``): each answer judged against
the options of the next question in the file, ``unrelated.json``. It says what accuracy the rule gives to answers
that carry no knowledge of the question at all.

Decoding stops at a line break or a full stop (the stop string is cut from the judged text) or after
``max_new_tokens``. Each batch samples from a generator seeded by its first question's position, so a resumed or
repeated evaluation with the same batch size writes the same samples.

Files, in ``<run dir>/evaluations/open_answers/``: ``answers.jsonl``, one record per question in the test split's
order (its position ``index``, the prompt, the answer, the member answers, the samples, every score, the
similarity to each option, ``correct`` and ``exact``), appended batch by batch, so an interrupted evaluation goes
on from its last whole batch and ends as an uninterrupted one; and ``protocol.json``, the settings it ran with,
the batch size included (a rerun with other settings is refused, naming them, rather than mixing answers
written two ways).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from sve.errors import InputError

log = logging.getLogger(__name__)

PROTOCOL = {
    "prompt": "the run's cloze stem, without options",
    "chat_template": False,  # the stem as the run was trained on it, never wrapped in the tokenizer's template
    "shots": 0,
    "max_new_tokens": 12,
    "stop_strings": ["\n", "."],
    "meaning": "all-MiniLM-L6-v2 cosine >= 0.9 (semantic entropy, disagreement)",
    "num_samples": 5,
    "temperature": 1.0,
    "judge": "all-MiniLM-L6-v2 cosine: closest to the correct option and >= floor",
    "floor": 0.4,
}
DIRECTORY = "evaluations/open_answers"


def judged(answer: str, options: tuple[str, ...], label: int, embed, floor: float) -> dict:
    """The rule of the module docstring: ``similarity`` to each option, ``correct``, ``exact``."""
    from sve.metrics.sequence import normalized

    if not answer.strip():
        return {"similarity": [0.0] * len(options), "correct": False, "exact": False}
    vectors = embed([answer, *options])
    similarity = (vectors[1:] @ vectors[0]).tolist()
    best = max(range(len(options)), key=lambda k: similarity[k])
    others = [similarity[k] for k in range(len(options)) if k != label]
    correct = best == label and similarity[label] > max(others, default=-1.0) and similarity[label] >= floor
    return {
        "similarity": [round(v, 6) for v in similarity],
        "correct": bool(correct),
        "exact": normalized(answer) == normalized(options[label]),
    }


def examples(datamodule, split: str, count: int) -> list[tuple]:
    """The first ``count`` examples of a split, in its order."""
    data = datamodule.splits[split]
    return [data[i] for i in range(min(count, len(data)))]


def cut(text: str, stops: list[str]) -> str:
    """The answer without its stop string and what follows (generation keeps the stop, as transformers does)."""
    for stop in stops:
        text = text.split(stop, 1)[0]
    return text.strip()


def written(path: Path) -> list[dict]:
    """The records already in ``answers.jsonl``; a last line cut short by a crash is dropped."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


def check_protocol(out: Path, protocol: dict) -> None:
    """Records ``protocol`` beside the answers; refuses one that differs from what they were written with (the
    number of questions may grow: more answers of the same kind)."""
    where = out / "protocol.json"
    if where.is_file():
        before = json.loads(where.read_text())
        # A setting the file does not name (written before it was recorded) is taken as the one given now.
        changed = {
            k: (before[k], v) for k, v in protocol.items() if k != "questions" and k in before and before[k] != v
        }
        if changed:
            raise InputError(
                f"{where} was written with other settings {changed} (before, now); remove {out} to write the "
                "answers again with the new ones"
            )
    out.mkdir(parents=True, exist_ok=True)
    where.write_text(json.dumps(protocol, indent=1) + "\n")


def answer_questions(
    run_dir: str | Path,
    questions: int | None = None,
    batch_size: int = 8,
    overrides: list[str] = (),
    protocol: dict | None = None,
) -> Path:
    """Writes (or completes) ``answers.jsonl`` of ``run_dir`` for the first ``questions`` test questions (all
    when None); returns its path. ``run_dir``: a run directory with ``adapter/`` or a final checkpoint."""
    from tqdm.auto import tqdm

    from sve.api.generation import generate
    from sve.metrics.sequence import minilm_classes, minilm_embedder
    from sve.runs.reevaluate import load_run, model_directory

    run_dir = Path(run_dir).expanduser()
    protocol = {**PROTOCOL, **(protocol or {})}
    _, _, module, datamodule = load_run(model_directory(run_dir), list(overrides), trainer=False)
    test = datamodule.splits["test"]
    if not test or len(test[0]) != 5:
        raise InputError(
            f"{run_dir}: open-ended answers need multiple-choice questions with option texts (ARC's data "
            f"modules); this run's test examples are not"
        )
    questions = len(test) if questions is None else min(int(questions), len(test))
    out = run_dir / DIRECTORY
    # The batch shapes the answers (its padding, its samples' generator), so it is part of the protocol, and an
    # interrupted file goes on from its last whole batch: the answers end as an uninterrupted call writes them.
    check_protocol(out, {**protocol, "batch_size": batch_size, "questions": questions})
    path = out / "answers.jsonl"
    records = written(path)[:questions]
    records = records[: len(records) - len(records) % batch_size] if len(records) < questions else records
    path.write_text("".join(json.dumps(r) + "\n" for r in records))  # drops a torn last line
    method, embed = module.method, minilm_embedder()
    meaning = minilm_classes(0.9, embed)
    shots = "".join(
        f"{stem} {options[label]}\n\n"
        for _, label, _, stem, options in examples(datamodule, "train", protocol["shots"])
    )
    stops = list(protocol["stop_strings"])
    members = method.eval().num_members()
    with tqdm(total=questions, initial=len(records), desc=f"answering ({run_dir.name})", unit="question") as bar:
        for start in range(len(records), questions, batch_size):
            batch = [test[i] for i in range(start, min(start + batch_size, questions))]
            result = generate(
                method,
                [shots + stem for _, _, _, stem, _ in batch],
                max_new_tokens=protocol["max_new_tokens"],
                stop_strings=stops,
                member_answers=members > 1,
                num_samples=protocol["num_samples"],
                temperature=protocol["temperature"],
                meaning=meaning,
                chat=protocol["chat_template"],
                generator=torch.Generator().manual_seed(start),
            )
            with path.open("a") as f:
                for b, (_, label, _, stem, options) in enumerate(batch):
                    answer = cut(result.texts[b], stops)
                    record = {
                        "index": start + b,
                        "question": stem,
                        "label": label,
                        "answer": answer,
                        "member_answers": [cut(t[b], stops) for t in result.member_texts or []],
                        "samples": [cut(t, stops) for t in (result.samples or [[]] * len(batch))[b]],
                        "scores": {k: float(v[b]) for k, v in result.scores.items()},
                        **judged(answer, options, label, embed, protocol["floor"]),
                    }
                    f.write(json.dumps(record) + "\n")
            bar.update(len(batch))
    return path


def unrelated_hits(run_dir: str | Path, overrides: list[str] = ()) -> dict:
    """Writes ``unrelated.json`` beside a run's answers (module docstring): answer i judged by the rule against the
    options of question i + 1 (the last against the first); returns its record."""
    from sve.metrics.sequence import minilm_embedder
    from sve.runs.reevaluate import load_run, model_directory

    run_dir = Path(run_dir).expanduser()
    out = run_dir / DIRECTORY
    records = written(out / "answers.jsonl")
    if not records:
        raise InputError(f"{out / 'answers.jsonl'}: no answers to judge")
    protocol = json.loads((out / "protocol.json").read_text())
    _, _, _, datamodule = load_run(model_directory(run_dir), list(overrides), trainer=False)
    test, embed = datamodule.splits["test"], minilm_embedder()
    hits = 0
    for i, record in enumerate(records):
        _, label, _, _, options = test[records[(i + 1) % len(records)]["index"]]
        hits += judged(record["answer"], options, label, embed, protocol["floor"])["correct"]
    result = {"pairs": len(records), "hits": int(hits), "rate": hits / len(records), "paired_with": "the next question"}
    (out / "unrelated.json").write_text(json.dumps(result, indent=1) + "\n")
    return result
