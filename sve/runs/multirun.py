"""Sweeps that survive their failures: each failed run leaves ``failed.json`` in its directory and the sweep
goes on; at the end ``summary.json`` in the sweep directory lists every run as finished, failed (with the
error), unreadable (a results.json that is not valid JSON, with what to delete) or incomplete, and the sweep
exits non-zero if any did not finish.

The finished runs are also grouped by their overrides other than ``seed`` (``.hydra/overrides.yaml``; without
it, by method, dataset, backbone and member count): ``summary.md`` and ``summary.csv`` give each group's test
metrics as mean and sample standard deviation over its seeds (std 0 for a group of one run).

``sve-tables <sweep dir>`` writes the three files again from what the directory holds (``is_sweep`` tells a sweep
directory from a results store): after a rerun, or for a sweep that was stopped before its end.

A finished run (``results.json``) is skipped when the same sweep directory is run again (``skip_finished``),
so rerunning a sweep does only the failed or missing runs. Works the same with the SLURM launcher
(``hydra/launcher=slurm``), whose jobs write to a shared disk.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import traceback
from pathlib import Path

import yaml
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
        write_json(
            path,
            {
                "error": f"{type(error).__name__}: {error}",
                "traceback": "".join(traceback.format_exception(error)),
            },
        )
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
        return f'(failure record unreadable) {path} has no "error" key'


def failed_after_finishing(run_dir: Path) -> bool:
    """Whether ``failed.json`` was written after ``results.json``: a later attempt in a finished run's directory
    failed. A rerun clears its failure record when it starts, so a record no older than the results is news."""
    results, failure = run_dir / "results.json", run_dir / FAILED
    try:
        return failure.stat().st_mtime_ns >= results.stat().st_mtime_ns
    except FileNotFoundError:
        return False


def summarize(sweep_dir: Path) -> dict:
    """Every run directory under ``sweep_dir`` with its state: finished, failed, unreadable (a results.json
    that is not valid JSON: the error says which and what to delete) or incomplete."""
    runs = []
    for run_dir in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if failed_after_finishing(run_dir):
            # The latest attempt failed (refused for another config, say) beside an earlier attempt's
            # results.json: that file is not this sweep's run, and Hydra has already rewritten the directory's
            # .hydra/overrides.yaml with the failed attempt's overrides, so counting it would file the old
            # metrics under the new settings.
            runs.append(
                {
                    "run": run_dir.name,
                    "state": "failed",
                    "error": read_failure(run_dir),
                    "note": "results.json here is from an earlier attempt, not from this configuration",
                }
            )
        elif (run_dir / "results.json").exists():
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
    finished = [sweep_dir / r["run"] for r in runs if r["state"] == "finished"]
    return {"runs": runs, "finished": len(runs) - len(failed), "not_finished": failed, "groups": groups(finished)}


def run_key(run_dir: Path, results: dict) -> tuple[str, ...]:
    """What tells a run's group apart: its overrides without ``seed`` (sorted), else its main settings."""
    path = run_dir / ".hydra" / "overrides.yaml"
    if path.is_file():
        overrides = yaml.safe_load(path.read_text()) or []
        return tuple(sorted(o for o in overrides if not str(o).lstrip("+~").startswith("seed=")))
    return tuple(f"{k}={results.get(k)}" for k in ("method", "dataset", "backbone", "ensemble_size"))


def mean_std(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def groups(run_dirs: list[Path]) -> list[dict]:
    """The finished runs grouped by ``run_key``: seeds, and each test metric's mean and std over them."""
    grouped: dict[tuple, dict] = {}
    duplicates: dict[tuple, list[str]] = {}
    for run_dir in run_dirs:
        results = read_results(run_dir / "results.json")
        key = run_key(run_dir, results)
        by_seed = grouped.setdefault(key, {})
        # One run per seed: a sweep rerun in its directory with a value added renumbers its jobs, so a finished
        # run's configuration is trained again under a new job number beside the old directory. Counting both
        # would weigh that seed twice in the mean and shrink the std.
        if results.get("seed") in by_seed:
            duplicates.setdefault(key, []).append(run_dir.name)
            log.warning(
                "sweep summary: %s repeats seed %s of %s; counted once",
                run_dir.name,
                results.get("seed"),
                " ".join(key) or "(no overrides)",
            )
            continue
        by_seed[results.get("seed")] = results
    out = []
    for key, by_seed in grouped.items():
        members = list(by_seed.values())
        metrics = [r.get("metrics") or {} for r in members]
        names = sorted(
            k
            for k in metrics[0]
            if k.startswith("test/")
            and k not in ("test/seconds", "test/examples")
            and all(isinstance(m.get(k), (int, float)) for m in metrics)
        )
        group = {
            "overrides": list(key),
            "runs": len(members),
            "seeds": sorted(r.get("seed") for r in members),
            "metrics": {k: dict(zip(("mean", "std"), mean_std([float(m[k]) for m in metrics]))) for k in names},
        }
        if key in duplicates:
            group["repeated_seeds_left_out"] = duplicates[key]
        out.append(group)
    return out


def summary_tables(groups: list[dict]) -> tuple[str, str]:
    """(markdown, csv) of the groups: one row each, ``mean ± std`` per metric."""
    names = sorted({k for g in groups for k in g["metrics"]})
    # Listed once above the table, also for a sweep of one group (seeds only), whose rows would each repeat them.
    common = set.intersection(*[set(g["overrides"]) for g in groups]) if groups else set()
    lines = [
        f"Overrides of every run: {' '.join(sorted(common)) or '(none)'}; mean ± sample std over seeds.",
        "",
        "| other overrides (without seed) | runs | seeds | " + " | ".join(names) + " |",
        "|---|---|---|" + "---|" * len(names),
    ]
    table = io.StringIO()
    writer = csv.writer(table, lineterminator="\n")
    writer.writerow(["overrides", "runs", "seeds", *[f"{n}_{s}" for n in names for s in ("mean", "std")]])
    for g in groups:
        cells = [
            f"{g['metrics'][n]['mean']:.4f} ± {g['metrics'][n]['std']:.4f}" if n in g["metrics"] else "" for n in names
        ]
        seeds = " ".join(str(s) for s in g["seeds"])
        label = " ".join(o for o in g["overrides"] if o not in common) or "(no others)"
        lines.append(f"| {label} | {g['runs']} | {seeds} | " + " | ".join(cells) + " |")
        writer.writerow(
            [
                " ".join(g["overrides"]),
                g["runs"],
                seeds,
                *[g["metrics"].get(n, {}).get(s, "") for n in names for s in ("mean", "std")],
            ]
        )
    return "\n".join(lines) + "\n", table.getvalue()


def is_sweep(directory: Path) -> bool:
    """Whether ``directory`` is a Hydra multirun's: Hydra's ``multirun.yaml``, the summary a sweep wrote, or a
    job directory with Hydra's ``.hydra/overrides.yaml`` (a results store holds ``runs/`` and ``tables/``)."""
    directory = Path(directory)
    if (directory / "multirun.yaml").is_file() or (directory / "summary.json").is_file():
        return True
    return directory.is_dir() and any((d / ".hydra" / "overrides.yaml").is_file() for d in directory.iterdir())


def write_summary(sweep_dir: Path) -> tuple[dict, str]:
    """``summary.json``, ``summary.md`` and ``summary.csv`` of ``sweep_dir`` (module docstring); returns the
    summary and its markdown table."""
    summary = summarize(sweep_dir)
    write_json(sweep_dir / "summary.json", summary)
    markdown, table = summary_tables(summary["groups"])
    (sweep_dir / "summary.md").write_text(markdown)
    (sweep_dir / "summary.csv").write_text(table)
    return summary, markdown


class SweepSummary(Callback):
    """Hydra callback: writes ``<sweep dir>/summary.json`` when a multirun ends; exits 1 if a run failed."""

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        # A rerun of a failed run starts clean: its old failure is no longer the news.
        clear_failure(Path(config.paths.output_dir))

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        summary, markdown = write_summary(sweep_dir)
        print(markdown)
        log.info(
            "sweep: %d finished, %d not: %s (see %s)",
            summary["finished"],
            len(summary["not_finished"]),
            summary["not_finished"],
            sweep_dir / "summary.json",
        )
        if summary["not_finished"]:
            raise SystemExit(
                f"{len(summary['not_finished'])} run(s) of the sweep did not finish: "
                f"{summary['not_finished']}; see {sweep_dir / 'summary.json'}"
            )
