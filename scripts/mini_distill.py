"""``python scripts/mini_distill.py [--results results/mini] [--dry-run]`` (``make mini-distill``): the
students of the mini distillation table (``sve/configs/tables/mini_distill.yaml``), each seed's SVE teacher
distilled by ``sve-distill`` with each objective, then the table rebuilt.

A teacher is read from its run directory's ``checkpoints/final.ckpt`` or, failing that, its ``adapter/`` (what
``scripts/collect_runs.py`` keeps of a committed SVE run), or else from ``teachers/<the same path>`` of the
store: where ``--retrain-teachers`` trains a finished teacher again from the command its results.json records,
when its trained state was left behind (a committed run, or a tuning run's copy, keeps no checkpoint). Runs
reproduce to the last digit, so the retrained teacher's test metrics are compared with the committed run's
and the difference, if any, is printed and recorded in ``teachers/.../reproduced.json``. A student whose
``results.json`` exists is skipped, so the target resumes; a teacher whose trained state is not on disk is
listed with what to do. A student trains at the learning rate the table's sweep tuned for the one-member SVF
of the same experiment (the student's own method, ``runs/<experiment>/svf_m1/tuned.json``), chosen on
validation labels: the distillation objective gets no grid of its own.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sve.paper.store import TEACHERS  # retrained teachers, beside runs/ (no table reads them)

SAMPLES = 32  # the Dirichlet student is evaluated as this many draws (its row's member count)
OBJECTIVES = {"mean": 1, "dirichlet": SAMPLES}


def teacher_state(root: Path, teacher: Path) -> Path | None:
    """Where the teacher's trained state is: its checkpoint, its adapter, or its retrained copy's checkpoint."""
    retrained = root / TEACHERS / teacher.relative_to(root / "runs")
    for source, marker in (
        (teacher, "checkpoints/final.ckpt"),
        (teacher / "adapter", "adapter_config.json"),
        (retrained, "checkpoints/final.ckpt"),
    ):
        if (source / marker).is_file():
            return source
    return None


def recorded_overrides(results: dict) -> list[str]:
    """The Hydra overrides of the command a run's results.json records, less where it wrote (``hydra.run.dir``)."""
    import shlex

    words = shlex.split(results["command"])
    return [w for w in words[1:] if "=" in w and not w.startswith("hydra.run.dir=")]


def differing_metrics(committed: dict, retrained: dict) -> dict:
    """The test metrics whose values differ, ``{key: [committed, retrained]}`` (timings left out)."""
    keys = sorted(k for k in committed if k.startswith("test/") and not k.endswith("seconds"))
    return {k: [committed[k], retrained.get(k)] for k in keys if committed[k] != retrained.get(k)}


def retrain_teacher(root: Path, teacher: Path) -> Path:
    """The finished ``teacher`` trained again, with the overrides its results.json records, into
    ``root/teachers/...`` (its checkpoint kept); prints and records whether its test metrics are the
    committed run's to the last digit. Returns the retrained directory."""
    import json
    import subprocess
    import sys

    committed = json.loads((teacher / "results.json").read_text())
    out = root / TEACHERS / teacher.relative_to(root / "runs")
    out.mkdir(parents=True, exist_ok=True)
    # The recorded command keeps checkpoints (callbacks=default), so the run writes checkpoints/final.ckpt.
    # skip_finished=false: a committed copy brings its results.json but not its checkpoint, and only the
    # checkpoint is missing here, so a finished copy must train again, not be skipped.
    command = [
        sys.executable,
        "-m",
        "sve.cli.train",
        *recorded_overrides(committed),
        f"hydra.run.dir={out}",
        "skip_finished=false",
    ]
    with (out / "train.log").open("a") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"retraining {teacher} failed (exit {done.returncode}); see {out / 'train.log'}")
    from sve.runs.results import relative_difference

    retrained = json.loads((out / "results.json").read_text())
    differ = differing_metrics(committed["metrics"], retrained["metrics"])
    largest = max((relative_difference(*pair) for pair in differ.values()), default=0.0)
    # Digits agree only on the same kernels: the numerics records say whether the machines' differ.
    record = {
        "teacher": str(teacher),
        "differ": differ,
        "numerics": {"committed": committed.get("numerics"), "retrained": retrained.get("numerics")},
    }
    (out / "reproduced.json").write_text(json.dumps(record, indent=1) + "\n")
    print(
        f"  retrained {teacher}: "
        + (
            "its test metrics are the committed run's to the last digit"
            if not differ
            else f"differs from the committed run in {', '.join(differ)} by at most {largest:.1e} relative (e.g. "
            f"{next(iter(differ.items()))})"
        )
    )
    return out


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
        raise InputError(
            f"--experiments {' '.join(unknown)}: not in the mini distillation table; choose from "
            f"{', '.join(spec.experiments)}"
        )
    teacher_method, teacher_members = parse_row(spec.get("teacher", "sve:4"))
    todo, missing = [], []
    for experiment in experiments or spec.experiments:
        for seed in spec.seeds:
            teacher = run_dir(root, experiment, teacher_method, teacher_members, int(seed))
            source = teacher_state(root, teacher)
            for objective, members in OBJECTIVES.items():
                student = run_dir(root, experiment, f"distilled_{objective}", members, int(seed))
                if (student / "results.json").exists():
                    continue
                if source is None:
                    missing.append(teacher)
                    break
                todo.append((source, objective, student))
    return todo, sorted(set(missing))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results/mini"))
    parser.add_argument("--dry-run", action="store_true", help="list the students to distill, distill none")
    parser.add_argument(
        "--experiments",
        nargs="+",
        metavar="NAME",
        help="only these experiments of the table (e.g. to run two at once, one each)",
    )
    parser.add_argument(
        "--retrain-teachers",
        action="store_true",
        help="train a finished teacher whose trained state was left behind again, into teachers/ "
        "of the store, from the command its results.json records",
    )
    args = parser.parse_args(argv)
    from sve.errors import one_line_errors
    from sve.paper.store import load_spec

    with one_line_errors():
        spec = load_spec("mini_distill")
        todo, missing = plan(args.results, spec, args.experiments)
        finished = [t for t in missing if (t / "results.json").exists()]
        if args.retrain_teachers and finished and not args.dry_run:
            for i, teacher in enumerate(finished, 1):
                print(f"[teacher {i}/{len(finished)}] training {teacher} again", flush=True)
                retrain_teacher(args.results, teacher)
            todo, missing = plan(args.results, spec, args.experiments)
        for teacher in missing:
            if not (teacher / "results.json").exists():
                print(f"skipped teacher {teacher}: not trained yet (make mini trains it)")
                continue
            if args.retrain_teachers:  # a dry run: what the real one would do first
                print(f"would train teacher {teacher} again (its trained state was left behind), then distill it")
                continue
            print(
                f"skipped teacher {teacher}: its trained state is in neither checkpoints/final.ckpt nor adapter/ "
                "(a committed run, or a copy of a tuning run, keeps no checkpoint); --retrain-teachers trains it "
                "again from its recorded command"
            )
        for i, (source, objective, student) in enumerate(todo, 1):
            print(f"[{i}/{len(todo)}] {objective} student of {source} -> {student}", flush=True)
            if not args.dry_run:
                from sve.cli.distill import distill

                experiment = student.relative_to(args.results / "runs").parts[0]
                distill(
                    [
                        f"run_dir={source}",
                        f"objective={objective}",
                        f"samples={SAMPLES}",
                        f"out={student}",
                        *student_lr(args.results, experiment),
                    ]
                )
        if not args.dry_run:
            from sve.paper.build import build

            for path in build("mini_distill", root=args.results):
                print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
