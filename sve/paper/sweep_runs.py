"""One run of a sweep: trained in this process or a child, its directory's overrides recorded and checked."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

from sve.paper.store import members_of
from sve.paper.sweep_jobs import Job
from sve.paths import CONFIGS
from sve.runs.results import UnreadableFile, read_results, rerun_hint, write_json
from sve.runs.rundir import HELD_LOCK, LOCK

HELD = object()  # what ``Sweep.attempt`` returns for a run another process is training now

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
    raise RuntimeError(
        f"{job.dir} holds a run trained with other overrides (only in that run: {there}; only in "
        f"this sweep: {here}); delete the directory to train it with these, or restore the "
        "definition it was trained with"
    )


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
        raise UnreadableFile(
            f"{path} lacks what a finished run records ({type(err).__name__}: {err}); {rerun_hint(path)}", path
        ) from None


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


def what_follows(run_dir: Path) -> str:
    """What the run said the same command does after its stop (``resumes from step N (...)`` or ``starts over:
    ...``, the end of its one-line error in train.log), so the sweep promises no more than the run can give."""
    said = "Start the same command again: it "
    try:
        lines = (run_dir / "train.log").read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    line = next((line for line in reversed(lines) if said in line), None)
    return line.split(said, 1)[1] if line else f"does what its train.log says ({run_dir / 'train.log'})"


@contextmanager
def forwarded_sigterm(child: subprocess.Popen):
    """While the sweep waits for its run: SIGTERM (``kill <sweep pid>``, a scheduler's stop) is passed on to the
    run, which stops at its next batch with its checkpoint saved, instead of leaving it training on, orphaned,
    with the sweep gone. Yields a list that holds True once the signal came. (Ctrl-C reaches both already: the
    terminal signals the whole process group.)"""
    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread
        yield []
        return
    stopped: list[bool] = []

    def forward(signum, frame):
        stopped.append(True)
        child.send_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        yield stopped
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_subprocess(job: Job) -> dict:
    job.dir.mkdir(parents=True, exist_ok=True)
    # This interpreter and this installed package (not whichever ``sve-train`` is first on the PATH), in the
    # current directory: relative data paths and the store resolve as they do for the sweep itself.
    # Hydra's own file handler writes train.log too (its job is named train): the run's log goes to the file
    # once, through the console output captured below, which also holds warnings, tracebacks and progress bars.
    command = [
        sys.executable,
        "-m",
        "sve.cli.train",
        *job.overrides,
        f"hydra.run.dir={job.dir}",
        "hydra.job_logging.root.handlers=[console]",
    ]
    env = {**os.environ, HELD_LOCK: str((job.dir / LOCK).resolve())}  # the run adopts the lock this sweep holds
    with open_log(job) as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        with forwarded_sigterm(child) as stopped:
            code = child.wait()
    if stopped:
        raise SystemExit(
            f"stopped by SIGTERM; when the sweep is started again, the run in {job.dir} {what_follows(job.dir)}"
        )
    if code != 0:
        raise RuntimeError(f"sve-train exited with status {code}; see {job.dir / 'train.log'}")
    return read_results(job.dir / "results.json")


def measure_costs(path: Path, smoke: bool) -> None:
    """Runs the cost benchmark's Table 5 part (``sve-bench --parts table5``) into ``path``'s folder:
    minutes on a CPU for BERT-base; ``--tiny`` for a smoke run."""
    command = [
        sys.executable,
        "-m",
        "sve.cli.bench",
        "--parts",
        "table5",
        "--out",
        str(path.parent),
        *(["--tiny"] if smoke else []),
    ]
    print(f"measuring: {' '.join(command[1:])}", flush=True)
    subprocess.run(command, check=True)


def holder_in_words(record: dict) -> str:
    """A lock's holder in words."""
    if not record:
        return "starting"
    return f"pid {record.get('pid')} on {record.get('host')}, since {record.get('started')}"
