"""Tokens per second of ``Ensemble.generate`` against the same model's plain transformers ``generate``.

    python scripts/bench_generate.py                      # SmolLM2-135M if converted (make smollm2), else random
    python scripts/bench_generate.py --model random --new 32 --repeats 3
    python scripts/bench_generate.py --prompts 4 --out results/bench/generate.md   # make bench-generate

Every timing of one call of this script runs in the same process, one after another, so the ratios are
measured under the same load (a busy machine slows all of them alike, not their ratios; say so with the
numbers). Greedy decoding of the same prompts for ``--new`` tokens with no end-of-sequence token, so every
call produces the same count; the best of ``--repeats`` is kept. Rows: plain ``generate``; the ensemble's
predictive decoding alone (``member_answers=False``) at M = 1 and M = 4; and at M = 4 with every score
(each member's greedy answer, 5 sampled answers for the semantic entropy).
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import time
from pathlib import Path

import torch

import sve
from sve.paths import cache_root


def load(name: str):
    """(model, where it came from): SmolLM2-135M as ``make smollm2`` converts it, else a random LLaMA its size."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    path = cache_root() / "smollm2_135m"
    if name == "smollm2" or (name == "auto" and (path / "config.json").exists()):
        return AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval(), str(path)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval(), "random LLaMA with SmolLM2-135M's shape"


def best_time(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["auto", "smollm2", "random"], default="auto")
    parser.add_argument("--prompts", type=int, default=1, help="prompts per call (the batch)")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new", type=int, default=32, help="new tokens per prompt")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="also write the table as markdown to this file")
    parser.add_argument("--conditions", default="", help="what else ran on the machine, for the notes")
    args = parser.parse_args()
    model, source = load(args.model)
    model.generation_config.eos_token_id = None  # every call decodes --new tokens
    ids = torch.randint(100, 1000, (args.prompts, args.prompt_tokens), generator=torch.Generator().manual_seed(0))
    mask, tokens = torch.ones_like(ids), args.prompts * args.new
    ensembles = {m: sve.wrap(copy.deepcopy(model), method="sve", ensemble_size=m, pooling="last") for m in (1, 4)}

    def plain():
        with torch.no_grad():
            model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=args.new, do_sample=False, min_new_tokens=args.new
            )

    def ours(m: int, scores: bool):
        options = {"member_answers": scores, "num_samples": 5 if scores else 0}
        return lambda: ensembles[m].generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=args.new, eos_token_id=[], **options
        )

    rows = [
        ("transformers generate", plain),
        ("Ensemble.generate, M = 1", ours(1, False)),
        ("Ensemble.generate, M = 4", ours(4, False)),
        ("Ensemble.generate, M = 4, every score", ours(4, True)),
    ]
    setting = (
        f"{source}; {args.prompts} prompt(s) of {args.prompt_tokens} tokens, {args.new} new tokens, greedy; "
        f"best of {args.repeats}; torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
    )
    print(setting)
    reference, table = None, []
    for name, call in rows:
        call()  # warm up
        seconds = best_time(call, args.repeats)
        rate = tokens / seconds
        reference = reference or rate
        table.append(f"| {name} | {rate:.1f} | {rate / reference:.2f}x |")
        print(f"{name:40s} {rate:8.1f} answer tokens/s   {rate / reference:5.2f}x of plain generate")
    if args.out:
        write_notes(args, setting, table)


def write_notes(args, setting: str, table: list[str]) -> None:
    """The table as markdown, with the commit and the machine's conditions (all rows timed in this one run)."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
    lines = [
        "# Generation speed (`make bench-generate`)",
        "",
        f"`scripts/bench_generate.py` at commit {commit}: {setting}; {os.cpu_count()} CPU cores.",
        *([f"Conditions: {args.conditions}."] if args.conditions else []),
        "Every row is timed in the same process, one after another: the ratios are measured under the same load.",
        "",
        "| decoding | answer tokens/s | of plain generate |",
        "|:--|--:|--:|",
        *table,
        "",
        '"every score": each member\'s own greedy answer and 5 answers sampled from the predictive besides the answer.',
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
