"""Sweeps that survive their failures: each failed run leaves ``failed.json`` in its directory and the sweep
goes on; at the end ``summary.json`` in the sweep directory lists every run as finished or failed (with the
error), and the sweep exits non-zero if any failed. A finished run (``results.json``) is skipped when the
same sweep directory is run again (``skip_finished``), so rerunning a sweep does only the failed or missing
runs. Works the same with the SLURM launcher (``hydra/launcher=slurm``), whose jobs write to a shared disk.
"""

from __future__ import annotations

import json
import logging
import traceback
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from sve.results import write_json

log = logging.getLogger(__name__)


def record_failure(run_dir: Path, error: BaseException) -> None:
    """``failed.json``: the error and its traceback, so the summary can list it."""
    write_json(run_dir / "failed.json", {
        "error": f"{type(error).__name__}: {error}",
        "traceback": "".join(traceback.format_exception(error)),
    })  # fmt: skip


def summarize(sweep_dir: Path) -> dict:
    """Every run directory under ``sweep_dir`` with its state: finished, failed or incomplete."""
    runs = []
    for run_dir in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if (run_dir / "results.json").exists():
            results = json.loads((run_dir / "results.json").read_text())
            runs.append({"run": run_dir.name, "state": "finished", "test/acc": results["metrics"].get("test/acc")})
        elif (run_dir / "failed.json").exists():
            error = json.loads((run_dir / "failed.json").read_text())["error"]
            runs.append({"run": run_dir.name, "state": "failed", "error": error})
        else:
            runs.append({"run": run_dir.name, "state": "incomplete"})
    failed = [r["run"] for r in runs if r["state"] != "finished"]
    return {"runs": runs, "finished": len(runs) - len(failed), "not_finished": failed}


class SweepSummary(Callback):
    """Hydra callback: writes ``<sweep dir>/summary.json`` when a multirun ends; exits 1 if a run failed."""

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        # A rerun of a failed run starts clean: its old failure is no longer the news.
        (Path(config.paths.output_dir) / "failed.json").unlink(missing_ok=True)

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
