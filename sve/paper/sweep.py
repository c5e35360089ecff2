"""The sweep driver: trains (or resumes) exactly the runs a table needs, then builds the table.

``sve-sweep table1 [--smoke] [--dry-run]`` (``make table1 [SMOKE=1]``; the command line: ``sve.cli.sweep``).

Every (experiment, row, seed) of ``configs/tables/<name>.yaml`` is one run in its stable directory
``<root>/runs/<experiment>/<method>_m<members>/seed<seed>`` (``sve.paper.store.run_dir``), so a rerun finds it:
a run whose ``results.json`` exists is skipped, and tables sharing an experiment share its runs (Table 4
reuses Table 1's CIFAR-100 runs). Full runs go through ``train.py`` in a subprocess (``hydra.run.dir`` set to
that directory, output in ``train.log`` there); smoke runs compose the same config in this process and call
``sve.runs.run.run``, which is much faster for tiny models. A failing run does not stop the sweep: it leaves
``failed.json`` in its directory (``sve.runs.multirun.record_failure``, the record train.py's multirun writes too),
failures are summarised at the end and the exit status is 1. A run whose recorded member count differs from
its row's counts as failed, since its cell would stay empty; so does a run whose results.json is not valid
JSON (cut short by a full disk, say): it is never taken as done, and the message names the file to delete to
run it again. A store that is a file or not writable is refused before any run (``sve.runs.writable``).

Sweeps may share a result store. A run whose directory is held by a live run (``sve.runs.rundir.holder``: another
sweep, or a ``train.py`` started by hand) is left to that process: the sweep trains everything else, then
waits for it and reads its results, without writing into its directory. Two processes started on the same
table thus split its runs between them. A run whose holder has died is trained here, from its checkpoint.

A table may tune one hyper-parameter per row on the validation split (``tune:`` in its definition, e.g. the
learning rate): each grid value is one run at the tuning seed, in ``<row dir>/tune/<key>_<value>/``; while
the best value is on the grid's edge, the grid grows by the next value of its log ladder beyond it
(``sve.paper.tuning``: bounded, and a choice still on an edge is recorded as such). The value with the best
validation metric (results.json ``metrics``' ``val/`` keys; never a test metric) is written, with the whole
searched grid, to ``<row dir>/tuned.json`` and used for every seed. The tuning run of the chosen value *is* that
seed's run
(same config, same seed), so it is copied to its seed directory rather than trained twice. A row with
``tune_as: method:members`` takes the choice of that row of the same experiment instead of a grid of its own
(``tune_as: experiment/method:members``: of a row of another experiment, which must have been tuned already,
e.g. BERT-size rows at the learning rates tuned for the small model)
(SVE at M = 1, 2, 4 sharing the learning rate tuned for SVF, as the paper's recipe shares it); the choice is
copied into its own ``tuned.json`` with a ``from`` key. A row's own ``tune:`` block replaces the table's for that
row. A row with ``fix_tuned: method:members`` keeps that row's tuned value (of whatever key its own table tuned)
fixed in every run, tuning runs included, while this row tunes its own key: a hybrid's singular-value rate tuned
at the adapter rate its plain row chose. A row with ``knob: {key, grid}`` also tunes its method's own diversity knob
(SVE's sigma_init, LoRA-Ensemble's init scale) at its chosen rate, on that fixed grid (``sve.paper.sweep_tuning``,
``tune_knob``); the choice is recorded under ``knob`` in its tuned.json.
"""

from __future__ import annotations

import subprocess
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from sve.errors import InputError
from sve.paper.sittings import record_run
from sve.paper.store import TUNED, first_report, load_spec, parse_row, results_root, run_dir
from sve.paper.sweep_jobs import Job, jobs
from sve.paper.sweep_runs import (
    HELD,
    check_same_overrides,
    holder_in_words,
    measure_costs,
    record_overrides,
    recorded_members,
    reuse_tuning_run,
    run_in_process,
    run_subprocess,
)
from sve.paper.sweep_tuning import (
    before_seed,
    borrowed_choice,
    borrowed_from,
    fixed_choice,
    smoke_skips_tuning,
    tune_knob,
    tune_row,
)
from sve.runs.multirun import clear_failure, record_failure
from sve.runs.results import UnreadableFile, read_results, write_json
from sve.runs.rundir import DirectoryInUse, claim, holder
from sve.runs.writable import check_writable, write_error

POLL_SECONDS = 30  # how often a sweep looks whether a run held by another process has finished


class Sweep:
    """One sweep over a result store: trains (or finds) the runs of tables in order, tuning first where a table
    tunes (``run``). Runs that another process is training, and rows whose tuning runs it is training, are
    taken up after every table's other runs, in passes over what is left: a sweep waits only when everything
    left is another process's. Each run trained is recorded in ``<root>/sittings.jsonl`` (``record_run``)."""

    def __init__(
        self,
        root: Path,
        smoke: bool = False,
        dry_run: bool = False,
        extra: list[str] = (),
        measure: bool = False,
        rows: list[str] = (),
    ):
        self.root, self.smoke, self.dry_run = root, smoke, dry_run
        self.extra, self.measure, self.rows = list(extra), measure, list(rows)
        self.failures: list[str] = []  # one line per failure, the sweep's result
        self.chosen: dict[Path, dict | None] = {}  # row directory -> tuned.json content (None: the row cannot run)
        self.later: list[tuple[object, Job, str, dict]] = []  # (spec, job, prefix, first jobs) left to another process
        self.left: set[Path] = set()  # run directories found held by another process
        self.pending: set[Path] = set()  # rows whose tuning another process was training when the sweep reached them
        self.knobs: dict[Path, dict | None] = {}  # row directory -> its knob's choice (tuned.json "knob")

    def attempt(self, spec, job: Job, prefix: str) -> dict | None:
        """The run's results (trained now, or found); None when it failed; ``HELD`` when another process is
        training it (the caller comes back to it later)."""
        done = job.dir / "results.json"
        if self.dry_run:
            try:
                results = read_results(done) if done.exists() else None
            except UnreadableFile as err:
                print(f"{prefix}: UNREADABLE: {err}")
                first_report(err.path)
                return None
            print(f"{prefix}: {'done' if done.exists() else 'sve-train ' + ' '.join(job.overrides)}")
            return results
        start = time.perf_counter()
        try:
            with ExitStack() as held:
                if not done.exists():  # claim the directory, so that no other sweep starts this run too
                    try:
                        held.enter_context(claim(job.dir))
                    except DirectoryInUse:
                        if job.dir not in self.left:
                            print(
                                f"{prefix}: being trained by another process ({holder_in_words(holder(job.dir))}); "
                                "back to it later",
                                flush=True,
                            )
                        self.left.add(job.dir)
                        return HELD
                if done.exists():  # found, or finished by the process that held it (one that died left none)
                    results = read_results(done)  # not valid JSON: failed, saying to delete it (never "done")
                    check_same_overrides(job)  # never another configuration's run reported as this one
                    status = "finished by another process" if job.dir in self.left else "done earlier"
                else:
                    record_overrides(job)
                    began = time.time()
                    results = (run_in_process if self.smoke else run_subprocess)(job)
                    status = f"trained in {time.perf_counter() - start:.1f} s"
                    record_run(self.root, job, began)
                    clear_failure(job.dir)  # an earlier attempt's failure, now superseded
            members = recorded_members(results, done)
            if members != job.members:
                raise RuntimeError(f"recorded {members} members, the table expects {job.members}")
            shown = results["metrics"].get(f"val/{spec.tune.metric}") if job.tuning else None
            acc = results["metrics"].get("test/acc")
            collapsed = results["metrics"].get("test/collapsed_members")  # absent in runs evaluated before it
            print(
                f"{prefix}: {status}, "
                + (
                    f"val {spec.tune.metric} {shown:.4f}"
                    if shown is not None
                    else f"acc {acc:.3f}"
                    if acc is not None
                    else "no test/acc"
                )
                + (f" (collapsed: member(s) {collapsed} answer the same for every input)" if collapsed else ""),
                flush=True,
            )
            return results
        except Exception as err:  # noqa: BLE001 - one failing run must not stop the sweep
            if isinstance(err, OSError) and err.filename:  # a full disk or a read-only directory, in words
                err = write_error(Path(err.filename), err) or err
            if isinstance(err, UnreadableFile):
                first_report(err.path)  # the tables built after the sweep do not report it again
            print(f"{prefix}: FAILED: {err}", flush=True)
            record_failure(job.dir, err)  # failed.json, as train.py's multirun writes it
            self.failures.append(f"{job} ({job.dir}): {err}")
            return None

    def process(self, spec, job: Job, prefix: str, first_jobs: dict) -> object:
        """Tunes the job's row if it must be, then runs the job; ``HELD`` when either is another process's now."""
        if job.tune is not None:  # the row tunes a key of its own: the table, as this row sees it
            spec = spec.copy()
            spec.tune = job.tune
        if job.fix_tuned:
            fixed = fixed_choice(self.root, job, self.dry_run, self.failures)
            if fixed is None:
                return None
            job = replace(job, overrides=before_seed(job.overrides, f"{fixed['key']}={fixed['value']}"))
        if spec.get("tune") and not smoke_skips_tuning(spec, self.smoke):
            row_dir = job.dir.parent
            if job.tune_from:  # another experiment's row: its choice is read, never made here
                source, source_dir = None, run_dir(self.root, job.tune_from, *job.tune_as, 0).parent
                if source_dir not in self.chosen:
                    self.chosen[source_dir] = borrowed_choice(spec, source_dir, self.dry_run, self.failures)
            else:
                source = borrowed_from(job, first_jobs) if job.tune_as else job
                source_dir = source.dir.parent
            own_row = source is job
            if own_row and job.knob is not None:  # its rate is tuned at the knob's first value, named
                source = replace(job, overrides=before_seed(job.overrides, f"{job.knob.key}={job.knob.grid[0]}"))
            if source_dir not in self.chosen:
                if source_dir in self.pending:
                    return HELD  # tried at the row's first job of this pass
                choice = tune_row(spec, source, source_dir, self.attempt, self.dry_run, self.failures)
                if choice is HELD:
                    self.pending.add(source_dir)
                    return HELD
                self.chosen[source_dir] = choice
            choice = self.chosen[source_dir]
            if choice is not None and not own_row and not self.dry_run and not (row_dir / TUNED).exists():
                origin = f"{job.tune_from}/{source_dir.name}" if job.tune_from else source_dir.name
                rate_only = {k: v for k, v in choice.items() if k != "knob"}  # the source's knob is its own
                own = {**rate_only, "from": origin, "note": f"the choice of {origin}, not tuned here"}
                write_json(row_dir / TUNED, own)
            if choice is None:
                if not self.dry_run:
                    self.failures.append(f"{job}: not run, its row has no tuned {spec.tune.key}")
                return None
            chosen_run = row_dir / "tune" / f"{choice['key']}_{choice['value']}"
            if job.knob is not None:
                return self.with_knob(
                    spec, job, f"{choice['key']}={choice['value']}", chosen_run if own_row else None, prefix
                )
            job = replace(job, overrides=before_seed(job.overrides, f"{choice['key']}={choice['value']}"))
            own_seed = source is not None and source.dir == job.dir and job.seed == int(spec.tune.seed)
            self.reuse(chosen_run, job, own_seed)
        return self.attempt(spec, job, prefix)

    def with_knob(self, spec, job: Job, rate: str, rate_run: Path | None, prefix: str) -> object:
        """Tunes the row's diversity knob at its chosen ``rate`` (``sve.paper.sweep_tuning.tune_knob``), then runs
        the job with both; the chosen knob run is the tuning seed's run, copied rather than trained twice."""
        row_dir = job.dir.parent
        if row_dir not in self.knobs:
            knob = tune_knob(spec, job, rate, rate_run, self.attempt, self.dry_run, self.failures)
            if knob is HELD:
                return HELD
            self.knobs[row_dir] = knob
        knob = self.knobs[row_dir]
        if knob is None:
            if not self.dry_run:
                self.failures.append(f"{job}: not run, its row has no tuned {job.knob.key}")
            return None
        job = replace(job, overrides=before_seed(job.overrides, f"{knob['key']}={knob['value']}", rate))
        self.reuse(
            job.dir.parent / "tune" / f"{knob['key']}_{knob['value']}", job, own_seed=job.seed == int(spec.tune.seed)
        )
        return self.attempt(spec, job, prefix)

    def reuse(self, chosen_run: Path, job: Job, own_seed: bool) -> None:
        """The chosen tuning run *is* the tuning seed's run: copied into ``job``'s directory, not trained again."""
        if (
            own_seed
            and not self.dry_run
            and not (job.dir / "results.json").exists()
            and (chosen_run / "results.json").exists()
            and holder(job.dir) is None
        ):
            reuse_tuning_run(chosen_run, job.dir)

    def run(self, names: list[str]) -> list[str]:
        """Every table in ``names`` in turn, then what was left to other processes; returns the failures."""
        for name in names:
            self.table(name, prefix_name=len(names) > 1)
        # Another pass over what was left, and another, until nothing is: a sweep sleeps only when every run
        # that is left is another process's, so two sweeps never wait for each other while work remains.
        while self.later:
            self.pending.clear()  # rows whose tuning was held: try them again
            still = [item for item in self.later if self.process(*item) is HELD]
            if len(still) == len(self.later):
                time.sleep(POLL_SECONDS)
            self.later = still
        return self.failures

    def table(self, name: str, prefix_name: bool) -> None:
        spec = load_spec(name, self.smoke)
        todo = jobs(spec, self.root, self.smoke, self.extra) if spec.kind != "cost" else []
        first_jobs = {}  # (experiment, method, members) -> the row's first job (its tuning runs derive from it)
        for job in todo:
            first_jobs.setdefault((job.experiment, job.method, job.members), job)
        if self.rows:
            known = sorted({f"{m}:{k}" for _, m, k in first_jobs})
            wanted = {parse_row(r) for r in self.rows}
            unknown = sorted(f"{m}:{k}" for m, k in wanted if f"{m}:{k}" not in known)
            if unknown:
                raise InputError(f"--rows {unknown} not in {name}; choose from {known}")
            todo = [job for job in todo if (job.method, job.members) in wanted]
        if spec.get("written_by"):
            print(
                f"{name}: its runs are written by {spec.written_by}, not by the sweep; the table is built from "
                "what exists"
            )
        if spec.kind == "cost":
            bench = self.root / spec.bench
            print(f"{name}: measured, not trained ({bench})")
            if not self.dry_run and (self.measure or not bench.exists()):
                try:
                    measure_costs(bench, self.smoke)
                except subprocess.CalledProcessError as err:
                    self.failures.append(f"the cost benchmark failed ({err})")
        width = len(str(len(todo)))
        for i, job in enumerate(todo, 1):
            prefix = f"[{i:>{width}}/{len(todo)}]{f' {name}' if prefix_name else ''} {job}"
            if self.process(spec, job, prefix, first_jobs) is HELD:
                self.later.append((spec, job, prefix, first_jobs))


def sweep(
    names: str | list[str],
    smoke: bool = False,
    root: Path | None = None,
    dry_run: bool = False,
    extra: list[str] = (),
    measure: bool = False,
    rows: list[str] = (),
) -> list[str]:
    """Runs the missing runs of each table in ``names``, in order (``Sweep``); returns one line per failure.
    A cost table is measured instead, when its benchmark file is missing or ``measure`` asks for a new one.
    ``rows`` (``method:members``, one table only) limits the sweep to those rows, e.g. to redo one row beside
    a running sweep of the others."""
    names = [names] if isinstance(names, str) else list(names)
    if rows and len(names) > 1:
        raise InputError(f"--rows limits one table; got {len(names)}: {names}")
    root = results_root(smoke, root)
    if root.exists() and not root.is_dir():
        raise InputError(f"--results: the result store {root} is a file, not a directory; name a directory")
    if not dry_run:  # every run, tuned.json and table is written under it: a read-only store fails here, once
        check_writable(root, "the result store", hint="--results <a writable directory>")
    return Sweep(root, smoke, dry_run, extra, measure, rows).run(names)


def build(name: str, smoke: bool = False, root: Path | None = None) -> list[Path]:
    """The table builder (``sve.paper.build.build``), imported only when a sweep has finished: the sweep
    itself depends on the store, not on the tables."""
    from sve.paper.build import build as build_table

    return build_table(name, smoke, root)
