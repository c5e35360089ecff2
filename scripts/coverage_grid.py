"""Runs the interval procedures' coverage grid (``sve.paper.coverage_grid``) and writes its table:
``python scripts/coverage_grid.py [--out DIR]`` (``make mini-coverage-grid``).

Each cell is appended to ``DIR/cells.jsonl`` as it finishes, so a stopped run continues where it stopped; the
table (``DIR/README.md``) is rebuilt from that file at the end, or alone with ``--table-only``. A cell already in
the file with other settings (data sets, replicates) is refused rather than mixed in.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from sve.errors import InputError, one_line_errors

DEFAULT_OUT = Path("results/mini/diagnostics/coverage_grid")
METRIC_NAMES = {"acc": "accuracy", "nll": "NLL", "ece": "ECE", "ood_auroc": "OOD AUROC"}


def run(out: Path, datasets: int, replicates: int) -> None:
    from tqdm import tqdm

    from sve.paper import coverage_grid as grid

    out.mkdir(parents=True, exist_ok=True)
    path = out / "cells.jsonl"
    done = grid.read(path)
    for found in done.values():
        if (found["datasets"], found["replicates"]) != (datasets, replicates):
            raise InputError(
                f"{path} holds cells of {found['datasets']} data sets and {found['replicates']} replicates, not "
                f"{datasets} and {replicates}; give those settings or another --out"
            )
    todo = [c for c in grid.cells() if grid.key(asdict(c)) not in done]
    for cell in tqdm(todo, desc="coverage grid cells", unit="cell"):
        index = grid.cells().index(cell)  # each cell's generator seed is its place in the grid, not in the run
        found = grid.study(cell, datasets, replicates, seed=1000 * index)
        with path.open("a") as f:
            f.write(json.dumps(found) + "\n")


def fmt(value: float) -> str:
    return f"{100 * value:.1f}"


def table(out: Path) -> str:
    from sve.paper import coverage_grid as grid

    found = grid.read(out / "cells.jsonl")
    if not found:
        raise InputError(f"no cells in {out / 'cells.jsonl'}; run the grid first (make mini-coverage-grid)")
    results = list(found.values())
    datasets = results[0]["datasets"]
    low, high = grid.binomial_band(grid.LEVEL, datasets)
    procedures = list(grid.PROCEDURES)
    summary = grid.summary(results)
    worst = {p: summary["procedures"][p]["lowest"] for p in procedures}
    chosen = summary["chosen"]
    lines = [
        "# The interval procedures' coverage over the regimes of the committed comparisons",
        "",
        "Written by `make mini-coverage-grid` (`scripts/coverage_grid.py`, `sve/paper/coverage_grid.py`, where the",
        "simulation is described). Each cell: how often a 95% interval contained the true difference, over",
        f"{datasets:,} simulated data sets of {results[0]['cell']['n']} test (and OOD) examples, with",
        f"{results[0]['replicates']} bootstrap replicates each. With the truth at 95%, a cell's estimate falls in",
        f"{fmt(low)}-{fmt(high)}% 95% of the time. Rows: seeds and the share of the test-set noise common to every",
        "seed; columns: the training's sd of a seed's accuracy difference as a multiple of the test set's.",
        "",
        "## Procedures",
        "",
    ]
    lines += [f"- `{p}`: {grid.PROCEDURES[p]}." for p in procedures]
    lines += [
        "",
        "## Summary",
        "",
        "The target is the difference each verdict's point estimate aims at: the population difference for",
        "accuracy, NLL and AUROC (whose plug-in estimates are unbiased) and, for ECE, the expected difference of",
        "the sample ECEs at this size. The binned ECE overestimates a population ECE by a bias that depends on",
        "the model, so no interval centred on it covers the population difference reliably: those coverages",
        "are in the ECE table's second column and are not counted here.",
        "",
        f"| procedure | lowest coverage (%) | its cell (metric, seeds, share, spread) | below {fmt(grid.TARGET)}% |",
        "|---|--:|---|--:|",
    ]
    for p in procedures:
        found_p = summary["procedures"][p]
        c = found_p["cell"]
        lines.append(
            f"| `{p}` | {fmt(worst[p])} | {METRIC_NAMES[c[0]]}, {c[1]}, {c[2]}, {c[3]} | {found_p['below']} of "
            f"{summary['cells']} |"
        )
    lines += [
        "",
        f"Chosen by the rule fixed before the grid ran (the highest lowest coverage): **`{chosen}`**, which "
        + (
            f"keeps every cell at {fmt(grid.TARGET)}% or more."
            if worst[chosen] >= grid.TARGET
            else f"is the best, though no procedure keeps every cell at {fmt(grid.TARGET)}%: its worst cell is "
            f"{fmt(worst[chosen])}%."
        ),
        "",
    ]
    lines += width_lines(results, procedures)
    spreads = sorted({r["cell"]["spread"] for r in results})
    for metric in grid.METRICS:
        rows = [r for r in results if r["cell"]["metric"] == metric]
        if not rows:
            continue
        lines += [f"## {METRIC_NAMES[metric]}", ""]
        extra = " (population / at n)" if metric == "ece" else ""
        lines.append("| seeds | share | " + " | ".join(f"spread {s:g}" for s in spreads) + " |")
        lines.append("|--:|--:|" + "--:|" * len(spreads))
        by = {(r["cell"]["seeds"], r["cell"]["share"], r["cell"]["spread"]): r for r in rows}
        for seeds, share in sorted({(r["cell"]["seeds"], r["cell"]["share"]) for r in rows}):
            cells = []
            for s in spreads:
                r = by.get((seeds, share, s))
                if r is None:
                    cells.append("")
                    continue
                cov = r["coverage"]
                if metric == "ece":
                    cells.append(" / ".join(f"{fmt(cov[p]['population'])}, {fmt(cov[p]['at_n'])}" for p in procedures))
                else:
                    cells.append(" / ".join(fmt(cov[p]["population"]) for p in procedures))
            lines.append(f"| {seeds} | {share:g} | " + " | ".join(cells) + " |")
        names = " / ".join(f"`{p}`" for p in procedures)
        lines += ["", f"Each cell: {names}" + (" (each: population, at n)" if extra else "") + ".", ""]
    return "\n".join(lines)


def width_lines(results: list[dict], procedures: list[str]) -> list[str]:
    """What coverage costs: each other procedure's mean interval width as a multiple of the first's, per seed
    count (median and range over the cells of that count)."""
    if any("width" not in r for r in results):
        return []
    base, lines = procedures[0], []
    seed_counts = sorted({r["cell"]["seeds"] for r in results})
    lines += [
        f"Interval widths against `{base}`'s (mean width over the data sets, the ratio's median and range over a seed",
        "count's cells): what the coverage costs in resolution.",
        "",
        "| procedure | " + " | ".join(f"{s} seeds" for s in seed_counts) + " |",
        "|---|" + "--:|" * len(seed_counts),
    ]
    for p in procedures[1:]:
        cells = []
        for s in seed_counts:
            ratios = [r["width"][p] / r["width"][base] for r in results if r["cell"]["seeds"] == s and r["width"][base]]
            cells.append(f"{np.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "")
        lines.append(f"| `{p}` | " + " | ".join(cells) + " |")
    return lines + [""]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--datasets", type=int, default=None, help="data sets per cell (default: the module's)")
    parser.add_argument("--replicates", type=int, default=None, help="bootstrap replicates (default: the module's)")
    parser.add_argument("--table-only", action="store_true", help="rebuild README.md from cells.jsonl")
    args = parser.parse_args(argv)
    from sve.paper import coverage_grid as grid

    with one_line_errors():
        if not args.table_only:
            run(args.out, args.datasets or grid.DATASETS, args.replicates or grid.REPLICATES)
        text = table(args.out)
        (args.out / "README.md").write_text(text)
        print(text)


if __name__ == "__main__":
    main()
