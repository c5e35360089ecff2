"""``sve-sweep --plan``: the memory plan of every row of a table, each planned in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys

from sve.methods import registry
from sve.paper.store import load_spec, results_root
from sve.paper.sweep import jobs


def table_runs(name: str, smoke: bool = False, extra: list[str] = ()) -> list[tuple[str, list[str]]]:
    """(label, overrides) of each row of the table ``name``, once per experiment (seeds do not change memory),
    as the sweep expands them (``sve.paper.sweep.jobs``). A cost table (Table 5) has no runs to train; its rows
    are planned at the benchmark's setting: batch 1, one GPU, each method at its row's member count."""
    spec = load_spec(name, smoke)
    if spec.kind == "cost":
        out = []
        for experiment in spec.experiments:
            for row in spec.rows:
                M = int(row.members)
                members = registry.info(row.method).member_overrides(M)  # samples, for a sampled method
                out.append(
                    (
                        f"{name} {experiment} {row.method} M={M}",
                        [
                            f"experiment={experiment}",
                            f"method={row.method}",
                            "trainer=gpu",
                            "dataset.batch_size=1",
                            *members,
                            *extra,
                        ],
                    )
                )
        return out
    seen, out = set(), []
    for job in jobs(spec, results_root(smoke, None), smoke, list(extra)):
        key = (job.experiment, job.method, job.members)
        if key not in seen:
            seen.add(key)
            out.append((f"{name} {job.experiment} {job.method} M={job.members}", job.overrides))
    return out


def plan_tables(names: list[str], smoke: bool = False, extra: list[str] = ()) -> list[str]:
    """Prints one plan line per row of each table (training and evaluation peaks per device, and whether they
    fit); returns one line per row that could not be planned.

    Each row is planned in a process of its own (``python -m sve.cli.plan``): fake tensors in torch 2.14 now
    and then corrupt the heap of a process that builds many models (a segmentation fault after a few dozen
    builds), so a row never inherits another's state, and one whose process dies of a signal is tried once
    more."""
    failures = []
    for name in names:
        for label, overrides in table_runs(name, smoke, extra):
            for _ in (1, 2):  # a second try only after a signal (the docstring)
                out = subprocess.run(
                    [sys.executable, "-m", "sve.cli.plan", json.dumps(overrides)], capture_output=True, text=True
                )
                if out.returncode >= 0:
                    break
            lines = out.stdout.strip().splitlines()
            if out.returncode == 0 and lines:
                print(f"{label}: {lines[-1]}", flush=True)
                continue
            reason = (lines or out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
            failures.append(f"{label}: {reason}")
            print(f"{label}: NOT PLANNED: {reason}", flush=True)
    return failures
