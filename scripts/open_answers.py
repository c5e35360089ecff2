"""Open-ended answers of trained ARC runs (``sve.runs.open_answers``): ``python scripts/open_answers.py RUN_DIR
[RUN_DIR ...] [--questions N] [--batch-size B] [-- key=value ...]`` (``make mini-open-answers``).

Each run directory gets ``evaluations/open_answers/answers.jsonl`` for the first N questions of its test split,
written batch by batch, and ``unrelated.json`` (the rule's rate on answers paired with another question); a run
whose file already holds N answers is skipped, an unfinished one goes on where it
stopped, so the target resumes. Overrides after ``--`` go to every run's config (``dataset.root=...``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sve.errors import one_line_errors


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--questions", type=int, default=None, help="the first N test questions (default: all)")
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args(argv)
    from sve.runs.open_answers import DIRECTORY, answer_questions, unrelated_hits

    for run_dir in args.runs:
        start = time.perf_counter()
        path = answer_questions(run_dir, args.questions, args.batch_size, overrides)
        print(f"{path}: {sum(1 for _ in path.open())} answers ({time.perf_counter() - start:.0f} s in this call)")
        if not (run_dir / DIRECTORY / "unrelated.json").is_file():
            print(f"  the rule on unrelated answers: {unrelated_hits(run_dir, overrides)}")
    return 0


if __name__ == "__main__":
    with one_line_errors():
        sys.exit(main())
