"""The sweep driver: trains (or resumes) exactly the runs a table needs, then builds the table.

``sve-sweep table1 [--smoke] [--dry-run]`` (``make table1 [SMOKE=1]``; the command line: ``sve.cli.sweep``).

Every (experiment, row, seed) of ``configs/tables/<name>.yaml`` is one run in its stable directory
``<root>/runs/<experiment>/<method>_m<members>/seed<seed>`` (``sve.paper.report.run_dir``), so a rerun finds it:
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
at the adapter rate its plain row chose.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack, redirect_stderr, redirect_stdout
from dataclasses import dataclass, replace
from pathlib import Path

from sve.errors import InputError
from sve.paper.registry import METRICS
from sve.paper.store import (
    TUNED,
    first_report,
    load_spec,
    members_of,
    parse_row,
    results_root,
    run_dir,
)
from sve.paper.tuning import choice as tuning_choice
from sve.paper.tuning import next_value, settings
from sve.paths import CONFIGS
from sve.runs.multirun import clear_failure, record_failure
from sve.runs.results import UnreadableFile, git_commit, read_json, read_results, rerun_hint, write_json
from sve.runs.rundir import HELD_LOCK, LOCK, DirectoryInUse, claim, holder
from sve.runs.writable import check_writable, write_error

POLL_SECONDS = 30  # how often a sweep looks whether a run held by another process has finished
HELD = object()  # what ``attempt`` returns for a run another process is training now

# Every smoke run: a few batches on the CPU, no checkpoints, no logger files, and the whole of the synthetic
# data (an experiment's subset sizes are for its real data; larger than the data they are refused).
SMOKE_OVERRIDES = ["trainer=debug", "callbacks=none", "~logger", "++dataset.train_size=null",
                   "++dataset.val_size=null", "++dataset.test_size=null"]


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

    def __str__(self) -> str:
        return f"{self.experiment} {self.method} M={self.members} seed {self.seed}" + (
            f" ({self.tuning}, tuning)" if self.tuning else "")


def jobs(spec, root: Path, smoke: bool, extra: list[str] = ()) -> list[Job]:
    """The table's grid in order, one job per run directory; ``extra`` overrides go to every run (data roots).
    None for a table whose runs another entry point writes (``written_by``: the distillation table's students,
    beside teachers that other tables train): the sweep only builds it."""
    if spec.get("written_by"):
        return []
    out: dict[Path, Job] = {}
    for experiment in spec.experiments:
        for row in spec.rows:
            for seed in spec.seeds:
                directory = run_dir(root, experiment, row.method, int(row.members), seed)
                overrides = [f"experiment={experiment}", f"method={row.method}",
                             *(SMOKE_OVERRIDES if smoke else []), *spec.get("overrides", []),
                             *row.get("overrides", []), *extra, f"seed={seed}"]  # fmt: skip
                tune_from, _, source_row = str(row.get("tune_as") or "").rpartition("/")
                tune_as = parse_row(source_row) if source_row else None
                fix_tuned = parse_row(str(row.fix_tuned)) if row.get("fix_tuned") else None
                out.setdefault(directory, Job(experiment, row.method, int(row.members), seed, overrides, directory,
                                              tune_as=tune_as, tune_from=tune_from or None,
                                              fix_tuned=fix_tuned, tune=row.get("tune")))  # fmt: skip
    return list(out.values())


# --- tuning on the validation split ------------------------------------------------------------------------


def tuning_jobs(spec, job: Job, values: list) -> list[Job]:
    """One run per grid value at the tuning seed, for the row of ``job``."""
    tune = spec.tune
    row_dir = job.dir.parent
    return [Job(job.experiment, job.method, job.members, int(tune.seed), [*job.overrides[:-1], f"{tune.key}={value}",
                f"seed={tune.seed}"], row_dir / "tune" / f"{tune.key}_{value}", tuning=f"{tune.key}={value}")
            for value in values]  # fmt: skip


def grid_scores(spec, tuned: list[tuple[Job, dict | None]], values: list, row_dir: Path) -> dict:
    """Each grid value's validation metric (``tuned``: each grid run and its results or None); a
    ``RuntimeError`` naming the values whose runs have not finished, since a choice from part of the grid
    would be a different experiment."""
    tune = spec.tune
    scores = {}
    for value, (_, results) in zip(values, tuned):
        score = (results or {}).get("metrics", {}).get(f"val/{tune.metric}")
        if score is not None:
            scores[value] = float(score)
    missing = [str(v) for v in values if v not in scores]
    if missing:
        raise RuntimeError(f"{row_dir}: not tuned yet: the tuning runs for {tune.key} = {missing} have not "
                           f"finished with a validation {tune.metric} (of the grid {[str(v) for v in values]})")
    return scores


def read_tuned(spec, path: Path) -> dict:
    """A row's ``tuned.json``; ``UnreadableFile`` when it is not valid JSON, or not a choice of the table's
    ``tune`` key over a grid holding its starting grid (a choice made for another definition), saying to
    delete it to tune again."""
    fix = f"delete it to choose again (the row's tuning runs under {path.parent / 'tune'} are kept and reused)"
    choice = read_json(path, fix)
    if "key" not in choice or "value" not in choice:
        raise UnreadableFile(f"{path} is not a tuned choice (no \"key\" and \"value\"); {fix}", path)
    start = [str(v) for v in settings(spec.tune)[0]]
    searched = [str(v) for v in choice.get("grid", [])]
    if choice["key"] != spec.tune.key or str(choice["value"]) not in searched or not set(start) <= set(searched):
        raise UnreadableFile(f"{path} chose {choice['key']}={choice['value']} over {searched}, but the table tunes "
                             f"{spec.tune.key} starting from {start}; {fix}", path)  # fmt: skip
    return choice


SWEPT = "sweep.json"  # the overrides a sweep trains a run directory with


def record_overrides(job: Job) -> None:
    """``<run>/sweep.json``: the overrides this run is trained with, before it starts (a resumed attempt keeps
    it), so a later sweep can tell its own run from another definition's."""
    job.dir.mkdir(parents=True, exist_ok=True)
    write_json(job.dir / SWEPT, {"overrides": list(job.overrides)})


def check_same_overrides(job: Job) -> None:
    """A ``RuntimeError`` when the finished run in ``job.dir`` was trained by a sweep with other overrides (the
    table's definition or the command's overrides changed since): its results are not this job's. A run that
    a sweep did not record (trained by hand, or before sweeps recorded it) is taken as it is."""
    path = job.dir / SWEPT
    if not path.exists():
        return
    recorded = read_results(path).get("overrides")
    if recorded == list(job.overrides):
        return
    recorded = list(recorded or [])
    there = [o for o in recorded if o not in job.overrides]
    here = [o for o in job.overrides if o not in recorded]
    raise RuntimeError(f"{job.dir} holds a run trained with other overrides (only in that run: {there}; only in "
                       f"this sweep: {here}); delete the directory to train it with these, or restore the "
                       "definition it was trained with")  # fmt: skip


def reuse_tuning_run(source: Path, target: Path) -> dict:
    """The chosen grid value's run is the tuning seed's run: copied (checkpoints left out), not retrained."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("checkpoints", ".lock"), dirs_exist_ok=True)
    note = f"copied from {source}: the tuning run with the chosen value is this seed's run\n"
    (target / "REUSED.txt").write_text(note)
    return read_results(target / "results.json")


def recorded_members(results: dict, path: Path) -> int:
    """``members_of(results)``; ``UnreadableFile`` when the results lack what a finished run records (its
    metrics and member count), saying to delete ``path`` to run that run again."""
    try:
        if not isinstance(results.get("metrics"), dict):
            raise KeyError("metrics")
        return members_of(results)
    except (KeyError, TypeError, ValueError) as err:
        raise UnreadableFile(f"{path} lacks what a finished run records ({type(err).__name__}: {err}); "
                             f"{rerun_hint(path)}", path) from None  # fmt: skip


def run_in_process(job: Job) -> dict:
    import torch  # here, not at the top: `sve-sweep --help` and a typo answer without it
    from hydra import compose, initialize_config_dir

    from sve.runs.run import run

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[*job.overrides, f"paths.output_dir={job.dir}"])
    job.dir.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: thread start-up and contention cost more than they save
    os.environ[HELD_LOCK] = str((job.dir / LOCK).resolve())  # the run adopts the lock this sweep holds
    try:
        with open_log(job) as log, redirect_stdout(log), redirect_stderr(log):
            return run(cfg)
    finally:
        torch.set_num_threads(threads)
        os.environ.pop(HELD_LOCK, None)


def open_log(job: Job):
    """train.log of the run, appended to: a resumed run keeps the log of its earlier attempts."""
    log = (job.dir / "train.log").open("a")
    log.write(f"\n===== sweep attempt, {time.strftime('%Y-%m-%d %H:%M:%S')} =====\n")
    log.flush()
    return log


def run_subprocess(job: Job) -> dict:
    job.dir.mkdir(parents=True, exist_ok=True)
    # This interpreter and this installed package (not whichever ``sve-train`` is first on the PATH), in the
    # current directory: relative data paths and the store resolve as they do for the sweep itself.
    command = [sys.executable, "-m", "sve.cli.train", *job.overrides, f"hydra.run.dir={job.dir}"]
    env = {**os.environ, HELD_LOCK: str((job.dir / LOCK).resolve())}  # the run adopts the lock this sweep holds
    with open_log(job) as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        raise RuntimeError(f"sve-train exited with status {code}; see {job.dir / 'train.log'}")
    return read_results(job.dir / "results.json")


def measure_costs(path: Path, smoke: bool) -> None:
    """Runs the cost benchmark's Table 5 part (``sve-bench --parts table5``) into ``path``'s folder:
    minutes on a CPU for BERT-base; ``--tiny`` for a smoke run."""
    command = [sys.executable, "-m", "sve.cli.bench", "--parts", "table5", "--out", str(path.parent),
               *(["--tiny"] if smoke else [])]
    print(f"measuring: {' '.join(command[1:])}", flush=True)
    subprocess.run(command, check=True)


class Sweep:
    """One sweep over a result store: trains (or finds) the runs of tables in order, tuning first where a table
    tunes (``run``). Runs that another process is training, and rows whose tuning runs it is training, are
    taken up after every table's other runs, in passes over what is left: a sweep waits only when everything
    left is another process's. Each run trained is recorded in ``<root>/sittings.jsonl`` (``record_run``)."""

    def __init__(self, root: Path, smoke: bool = False, dry_run: bool = False, extra: list[str] = (),
                 measure: bool = False, rows: list[str] = ()):
        self.root, self.smoke, self.dry_run = root, smoke, dry_run
        self.extra, self.measure, self.rows = list(extra), measure, list(rows)
        self.failures: list[str] = []  # one line per failure, the sweep's result
        self.chosen: dict[Path, dict | None] = {}  # row directory -> tuned.json content (None: the row cannot run)
        self.later: list[tuple[object, Job, str, dict]] = []  # (spec, job, prefix, first jobs) left to another process
        self.left: set[Path] = set()  # run directories found held by another process
        self.pending: set[Path] = set()  # rows whose tuning another process was training when the sweep reached them

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
                            print(f"{prefix}: being trained by another process ({who(holder(job.dir))}); "
                                  "back to it later", flush=True)  # fmt: skip
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
            print(f"{prefix}: {status}, " + (f"val {spec.tune.metric} {shown:.4f}" if shown is not None else
                                             f"acc {acc:.3f}" if acc is not None else "no test/acc")
                  + (f" (collapsed: member(s) {collapsed} answer the same for every input)" if collapsed else ""),
                  flush=True)  # fmt: skip
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
            job = replace(job, overrides=[*job.overrides[:-1], f"{fixed['key']}={fixed['value']}", job.overrides[-1]])
        if spec.get("tune") and not smoke_skips_tuning(spec, self.smoke):
            row_dir = job.dir.parent
            if job.tune_from:  # another experiment's row: its choice is read, never made here
                source, source_dir = None, run_dir(self.root, job.tune_from, *job.tune_as, 0).parent
                if source_dir not in self.chosen:
                    self.chosen[source_dir] = borrowed_choice(spec, source_dir, self.dry_run, self.failures)
            else:
                source = borrowed_from(job, first_jobs) if job.tune_as else job
                source_dir = source.dir.parent
            if source_dir not in self.chosen:
                if source_dir in self.pending:
                    return HELD  # tried at the row's first job of this pass
                choice = tune_row(spec, source, source_dir, self.attempt, self.dry_run, self.failures)
                if choice is HELD:
                    self.pending.add(source_dir)
                    return HELD
                self.chosen[source_dir] = choice
            choice = self.chosen[source_dir]
            if choice is not None and source is not job and not self.dry_run and not (row_dir / TUNED).exists():
                origin = f"{job.tune_from}/{source_dir.name}" if job.tune_from else source_dir.name
                own = {**choice, "from": origin, "note": f"the choice of {origin}, not tuned here"}
                write_json(row_dir / TUNED, own)
            if choice is None:
                if not self.dry_run:
                    self.failures.append(f"{job}: not run, its row has no tuned {spec.tune.key}")
                return None
            job = replace(job, overrides=[*job.overrides[:-1], f"{choice['key']}={choice['value']}", job.overrides[-1]])
            chosen_run = row_dir / "tune" / f"{choice['key']}_{choice['value']}"
            own_seed = source is not None and source.dir == job.dir and job.seed == int(spec.tune.seed)
            if own_seed and not (job.dir / "results.json").exists() \
                    and not self.dry_run and (chosen_run / "results.json").exists() and holder(job.dir) is None:
                reuse_tuning_run(chosen_run, job.dir)
        return self.attempt(spec, job, prefix)


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
            print(f"{name}: its runs are written by {spec.written_by}, not by the sweep; the table is built from "
                  "what exists")
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


def sweep(names: str | list[str], smoke: bool = False, root: Path | None = None, dry_run: bool = False,
          extra: list[str] = (), measure: bool = False, rows: list[str] = ()) -> list[str]:
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


def who(record: dict) -> str:
    """A lock's holder in words."""
    if not record:
        return "starting"
    return f"pid {record.get('pid')} on {record.get('host')}, since {record.get('started')}"


def borrowed_from(job: Job, first_jobs: dict) -> Job:
    """The first job of the row whose tuned value ``job``'s row takes (``tune_as``)."""
    key = (job.experiment, *job.tune_as)
    if key not in first_jobs or first_jobs[key].tune_as:
        rows = sorted(f"{m}:{k}" for (e, m, k), j in first_jobs.items() if e == job.experiment and not j.tune_as)
        raise InputError(f"{job}: tune_as={job.tune_as[0]}:{job.tune_as[1]} names no tuned row of this table; "
                         f"choose one of {rows}")  # fmt: skip
    return first_jobs[key]


def borrowed_choice(spec, source_dir: Path, dry_run: bool, failures: list[str]) -> dict | None:
    """The ``tuned.json`` of another experiment's row (``tune_as: experiment/method:members``); None, with a
    failure naming what to run first, when that row has not been tuned."""
    path = source_dir / TUNED
    if path.exists():
        try:
            return read_tuned(spec, path)
        except UnreadableFile as err:
            failures.append(str(err))
            return None
    if dry_run:
        return {"key": spec.tune.key, "value": f"<the choice in {path}>"}
    failures.append(f"{path} does not exist: its row has not been tuned yet; run the table that tunes it first")
    return None


def fixed_choice(root: Path, job: Job, dry_run: bool, failures: list[str]) -> dict | None:
    """The tuned value that ``job``'s row keeps fixed (``fix_tuned: method:members``): the ``tuned.json`` of that
    row of the same experiment, whichever key its own table tuned (a hybrid's adapter rate, say, while this
    table tunes the singular values' rate). None, with a failure naming what to run first, when it is not tuned."""
    path = run_dir(root, job.experiment, *job.fix_tuned, 0).parent / TUNED
    if path.exists():
        fix = f"delete it to tune {job.fix_tuned[0]}:{job.fix_tuned[1]} again ({job} keeps its choice fixed)"
        try:
            choice = read_json(path, fix)
        except UnreadableFile as err:
            failures.append(str(err))
            return None
        if "key" in choice and "value" in choice:
            return choice
        failures.append(f"{path} is not a tuned choice (no \"key\" and \"value\"); {fix}")
        return None
    if dry_run:
        return {"key": "<its tuned key>", "value": f"<the choice in {path}>"}
    failures.append(f"{job}: not run, it keeps the tuned value of {job.fix_tuned[0]}:{job.fix_tuned[1]} fixed, "
                    f"and {path} does not exist: run the table that tunes that row first")
    return None


def smoke_skips_tuning(spec, smoke: bool) -> bool:
    return smoke and not (spec.get("smoke") or {}).get("tune")


def tune_row(spec, job: Job, row_dir: Path, attempt, dry_run: bool, failures: list[str]) -> dict | None:
    """Runs (or finds) the row's grid, growing it while its best value is on an edge (``sve.paper.tuning``), and
    returns the choice; None when it cannot be made; ``HELD`` when another process is training one of its grid
    runs (the choice, and whether the grid grows, need every value's score)."""
    def found() -> dict | None:
        try:
            return read_tuned(spec, row_dir / TUNED)
        except UnreadableFile as err:  # the row cannot run until it is deleted: said once, the sweep goes on
            print(f"  {job.experiment} {job.method} M={job.members}: FAILED: {err}", flush=True)
            failures.append(str(err))
            return None

    if (row_dir / TUNED).exists():
        return found()
    metric = METRICS[spec.tune.metric]
    values = settings(spec.tune)[0]
    tuned: list[tuple[Job, dict | None]] = []  # the grid's runs so far, each attempted once
    while True:
        tuned += [(g, attempt(spec, g, f"  tune {g}")) for g in tuning_jobs(spec, job, values[len(tuned):])]
        if any(r is HELD for _, r in tuned):
            return HELD
        if (row_dir / TUNED).exists():  # written by the process that finished the last grid run
            return found()
        if dry_run:
            return {"key": spec.tune.key, "value": "<best on validation; the grid grows while it is on an edge>"}
        try:
            scores = grid_scores(spec, tuned, values, row_dir)
        except RuntimeError as err:
            failures.append(str(err))
            return None
        following = next_value(spec.tune, scores, metric.higher_is_better)
        if following is None:
            break
        print(f"  {job.experiment} {job.method} M={job.members}: best {spec.tune.key} on the edge of "
              f"{[str(v) for v in sorted(values)]}: trying {following}", flush=True)  # fmt: skip
        values = [*values, following]
    choice = tuning_choice(spec.tune, scores, metric.higher_is_better, str)
    write_json(row_dir / TUNED, choice)
    edge = f", left on the {choice['edge']} edge" if choice["edge"] else ""
    print(f"  {job.experiment} {job.method} M={job.members}: {choice['key']}={choice['value']}{edge} "
          f"(validation {spec.tune.metric}: {choice['scores']})", flush=True)  # fmt: skip
    return choice


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
    line = {"run": run, "started": started, "finished": time.time(), "pid": os.getpid(),
            "commit": commit or git_commit()}  # fmt: skip
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
            raise InputError(f"{path}:{number} is not a record of a sitting ({type(err).__name__}: {err}; expected "
                             'one JSON object a line with "started" and "finished" times): delete or repair that '
                             "line (a sweep killed while appending it leaves such a line; the store's wall time "
                             "then lacks that one run)") from None  # fmt: skip
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
