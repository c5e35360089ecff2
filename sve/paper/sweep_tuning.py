"""How a sweep tunes a row: its grid run at the tuning seed, grown while the best is on an edge, or a choice read."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from sve.errors import InputError
from sve.paper.display import METRICS
from sve.paper.store import TUNED, run_dir
from sve.paper.sweep_jobs import Job
from sve.paper.sweep_runs import HELD, reuse_tuning_run
from sve.paper.tuning import best_of, next_value, settings
from sve.paper.tuning import choice as tuning_choice
from sve.runs.results import UnreadableFile, read_json, write_json
from sve.runs.rundir import holder


def tuning_jobs(spec, job: Job, values: list) -> list[Job]:
    """One run per grid value at the tuning seed, for the row of ``job``."""
    tune = spec.tune
    row_dir = job.dir.parent
    return [
        Job(
            job.experiment,
            job.method,
            job.members,
            int(tune.seed),
            [*job.overrides[:-1], f"{tune.key}={value}", f"seed={tune.seed}"],
            row_dir / "tune" / f"{tune.key}_{value}",
            tuning=f"{tune.key}={value}",
        )
        for value in values
    ]


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
        raise RuntimeError(
            f"{row_dir}: not tuned yet: the tuning runs for {tune.key} = {missing} have not "
            f"finished with a validation {tune.metric} (of the grid {[str(v) for v in values]})"
        )
    return scores


def read_tuned(spec, path: Path) -> dict:
    """A row's ``tuned.json``; ``UnreadableFile`` when it is not valid JSON, or not a choice of the table's
    ``tune`` key over a grid holding its starting grid (a choice made for another definition), saying to
    delete it to tune again."""
    fix = f"delete it to choose again (the row's tuning runs under {path.parent / 'tune'} are kept and reused)"
    choice = read_json(path, fix)
    if "key" not in choice or "value" not in choice:
        raise UnreadableFile(f'{path} is not a tuned choice (no "key" and "value"); {fix}', path)
    start = [str(v) for v in settings(spec.tune)[0]]
    searched = [str(v) for v in choice.get("grid", [])]
    if choice["key"] != spec.tune.key or str(choice["value"]) not in searched or not set(start) <= set(searched):
        raise UnreadableFile(
            f"{path} chose {choice['key']}={choice['value']} over {searched}, but the table tunes "
            f"{spec.tune.key} starting from {start}; {fix}",
            path,
        )
    return choice


def borrowed_from(job: Job, first_jobs: dict) -> Job:
    """The first job of the row whose tuned value ``job``'s row takes (``tune_as``)."""
    key = (job.experiment, *job.tune_as)
    if key not in first_jobs or first_jobs[key].tune_as:
        rows = sorted(f"{m}:{k}" for (e, m, k), j in first_jobs.items() if e == job.experiment and not j.tune_as)
        raise InputError(
            f"{job}: tune_as={job.tune_as[0]}:{job.tune_as[1]} names no tuned row of this table; choose one of {rows}"
        )
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
        failures.append(f'{path} is not a tuned choice (no "key" and "value"); {fix}')
        return None
    if dry_run:
        return {"key": "<its tuned key>", "value": f"<the choice in {path}>"}
    failures.append(
        f"{job}: not run, it keeps the tuned value of {job.fix_tuned[0]}:{job.fix_tuned[1]} fixed, "
        f"and {path} does not exist: run the table that tunes that row first"
    )
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
        tuned += [(g, attempt(spec, g, f"  tune {g}")) for g in tuning_jobs(spec, job, values[len(tuned) :])]
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
        print(
            f"  {job.experiment} {job.method} M={job.members}: best {spec.tune.key} on the edge of "
            f"{[str(v) for v in sorted(values)]}: trying {following}",
            flush=True,
        )
        values = [*values, following]
    choice = tuning_choice(spec.tune, scores, metric.higher_is_better, str)
    write_json(row_dir / TUNED, choice)
    edge = f", left on the {choice['edge']} edge" if choice["edge"] else ""
    print(
        f"  {job.experiment} {job.method} M={job.members}: {choice['key']}={choice['value']}{edge} "
        f"(validation {spec.tune.metric}: {choice['scores']})",
        flush=True,
    )
    return choice


# --- a row's diversity knob ------------------------------------------------------------------------------------
# A row with ``knob: {key: sigma_init, grid: [0.01, 0.03]}`` tunes its method's own diversity knob besides its
# rate: the rate first, at the grid's first value (the method's default), then the knob's values at the chosen
# rate, each one run at the tuning seed in ``<row>/tune/<key>_<value>``. The grid is fixed (it never grows: the
# knob is a second coordinate, not a search), the best value on the table's validation metric is kept, and the
# choice goes into the row's tuned.json under ``knob``. Overrides are ordered [..., knob, rate, seed] in every run
# of the row, so the run of the rate tuning at the knob's first value *is* that knob run and is copied, not
# trained twice; likewise the chosen knob run is the tuning seed's run.


def before_seed(overrides: list[str], *items: str) -> list[str]:
    """``overrides`` (ending in ``seed=...``) with ``items`` (``key=value``) inserted before the seed."""
    return [*overrides[:-1], *items, overrides[-1]]


def knob_jobs(spec, job: Job, rate: str) -> list[Job]:
    """One run per knob value at the tuning seed, at the row's chosen ``rate`` (``key=value``)."""
    knob, seed = job.knob, int(spec.tune.seed)
    return [
        Job(
            job.experiment,
            job.method,
            job.members,
            seed,
            [*job.overrides[:-1], f"{knob.key}={value}", rate, f"seed={seed}"],
            job.dir.parent / "tune" / f"{knob.key}_{value}",
            tuning=f"{knob.key}={value}",
        )
        for value in knob.grid
    ]


def tune_knob(spec, job: Job, rate: str, rate_run: Path | None, attempt, dry_run: bool, failures: list[str]):
    """The row's knob choice (the record under ``knob`` in its tuned.json), its runs trained or found; None when
    it cannot be made; ``HELD`` while another process trains one of them. ``rate_run``: the row's own rate-tuning
    run at the chosen rate (at the knob's first value), reused as that value's run."""
    knob, row_dir = job.knob, job.dir.parent
    tuned_path = row_dir / TUNED
    recorded = read_json(tuned_path, "delete it to tune again").get("knob") if tuned_path.exists() else None
    if recorded is not None:
        if recorded.get("key") != knob.key or recorded.get("grid") != [str(v) for v in knob.grid]:
            failures.append(
                f"{tuned_path} chose {recorded.get('key')} over {recorded.get('grid')}, but the row's knob is "
                f"{knob.key} over {[str(v) for v in knob.grid]}; delete its knob entry (or the file) to tune again"
            )
            return None
        return recorded
    runs = knob_jobs(spec, job, rate)
    first = runs[0]
    if (
        rate_run is not None
        and not dry_run
        and (rate_run / "results.json").exists()
        and not (first.dir / "results.json").exists()
        and holder(first.dir) is None
    ):
        reuse_tuning_run(rate_run, first.dir)
    found = [(run, attempt(spec, run, f"  knob {run}")) for run in runs]
    if any(r is HELD for _, r in found):
        return HELD
    if dry_run:
        return {"key": knob.key, "value": f"<best on validation of {list(knob.grid)}>"}
    try:  # the table's metric, named by the knob's key in what it says
        scores = grid_scores(OmegaConf.merge(spec, {"tune": {"key": knob.key}}), found, list(knob.grid), row_dir)
    except RuntimeError as err:
        failures.append(str(err))
        return None
    metric = METRICS[spec.tune.metric]
    best = best_of(scores, metric.higher_is_better)
    record = {
        "key": knob.key,
        "value": str(best),
        "metric": f"val/{spec.tune.metric}",
        "scores": {str(v): scores[v] for v in knob.grid},
        "grid": [str(v) for v in knob.grid],
        "rate": rate,
        "seed": int(spec.tune.seed),
        "note": "the method's diversity knob: a fixed grid, chosen on the validation split at the row's rate",
    }
    choice = read_json(tuned_path, "delete it to tune again")
    write_json(tuned_path, {**choice, "knob": record})
    print(
        f"  {job.experiment} {job.method} M={job.members}: {knob.key}={record['value']} "
        f"(validation {spec.tune.metric}: {record['scores']})",
        flush=True,
    )
    return record
