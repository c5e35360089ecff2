"""Sweeps that survive their failures: each failed run leaves ``failed.json`` in its directory and the sweep
goes on; at the end ``summary.json`` in the sweep directory lists every run as finished, failed (with the
error), unreadable (a results.json that is not valid JSON, with what to delete) or incomplete, and the sweep
exits non-zero if any did not finish. A finished run (``results.json``) is skipped when the
same sweep directory is run again (``skip_finished``), so rerunning a sweep does only the failed or missing
runs. Works the same with the SLURM launcher (``hydra/launcher=slurm``), whose jobs write to a shared disk.
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from sve.runs.results import UnreadableFile, read_json, read_results, write_json

log = logging.getLogger(__name__)

FAILED = "failed.json"  # a run's failure record, written by train.py's multirun and by the table sweep alike


def record_failure(run_dir: Path, error: BaseException) -> None:
    """``failed.json``: ``{"error": "<type>: <message>", "traceback": ...}``, so a summary can list it; the one
    failure record of a run directory (``sve.runs.multirun`` and ``sve.paper.sweep`` both write it)."""
    path = Path(run_dir) / FAILED
    try:
        write_json(path, {
            "error": f"{type(error).__name__}: {error}",
            "traceback": "".join(traceback.format_exception(error)),
        })  # fmt: skip
    except (OSError, ValueError) as err:  # a full disk must not hide the run's own error: both are logged
        log.error("the failure of this run (%s: %s) could not be recorded: %s", type(error).__name__, error, err)


def clear_failure(run_dir: Path) -> None:
    """Removes a superseded failure record (a rerun that starts, or one that finished)."""
    (Path(run_dir) / FAILED).unlink(missing_ok=True)


def read_failure(run_dir: Path) -> str:
    """The recorded error of a failed run, or what is wrong with its unreadable failure record."""
    path = Path(run_dir) / FAILED
    try:
        return str(read_json(path, "delete it; running the run again writes a new one if it fails again")["error"])
    except UnreadableFile as err:
        return f"(failure record unreadable) {err}"
    except KeyError:
        return f"(failure record unreadable) {path} has no \"error\" key"


def summarize(sweep_dir: Path) -> dict:
    """Every run directory under ``sweep_dir`` with its state: finished, failed, unreadable (a results.json
    that is not valid JSON: the error says which and what to delete) or incomplete."""
    runs = []
    for run_dir in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if (run_dir / "results.json").exists():
            try:
                results = read_results(run_dir / "results.json")
            except UnreadableFile as err:
                runs.append({"run": run_dir.name, "state": "unreadable", "error": str(err)})
                continue
            acc = (results.get("metrics") or {}).get("test/acc")
            runs.append({"run": run_dir.name, "state": "finished", "test/acc": acc})
        elif (run_dir / FAILED).exists():
            runs.append({"run": run_dir.name, "state": "failed", "error": read_failure(run_dir)})
        else:
            runs.append({"run": run_dir.name, "state": "incomplete"})
    failed = [r["run"] for r in runs if r["state"] != "finished"]
    return {"runs": runs, "finished": len(runs) - len(failed), "not_finished": failed}


class SweepSummary(Callback):
    """Hydra callback: writes ``<sweep dir>/summary.json`` when a multirun ends; exits 1 if a run failed."""

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        # A rerun of a failed run starts clean: its old failure is no longer the news.
        clear_failure(Path(config.paths.output_dir))

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        summary = summarize(sweep_dir)
        write_json(sweep_dir / "summary.json", summary)
        log.info("sweep: %d finished, %d not: %s (see %s)", summary["finished"], len(summary["not_finished"]),
                 summary["not_finished"], sweep_dir / "summary.json")  # fmt: skip
        if summary["not_finished"]:
            raise SystemExit(f"{len(summary['not_finished'])} run(s) of the sweep did not finish: "
                             f"{summary['not_finished']}; see {sweep_dir / 'summary.json'}")  # fmt: skip
