"""``python scripts/mini_distill.py [--results results/mini] [--dry-run]`` (``make mini-distill``): the
students of the mini distillation table (``sve/configs/tables/mini_distill.yaml``), each seed's SVE teacher
distilled by ``sve-distill`` with each objective, then the table rebuilt.

A teacher is read from its run directory's ``checkpoints/final.ckpt`` or, failing that, its ``adapter/`` (what
``scripts/collect_runs.py`` keeps of a committed SVE run). A student whose ``results.json`` exists is skipped,
so the target resumes; a teacher whose trained state is not on disk is listed with what to do. A student
trains at the learning rate the table's sweep tuned for the one-member SVF of the same experiment (the
student's own method, ``runs/<experiment>/svf_m1/tuned.json``), chosen on validation labels: the distillation
objective gets no grid of its own.
"""

from __future__ import annotations

import argparse
from pathlib import Path

SAMPLES = 32  # the Dirichlet student is evaluated as this many draws (its row's member count)
OBJECTIVES = {"mean": 1, "dirichlet": SAMPLES}


def student_lr(root: Path, experiment: str) -> list[str]:
    """``["lr=<value>"]`` from the one-member SVF's tuning record of ``experiment``, else ``[]`` (the default)."""
    import json

    tuned = root / "runs" / experiment / "svf_m1" / "tuned.json"
    return [f"lr={json.loads(tuned.read_text())['value']}"] if tuned.is_file() else []


def plan(root: Path, spec, experiments: list[str] | None = None) -> tuple[list[tuple[Path, str, Path]], list[Path]]:
    """((teacher source, objective, student directory) to do, teachers missing), over ``experiments`` of the
    table (default: all)."""
    from sve.errors import InputError
    from sve.paper.store import parse_row, run_dir

    unknown = sorted(set(experiments or []) - set(spec.experiments))
    if unknown:
        raise InputError(f"--experiments {' '.join(unknown)}: not in the mini distillation table; choose from "
                         f"{', '.join(spec.experiments)}")  # fmt: skip
    teacher_method, teacher_members = parse_row(spec.get("teacher", "sve:4"))
    todo, missing = [], []
    for experiment in experiments or spec.experiments:
        for seed in spec.seeds:
            teacher = run_dir(root, experiment, teacher_method, teacher_members, int(seed))
            source = teacher if (teacher / "checkpoints" / "final.ckpt").is_file() else teacher / "adapter"
            for objective, members in OBJECTIVES.items():
                student = run_dir(root, experiment, f"distilled_{objective}", members, int(seed))
                if (student / "results.json").exists():
                    continue
                if not (source / "adapter_config.json").is_file() and source.name == "adapter":
                    missing.append(teacher)
                    break
                todo.append((source, objective, student))
    return todo, sorted(set(missing))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results/mini"))
    parser.add_argument("--dry-run", action="store_true", help="list the students to distill, distill none")
    parser.add_argument("--experiments", nargs="+", metavar="NAME",
                        help="only these experiments of the table (e.g. to run two at once, one each)")
    args = parser.parse_args(argv)
    from sve.errors import one_line_errors
    from sve.paper.store import load_spec

    with one_line_errors():
        todo, missing = plan(args.results, load_spec("mini_distill"), args.experiments)
        for teacher in missing:
            if not (teacher / "results.json").exists():
                print(f"skipped teacher {teacher}: not trained yet (make mini trains it)")
                continue
            print(f"skipped teacher {teacher}: its trained state is in neither checkpoints/final.ckpt nor adapter/ "
                  "(a run committed before adapters were kept); train it again in a clone (delete its directory there, "
                  "and the tuning run that REUSED.txt names if it has one, then make mini) and collect it, or run "
                  "this where it was trained")  # fmt: skip
        for i, (source, objective, student) in enumerate(todo, 1):
            print(f"[{i}/{len(todo)}] {objective} student of {source} -> {student}", flush=True)
            if not args.dry_run:
                from sve.runs.distillation import distill_run

                experiment = student.relative_to(args.results / "runs").parts[0]
                distill_run([f"run_dir={source}", f"objective={objective}", f"samples={SAMPLES}", f"out={student}",
                             *student_lr(args.results, experiment)])  # fmt: skip
        if not args.dry_run:
            from sve.paper.report import build

            for path in build("mini_distill", root=args.results):
                print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
