"""The miniature's budget, measured for every method: ``make mini-budget`` (``scripts/mini_budget.py``).

The budget rule. A budget chosen on one method favours it (methods that train fewer parameters may need more
steps), so the miniature does not choose its budget on any method: every experiment trains for the paper's
epoch count (Table 7: 3 on SST-2, 10 on the vision tasks, 5 on ARC-Easy) on one training subset per
experiment, fixed before any method ran. This module is the measurement behind both halves of the rule, read from
the runs of a result store (tuning runs included):

- **time**: minutes per run by experiment and method (``wall_time_s``), how many runs each table needs
  (its rows x seeds plus the tuning runs its grid grew to), and the total: what retraining costs;
- **convergence**: for every method at its tuned learning rate, the validation NLL along its learning curve
  (``sve.training.curves``; mean over seeds): where the best point lies, and whether the curve was still falling at
  the end (the last point better than the one before by more than the tolerance). A method still falling
  needed more budget than it got; a method whose best point is earlier had enough.
- **the curve's share**: the curve's evaluations as a fraction of the run, estimated from the run's own test
  throughput (``test/seconds`` over ``test/examples``) and the examples the curve scored.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from sve.paper.display import METHOD_NAMES
from sve.paper.store import load_spec, run_dir, table_names
from sve.runs.results import read_results

TOLERANCE = 0.01  # nats of validation NLL: smaller changes between curve points are not a trend


def convergence(points: list[dict], key: str = "val/nll", tolerance: float = TOLERANCE) -> dict | None:
    """Where a (mean) curve of a lower-is-better metric is best, and whether it was still falling at its end."""
    points = [p for p in points if key in p]
    if len(points) < 2:
        return None
    best = min(points, key=lambda p: p[key])
    last, before = points[-1], points[-2]
    falling = before[key] - last[key] > tolerance
    return {
        "start": points[0][key],
        "best": best[key],
        "best_step": best["step"],
        "final": last[key],
        "final_step": last["step"],
        "still_falling": falling,
        "verdict": "still falling at the end"
        if falling
        else "converged (best at the end)"
        if best is last
        else f"converged (best at step {best['step']} of {last['step']}, then {last[key] - best[key]:+.3f})",
    }


def mean_curve(curves: list[list[dict]], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(steps, mean, std) of ``key`` over several runs' curve points (the seeds of one row), at the steps every
    curve has; std 0 for one curve; None without curves. What the curve figures draw and the budget reads."""
    curves = [{p["step"]: p[key] for p in c if key in p} for c in curves]
    curves = [c for c in curves if c]
    if not curves:
        return None
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    values = np.array([[c[s] for s in steps] for c in curves])
    std = values.std(axis=0, ddof=1) if len(curves) > 1 else np.zeros(len(steps))
    return np.array(steps), values.mean(axis=0), std


def mean_points(curves: list[list[dict]], key: str = "val/nll") -> list[dict]:
    """``mean_curve`` as points, the form ``convergence`` reads."""
    found = mean_curve(curves, key)
    return [] if found is None else [{"step": int(s), key: float(v)} for s, v in zip(found[0], found[1])]


def curve_share(results: dict) -> float | None:
    """The curve's evaluations as a fraction of the run's wall time, at the run's own test throughput."""
    curve = results.get("curve") or {}
    metrics = results.get("metrics") or {}
    seconds, examples = metrics.get("test/seconds"), metrics.get("test/examples")
    wall = results.get("wall_time_s")
    if not curve.get("points") or not seconds or not examples or not wall:
        return None
    scored = sum(p.get("examples", 0) for p in curve["points"])
    return scored * float(seconds) / float(examples) / float(wall)


def evaluation_seconds(results: dict) -> float:
    """The run's measured evaluation time: its test split (``test/seconds``) and its curve's points at the same
    throughput. A lower bound: the validation, OOD and corruption passes are not timed apart from training."""
    seconds = float((results.get("metrics") or {}).get("test/seconds") or 0.0)
    share = curve_share(results)
    return seconds + (share * float(results["wall_time_s"]) if share else 0.0)


def all_runs(root: Path) -> list[tuple[Path, dict]]:
    """(results.json path, results) of every finished run under ``root/runs``: tuning runs included, copies
    of a tuning run left out (their time is the tuning run's). A file that is not valid JSON is an error
    naming it (``sve.runs.results.read_results``)."""
    return [
        (path, read_results(path))
        for path in sorted(Path(root, "runs").rglob("results.json"))
        if not (path.parent / "REUSED.txt").exists()
    ]


def mini_tables() -> list[str]:
    """The miniature's table definitions (``mini_*``) whose runs the sweep trains (not those written by another
    entry point, ``written_by``: the distillation table's students)."""
    return [
        n
        for n in table_names()
        if n.startswith("mini_") and load_spec(n).kind in ("metrics", "figure2") and not load_spec(n).get("written_by")
    ]


def report(root: Path, tables: list[str] | None, workers: int = 2) -> tuple[str, dict]:
    """``budget.md`` and ``budget.json``: ``to_markdown`` of the ``measure``d record, and the record."""
    record = measure(root, tables, workers)
    return to_markdown(record), record


def measure(root: Path, tables: list[str] | None, workers: int = 2) -> dict:
    """``budget.json``: time by experiment and method, each table's run count, and every row's convergence at its
    tuned learning rate (``tables``: the miniature's when None)."""
    tables = mini_tables() if tables is None else tables
    runs = all_runs(root)
    minutes: dict[tuple[str, str], list[float]] = defaultdict(list)
    shares: dict[tuple[str, str], list[float]] = defaultdict(list)
    for _, results in runs:
        key = (results["experiment"], f"{results['method']}:{results['num_members']}")
        if results.get("wall_time_s"):
            minutes[key].append(float(results["wall_time_s"]) / 60)
        if (share := curve_share(results)) is not None:
            shares[key].append(share)
    record: dict = {"tables": {}, "workers": workers}
    trained = {path.parent: results for path, results in runs}  # each run once: its time counts
    loaded = dict(trained)  # and the seed copies of tuning runs, whose curves count for their seed
    for path in Path(root, "runs").rglob("REUSED.txt"):
        if (path.parent / "results.json").exists():
            loaded.setdefault(path.parent, read_results(path.parent / "results.json"))
    total_minutes = tuning_minutes = seeds_only_minutes = evaluation_minutes = 0.0
    seen_runs: set[Path] = set()
    for name in tables:
        spec = load_spec(name)
        if spec.kind not in ("metrics", "figure2"):
            continue
        rows = []
        for experiment in spec.experiments:
            for row in spec.rows:
                members = int(row.members)
                key = (experiment, f"{row.method}:{members}")
                row_dir = run_dir(root, experiment, row.method, members, 0).parent
                tuned = row_dir / "tuned.json"
                choice = json.loads(tuned.read_text()) if tuned.exists() else None
                seeds = [
                    loaded[d]
                    for s in spec.seeds
                    if (d := run_dir(root, experiment, row.method, members, int(s))) in loaded
                ]
                curves = [(r.get("curve") or {}).get("points", []) for r in seeds]
                directories = [d for d in trained if d.is_relative_to(row_dir)]
                fresh = [d for d in directories if d not in seen_runs]
                seen_runs.update(fresh)
                spent = {d: float(trained[d].get("wall_time_s") or 0.0) / 60 for d in fresh}
                total_minutes += sum(spent.values())
                evaluation_minutes += sum(evaluation_seconds(trained[d]) / 60 for d in fresh if spent[d])
                tuning_minutes += sum(m for d, m in spent.items() if d.relative_to(row_dir).parts[0] == "tune")
                per_run = statistics.fmean(minutes[key]) if minutes[key] else None
                # At the row's first table: what its seeds alone cost, had no rate been tuned.
                if fresh and per_run is not None:
                    seeds_only_minutes += len(spec.seeds) * per_run
                state = convergence(mean_points(curves))
                rows.append(
                    {
                        "experiment": experiment,
                        "row": key[1],
                        "runs": len(directories),
                        "minutes_per_run": per_run,
                        "minutes": sum(spent.values()),
                        "curve_share": statistics.fmean(shares[key]) if shares[key] else None,
                        "lr": choice and choice.get("value"),
                        "edge": choice and choice.get("edge"),
                        "seeds": len(curves),
                        "convergence": state,
                    }
                )
        record["tables"][name] = rows
    record.update(
        core_hours=total_minutes / 60,
        tuning_core_hours=tuning_minutes / 60,
        seeds_only_core_hours=seeds_only_minutes / 60,
        evaluation_core_hours=evaluation_minutes / 60,
    )
    return record


def to_markdown(record: dict) -> str:
    """``budget.md``: the rule, each table's rows (``measure``'s record) with their convergence, and what the runs
    took."""
    workers = record["workers"]
    lines = [
        "# The miniature's budget, measured for every method",
        "",
        "Written by `make mini-budget` (`sve/paper/budget.py`) from the runs under `runs/`. The rule: every "
        "experiment trains for the paper's epoch count (Table 7) on one training subset, fixed before any "
        "method ran; no method chooses it. The end of this file says what the runs took.",
        "",
    ]
    for name, rows in record["tables"].items():
        lines += [
            f"## {load_spec(name).title}",
            "",
            "| experiment | method | runs | min/run | curve share | lr | val NLL: start → best (step) → final | "
            "verdict |",
            "|:--|:--|--:|--:|--:|--:|:--|:--|",
        ]
        for r in rows:
            c = r["convergence"]
            name_ = METHOD_NAMES.get(r["row"].split(":")[0], r["row"])
            members = r["row"].split(":")[1]
            lines.append(
                f"| `{r['experiment']}` | {name_} (M={members}) | {r['runs']} | "
                f"{fmt(r['minutes_per_run'], '.1f')} | "
                f"{fmt(r['curve_share'] and 100 * r['curve_share'], '.0f', '%')} | "
                f"{r['lr'] or '–'}{' (edge: ' + r['edge'] + ')' if r['edge'] else ''} | "
                + (
                    f"{c['start']:.3f} → {c['best']:.3f} ({c['best_step']}) → {c['final']:.3f} | {c['verdict']} |"
                    if c
                    else "– | no curve yet |"
                )
            )
        lines.append("")
    hours, tuning, seeds_only = record["core_hours"], record["tuning_core_hours"], record["seeds_only_core_hours"]
    lines += [
        f"Measured: {hours:.2f} h of runs (one CPU thread each), {hours / workers:.2f} h of wall time at "
        f"{workers} runs at a time. Curves are means over the seeds found at the tuned learning rate; a change "
        f"under {TOLERANCE} nats between the last two points is not called falling.",
        "",
    ]
    # Where the time goes: the tuning grids (seed 0 at the chosen rate is one of their runs) against the seeds,
    # and the seeds alone at the measured minutes per run, as if every learning rate were given.
    lines += [
        f"Of these, {tuning:.2f} h trained the tuning grids (seed 0 at the chosen rate is one of their "
        f"runs) and {hours - tuning:.2f} h the other seeds. With every learning rate given instead of "
        f"tuned, the seeds alone would take about {seeds_only:.1f} h of runs ({seeds_only / workers:.1f} h "
        f"of wall time; the tables' seeds times each row's measured minutes per run). Evaluation (the test "
        f"split and the curves, timed; validation, OOD and corruption passes are not timed apart) took at "
        f"least {record['evaluation_core_hours']:.2f} h of these runs. The times are the runs' own, measured "
        f"while they ran, at times beside other work on the same cores: on an otherwise idle machine a run "
        f"takes less.",
        "",
    ]
    return "\n".join(lines)


def fmt(value, spec: str, suffix: str = "") -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:{spec}}{suffix}"
