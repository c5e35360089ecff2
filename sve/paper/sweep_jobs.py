"""A table's runs as a sweep's jobs: one per run directory, with the overrides it trains with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sve.paper.store import parse_row, run_dir

# Every smoke run: a few batches on the CPU, no checkpoints, no logger files, and the whole of the synthetic
# data (an experiment's subset sizes are for its real data; larger than the data they are refused).
SMOKE_OVERRIDES = [
    "trainer=debug",
    "callbacks=none",
    "~logger",
    "++dataset.train_size=null",
    "++dataset.val_size=null",
    "++dataset.test_size=null",
]


@dataclass
class Job:
    experiment: str
    method: str
    members: int
    seed: int
    overrides: list[str]
    dir: Path
    tuning: str | None = None  # "key=value" of a tuning run
    tune_as: tuple[str, int] | None = None  # (method, members) of the row whose tuned value this row takes
    tune_from: str | None = None  # the experiment of that row, when it is another one
    fix_tuned: tuple[str, int] | None = None  # (method, members) of the row whose tuned value this row keeps fixed
    tune: object = None  # the row's own ``tune:`` block (DictConfig), replacing the table's for this row
    knob: object = None  # the row's ``knob:`` block {key, grid}: its method's diversity knob, tuned at its rate

    def __str__(self) -> str:
        return f"{self.experiment} {self.method} M={self.members} seed {self.seed}" + (
            f" ({self.tuning}, tuning)" if self.tuning else ""
        )


def jobs(spec, root: Path, smoke: bool, extra: list[str] = ()) -> list[Job]:
    """The table's grid in order, one job per run directory; ``extra`` overrides go to every run (data roots).
    None for a table whose runs another entry point writes (``written_by``: the distillation table's students,
    beside teachers that other tables train): the sweep only builds it."""
    if spec.get("written_by") or spec.kind == "conformal":  # a conformal table reads other tables' runs
        return []
    out: dict[Path, Job] = {}
    for experiment in spec.experiments:
        for row in spec.rows:
            for seed in spec.seeds:
                directory = run_dir(root, experiment, row.method, int(row.members), seed)
                overrides = [
                    f"experiment={experiment}",
                    f"method={row.method}",
                    *(SMOKE_OVERRIDES if smoke else []),
                    *spec.get("overrides", []),
                    *row.get("overrides", []),
                    *extra,
                    f"seed={seed}",
                ]
                tune_from, _, source_row = str(row.get("tune_as") or "").rpartition("/")
                tune_as = parse_row(source_row) if source_row else None
                fix_tuned = parse_row(str(row.fix_tuned)) if row.get("fix_tuned") else None
                out.setdefault(
                    directory,
                    Job(
                        experiment,
                        row.method,
                        int(row.members),
                        seed,
                        overrides,
                        directory,
                        tune_as=tune_as,
                        tune_from=tune_from or None,
                        fix_tuned=fix_tuned,
                        tune=row.get("tune"),
                        knob=row.get("knob"),
                    ),
                )
    return list(out.values())
