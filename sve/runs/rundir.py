"""Run directories that never collide: a unique name, and a lock held by the one live run writing there.

Names end in ``run_id()``: the SLURM job id (``job<id>[_<array task>]``; a requeued job gets its own
directory back and resumes from its checkpoint there), else a random suffix after the start time. The
suffix is put into the environment, so processes that a run starts itself (Lightning's DDP ranks) agree on it;
Hydra's submitit launcher copies the resolved value into its jobs (the resolver is cached), so a sweep's jobs
agree on the sweep directory, and each job has its own subdirectory (method, size, seed and its other swept
values: ``job_suffix``).

``claim(dir)`` creates ``<dir>/.lock`` atomically (``O_EXCL``) for rank 0 and refuses to start while another
live process holds it; a lock left by a dead process on this host, or by an earlier attempt of the same
SLURM job, is taken over. A sweep claims a run's directory itself before it starts ``train.py`` there, so two
sweeps sharing a store can never both start the same run; it names that lock in ``SVE_HELD_LOCK``, and the run
adopts it (adds its own pid, so the lock stays live while either process lives) instead of refusing.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from contextlib import contextmanager
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from sve.errors import InputError

LOCK = ".lock"
HELD_LOCK = "SVE_HELD_LOCK"  # environment: the path of a lock that the parent process holds for this run


class DirectoryInUse(InputError):
    """Another live run holds the directory."""


def run_id(kind: str = "run") -> str:
    """``job<SLURM id>`` for a run under SLURM, else ``<start time>_<6 random hex digits>`` (the same in child
    ranks). A sweep's directory (``kind="sweep"``) always takes the second form: two sweeps submitted from one
    SLURM allocation must not share it."""
    job = os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID")
    if job and kind == "run":
        task = os.environ.get("SLURM_ARRAY_TASK_ID")
        return f"job{job}" + (f"_{task}" if task else "")
    if "SVE_RUN_ID" not in os.environ:
        os.environ["SVE_RUN_ID"] = f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{secrets.token_hex(3)}"
    return os.environ["SVE_RUN_ID"]


def global_rank() -> int:
    for key in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def _holder() -> dict:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_start": process_start(os.getpid()),
        "slurm_job": os.environ.get("SLURM_JOB_ID"),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def process_start(pid: int) -> str | None:
    """When process ``pid`` started, in clock ticks since boot (field 22 of ``/proc/<pid>/stat``): a pid that a
    later process reuses has another. None where there is no such entry (no /proc, or no such process)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()[19]  # the fields after the command's name start at field 3


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale(record: dict) -> bool:
    """True when the lock's record cannot be running any more."""
    if record.get("slurm_job") and record["slurm_job"] == os.environ.get("SLURM_JOB_ID"):
        return True  # an earlier attempt of this (requeued) job
    # The claimant, and a run that adopted its lock, each with its start time where the lock recorded it: a
    # session's processes end with it, and their pids are handed to others (a sweep resumed in a new session
    # took a lock held by a long-dead run for a live one and skipped the job).
    pids = [(record.get("pid", -1), record.get("pid_start"))]
    pids += list(zip(record.get("run_pids", []), record.get("run_starts", [None] * len(record.get("run_pids", [])))))
    return record.get("host") == socket.gethostname() and not any(_same_process(int(p), start) for p, start in pids)


def _same_process(pid: int, start: str | None) -> bool:
    """``pid`` is alive and, where its start time was recorded, is the process that recorded it."""
    if not _alive(pid):
        return False
    now = process_start(pid)
    return start is None or now is None or now == start


def holder(directory: Path) -> dict | None:
    """The record of the live run holding ``directory`` (``{}`` while its lock is being written), or None when
    no live run holds it: no lock, or the lock of a run that has died."""
    lock = Path(directory) / LOCK
    try:
        text, age = lock.read_text(), time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text or "{}")
    except json.JSONDecodeError:
        record = {}
    if not record:
        return {} if age < 10 else None  # created and not yet filled, or left empty by a crash
    return None if _stale(record) else record


@contextmanager
def claim(directory: Path):
    """Holds ``directory`` for this run (rank 0 only; other ranks belong to the run that holds it)."""
    if global_rank() != 0:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    lock = directory / LOCK
    if os.environ.get(HELD_LOCK) == str(lock.resolve()) and _adopt(lock):
        yield  # the parent (a sweep) holds the lock for this run and removes it when the run has ended
        return
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            held = holder(directory)
            if held is not None:
                raise DirectoryInUse(
                    f"run directory {directory} is in use by another run ({held}); pick another directory "
                    f"(hydra.run.dir=...) or, if that run is gone, delete {lock}"
                ) from None
            lock.unlink(missing_ok=True)  # a dead run's lock
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(_holder(), f)
        break
    else:
        raise RuntimeError(f"could not take {lock}: another run keeps creating it")
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def _adopt(lock: Path) -> bool:
    """Adds this process to the record of ``lock``, held for it by its parent; False when there is none."""
    try:
        record = json.loads(lock.read_text() or "{}")
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    if record.get("pid") == os.getpid():
        return True  # the same process (a sweep running a small run in process)
    record["run_pids"] = [*record.get("run_pids", []), os.getpid()]
    record["run_starts"] = [
        *record.get("run_starts", [None] * (len(record["run_pids"]) - 1)),
        process_start(os.getpid()),
    ]
    partial = lock.with_name(f"{LOCK}.{os.getpid()}")
    partial.write_text(json.dumps(record))
    os.replace(partial, lock)  # atomic: a reader sees the old record or the new one, never half of it
    return True


# ----- the config a run directory was started with -------------------------------------------------------------
RUN_CONFIG = "run_config.yaml"
# Keys that change where and how a run is watched or cached, not what it computes: a resumed (or requeued)
# run may change them freely. The device layout is among them (a requeued job may land on other hardware).
FREE_KEYS = (
    "paths",
    "ckpt_path",
    "skip_finished",
    "resume_with_changes",
    "predictions",
    "logger",
    "callbacks",
    "cpu_allocator",
    "method.svd_cache",
    "dataset.num_workers",
    "trainer.devices",
    "trainer.num_nodes",
    "trainer.strategy",
    "trainer.accelerator",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "trainer.log_every_n_steps",
    "trainer.default_root_dir",
)


def _flat(tree, prefix: str = "") -> dict[str, object]:
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out or {prefix[:-1]: {}}
    return {prefix[:-1]: tree}


def config_changes(saved: dict, current: dict) -> list[tuple[str, object, object]]:
    """(key, saved value, current value) of every key that differs and matters for the results. A key one
    side lacks and the other holds as null is no change: options added later default to null, meaning what
    the code did before they existed, so a run started before them continues."""
    a, b = _flat(saved), _flat(current)
    free = lambda key: any(key == k or key.startswith(f"{k}.") for k in FREE_KEYS)  # noqa: E731
    missing = "<absent>"
    same = lambda x, y: x == y or (x is None and y == missing) or (y is None and x == missing)  # noqa: E731
    return [
        (k, a.get(k, missing), b.get(k, missing))
        for k in sorted(set(a) | set(b))
        if not free(k) and not same(a.get(k, missing), b.get(k, missing))
    ]


def describe_changes(changes: list[tuple[str, object, object]], limit: int = 6) -> str:
    shown = "; ".join(f"{k}: {old!r} -> {new!r}" for k, old, new in changes[:limit])
    return shown + (f"; and {len(changes) - limit} more" if len(changes) > limit else "")


def read_run_config(directory: Path) -> dict | None:
    import yaml

    path = Path(directory) / RUN_CONFIG
    if not path.is_file():
        return None
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise InputError(
            f"{path} is not readable YAML ({str(err).splitlines()[0]}); it records the config the "
            "run was started with: delete the run directory to start afresh"
        ) from None


def remember_config(directory: Path, config: dict) -> None:
    """Writes ``<dir>/run_config.yaml`` atomically (the config as resolved when the run started)."""
    import yaml

    path = Path(directory) / RUN_CONFIG
    partial = path.with_name(f".{RUN_CONFIG}.{os.getpid()}")
    partial.write_text(yaml.safe_dump(config, sort_keys=False))
    os.replace(partial, path)


# The topmost folder that Hydra is about to create for this process's run (the run directory, or the first of its
# parents that did not exist), None when the run directory existed before: a run refused before it wrote
# anything removes what it created (sve.cli.train), and never a directory that was there before it.
created_by_this_run: Path | None = None


class WritableRunDir(Callback):
    """Hydra callback: the run (or sweep) directory can be written, checked before Hydra sets up its log file
    there, which would otherwise fail with ``ValueError: Unable to configure handler 'file'``."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        global created_by_this_run
        directory = Path(str(config.hydra.run.dir)).absolute()
        created_by_this_run = next((p for p in [*reversed(directory.parents), directory] if not p.exists()), None)
        self._check(directory, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self._check(Path(str(config.hydra.sweep.dir)), "hydra.sweep.dir")

    @staticmethod
    def _check(directory: Path, key: str) -> None:
        from sve.errors import one_line_errors
        from sve.runs.writable import check_writable

        # SystemExit, not the exception: Hydra would turn a callback's exception into a warning and go on.
        with one_line_errors():
            check_writable(directory, "the run directory", hint=f"{key}=<a writable directory>")
