"""The store's sittings (``sittings.jsonl``): each run a sweep trained, its start and end, and their wall time."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from sve.errors import InputError
from sve.paper.sweep_jobs import Job
from sve.runs.results import UnreadableFile, git_commit, read_json
from sve.runs.writable import write_error

SITTINGS = "sittings.jsonl"  # one line per run a sweep trained, written when it ends: the store's wall time


def record_run(root: Path, job: Job, started: float) -> None:
    """Appends the run's start and end (and who trained it) to ``<root>/sittings.jsonl`` as soon as it ends,
    so a sweep killed later keeps the record of what it finished. The commit is the one the run's results.json
    names: the clone may have moved on while a long run trained with the code it started with."""
    try:
        commit = read_json(job.dir / "results.json", "").get("git_commit")
    except UnreadableFile:  # a failed run has none; the clone's commit is the best record left
        commit = None
    run = str(job.dir.relative_to(root)) if job.dir.is_relative_to(root) else str(job.dir)
    line = {
        "run": run,
        "started": started,
        "finished": time.time(),
        "pid": os.getpid(),
        "commit": commit or git_commit(),
    }
    try:
        with (root / SITTINGS).open("a") as f:
            f.write(json.dumps(line) + "\n")
    except OSError as err:  # the run itself finished: its results stand, only the wall-time record lacks it
        reason = write_error(root / SITTINGS, err) or err
        print(f"warning: the sitting of {job} was not recorded: {reason}", flush=True)


def recorded_runs(root: Path) -> list[dict]:
    """The lines of ``<root>/sittings.jsonl`` (none when it does not exist)."""
    path = Path(root) / SITTINGS
    if not path.exists():
        return []
    records = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            float(record["started"]), float(record["finished"])
        except (ValueError, KeyError, TypeError) as err:
            raise InputError(
                f"{path}:{number} is not a record of a sitting ({type(err).__name__}: {err}; expected "
                'one JSON object a line with "started" and "finished" times): delete or repair that '
                "line (a sweep killed while appending it leaves such a line; the store's wall time "
                "then lacks that one run)"
            ) from None
        records.append(record)
    return records


def wall_seconds(records: list[dict]) -> float | None:
    """The time during which at least one recorded run was training: runs overlapping in time (two workers)
    count once; None without records."""
    if not records:
        return None
    total, end = 0.0, float("-inf")
    for start, finish in sorted((r["started"], r["finished"]) for r in records):
        total += max(0.0, finish - max(start, end))
        end = max(end, finish)
    return total
