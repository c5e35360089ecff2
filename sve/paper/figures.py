"""The paper's figures from stored result files only (matplotlib, Agg; PNG and PDF under ``<root>/figures``).

- Fig. 2: CIFAR-100 metrics against backbone pretraining (random init, DINO, DINOv2), one line per method;
- Fig. 3: accuracy, ECE and NLL against CIFAR-100-C severity 0-5, one line per method, from the runs'
  ``shift.by_severity`` records (also written as tables, ``figure3.md`` / ``.csv``);
- Figs. 4-6 (Appendix B): relative change (%) of the top singular values from the pretrained ones, per
  member and layer, from a run's ``singular_values.npz``;
- reliability diagrams, one panel per method, from a run's ``reliability`` record or saved predictions;
- learning curves: validation NLL, ECE and accuracy against optimiser steps, one line per method (mean over
  seeds), from the runs' ``curve`` records (``sve.training.curves``), so a reader sees whether each method converged.

A figure without any data is not drawn (the table beside it lists what is missing).
"""

from __future__ import annotations

import csv
import io
import re
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display; before pyplot is imported
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from sve.layers.singular_values import FILENAME, load_singular_values  # noqa: E402
from sve.metrics.plots import reliability_bins, reliability_grid, save_figure  # noqa: E402
from sve.paper.budget import mean_curve as mean_of_curves  # noqa: E402
from sve.paper.display import METHOD_NAMES, METRICS  # noqa: E402
from sve.paper.report import Cell, Table, aggregate
from sve.paper.store import Run, select  # noqa: E402


def _label(method: str, members: int) -> str:
    return f"{METHOD_NAMES.get(method, method)} (M={members})" if members > 1 else METHOD_NAMES.get(method, method)


MARKERS = "osD^v<>pP*X"
STYLES = ("-", "--", "-.", ":")


def _line(ax, xs, cells: list[Cell | None], label: str, index: int = 0, count: int = 1) -> None:
    """Mean with a ±std band where cells exist; gaps where they do not. Each line has its own marker and dash
    and is shifted sideways by a small step (``index`` of ``count`` lines), so equal values stay visible
    (SVF under SVE) instead of one line hiding the other."""
    mean = np.array([c.mean if c else np.nan for c in cells])
    std = np.array([c.std if c and c.std is not None else 0.0 for c in cells])
    xs = np.asarray(xs, dtype=float)
    step = (np.min(np.diff(xs)) if len(xs) > 1 else 1.0) * 0.12 / max(count - 1, 1)
    shifted = xs + (index - (count - 1) / 2) * step
    (line,) = ax.plot(
        shifted, mean, marker=MARKERS[index % len(MARKERS)], ms=4, ls=STYLES[index % len(STYLES)], lw=1.2, label=label
    )
    ax.fill_between(shifted, mean - std, mean + std, color=line.get_color(), alpha=0.12)


def _legend_outside(fig, ax) -> None:
    """The legend right of the last panel, where it hides no line."""
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    fig.tight_layout()


# --- Fig. 2 ---------------------------------------------------------------------------------------------


def figure2(table: Table, out_dir: Path) -> list[Path]:
    """One panel per metric; x = the table's blocks (pretraining), one line per row."""
    if not any(c for b in table.blocks for r in b.rows for c in r.cells.values()):
        return []
    xs = np.arange(len(table.blocks))
    fig, axes = plt.subplots(1, len(table.metrics), figsize=(4 * len(table.metrics), 3.4))
    rows = table.blocks[0].rows
    for ax, metric in zip(np.atleast_1d(axes), table.metrics):
        for i, row in enumerate(rows):
            cells = [block.rows[i].cells.get(metric.key) for block in table.blocks]
            _line(ax, xs, cells, _label(row.method, row.members), i, len(rows))
        # Block titles are long ("ImageNet-1k (EfficientNet-Lite0)"): wrapped, so neighbours never collide.
        ax.set_xticks(xs, [textwrap.fill(block.title, 16) for block in table.blocks], fontsize=7)
        ax.set_xlim(xs[0] - 0.5, xs[-1] + 0.5)  # categories: half a step of margin, so no shifted marker is clipped
        ax.set_title(f"{metric.label} {metric.arrow}".strip())
        ax.grid(alpha=0.3)
    fig.suptitle(table.title, fontsize=10)
    _legend_outside(fig, np.atleast_1d(axes)[-1])
    return save_figure(fig, out_dir, table.name)


# --- Fig. 3 ---------------------------------------------------------------------------------------------


def shift_series(spec, runs: list[Run]) -> tuple[dict, list[str]]:
    """{(method, members): {metric: [Cell | None per severity]}} over seeds, and the missing runs."""
    (experiment,) = spec.experiments
    series, missing = {}, []
    for row in spec.rows:
        found = select(runs, experiment, row.method, int(row.members))
        by_seed = {s: r.results.get("shift", {}).get("by_severity", {}) for s, r in found.items()}
        lacking = [s for s in spec.seeds if not by_seed.get(s)]
        if lacking:
            missing.append(
                f"{experiment} · {METHOD_NAMES.get(row.method, row.method)} (M={row.members}): seeds "
                f"{', '.join(map(str, lacking))} without a per-severity record"
            )
        series[(row.method, int(row.members))] = {
            key: [
                aggregate(
                    [float(rec[str(sev)][key]) for rec in by_seed.values() if str(sev) in rec],
                    METRICS[key],
                    len(spec.seeds),
                )
                for sev in spec.severities
            ]
            for key in spec.metrics
        }
    return series, missing


def figure3(spec, runs: list[Run], root: Path) -> list[Path]:
    series, missing = shift_series(spec, runs)
    severities = list(spec.severities)
    # The series as tables: one per metric, rows = methods, columns = severities.
    lines, rows = [f"## {spec.title}", ""], []
    for key in spec.metrics:
        metric = METRICS[key]
        lines += [
            f"### {metric.label}",
            "",
            "| Method | M | " + " | ".join(f"sev. {s}" for s in severities) + " |",
            "|:--|--:|" + "--:|" * len(severities),
        ]
        for (method, members), by_metric in series.items():
            cells = by_metric[key]
            lines.append(
                f"| {METHOD_NAMES.get(method, method)} | {members} | "
                + " | ".join(c.text(metric) if c else "–" for c in cells)
                + " |"
            )
            for sev, cell in zip(severities, cells):
                std = "" if cell is None or cell.std is None else repr(cell.std)
                rows.append(
                    [method, members, key, sev, "" if cell is None else repr(cell.mean), std, cell.seeds if cell else 0]
                )
        lines.append("")
    lines.append(
        "Mean ± sample standard deviation over seeds; severity 0 is the clean test set; each severity "
        "averages the corruptions. Acc and ECE in %."
    )
    lines += ["", "Missing runs (–):", *[f"- {m}" for m in missing]] if missing else ["", "Missing runs: none."]
    tables = root / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    (tables / f"{spec.name}.md").write_text("\n".join(lines) + "\n")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerows([["method", "members", "metric", "severity", "mean", "std", "seeds"], *rows])
    (tables / f"{spec.name}.csv").write_text(out.getvalue())
    written = [tables / f"{spec.name}.md", tables / f"{spec.name}.csv"]

    if not any(c for by_metric in series.values() for cells in by_metric.values() for c in cells):
        return written
    fig, axes = plt.subplots(1, len(spec.metrics), figsize=(4 * len(spec.metrics), 3.4))
    for ax, key in zip(np.atleast_1d(axes), spec.metrics):
        for i, ((method, members), by_metric) in enumerate(series.items()):
            _line(ax, severities, by_metric[key], _label(method, members), i, len(series))
        metric = METRICS[key]
        ax.set_xlabel("shift intensity (severity)")
        ax.set_title(f"{metric.label} {metric.arrow}".strip())
        ax.set_xticks(severities)
        ax.grid(alpha=0.3)
    fig.suptitle(spec.title, fontsize=10)
    _legend_outside(fig, np.atleast_1d(axes)[-1])
    return written + save_figure(fig, root / "figures", spec.name)


# --- Figs. 4-6 ------------------------------------------------------------------------------------------


def relative_change(pretrained: np.ndarray, members: np.ndarray, top_k: int) -> np.ndarray:
    """(M, k): 100 * (s_m - s) / s for the k largest pretrained singular values (zeros excluded)."""
    order = np.argsort(-pretrained)[:top_k]
    base = pretrained[order]
    keep = base > 0
    return 100.0 * (members[:, order][:, keep] - base[keep]) / base[keep]


def figure_b(spec, runs: list[Run], out_dir: Path) -> list[Path]:
    """Figs. 4-6 from the first seed's ``singular_values.npz`` of the table's SVE run."""
    (experiment,) = spec.experiments
    row = spec.rows[0]
    found = select(runs, experiment, row.method, int(row.members))
    files = [found[s].path.parent / FILENAME for s in sorted(found)]
    files = [f for f in files if f.exists()]
    if not files:
        return []
    layers = load_singular_values(files[0])
    written = []
    for name, group in spec.layers.items():
        chosen = [layer for layer in layers if re.search(group.pattern, layer)]
        if not chosen:
            continue
        cols = min(4, len(chosen))
        rows = -(-len(chosen) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False, sharey=True)
        for ax, layer in zip(axes.flat, chosen):
            change = relative_change(*layers[layer], int(spec.top_k))
            for m, values in enumerate(change):
                ax.plot(np.arange(1, len(values) + 1), values, marker=".", label=f"member {m + 1}")
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_title(layer, fontsize=7)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(chosen) :]:
            ax.axis("off")
        axes[0, 0].set_ylabel("relative change (%)")
        axes[-1, 0].set_xlabel("singular value index (largest first)")
        axes[0, -1].legend(fontsize=6)
        where = files[0].parent.relative_to(out_dir.parent)
        fig.suptitle(f"{group.title}: top singular values' relative change from pretrained ({where})", fontsize=9)
        written += save_figure(fig, out_dir, name)
    return written


# --- reliability diagrams ---------------------------------------------------------------------------------


def run_reliability(run: Run) -> dict[str, np.ndarray] | None:
    """A run's bins: its ``reliability`` record, else recomputed from its saved test predictions."""
    record = run.results.get("reliability")
    if isinstance(record, dict) and "accuracy" in record.get("test", record):
        record = record.get("test", record)
        return {k: np.asarray(record[k], dtype=float) for k in ("count", "confidence", "accuracy")}
    predictions = run.results.get("predictions") or {}
    if not predictions:
        return None
    path = run.path.parent / predictions.get("test", next(iter(predictions.values())))
    if not path.exists():
        return None
    from sve.runs.prediction_files import read_predictions  # here: it imports torch, which figures need not

    data = read_predictions(path)
    if "probs" in data:
        probs = data["probs"]
    elif "member_probs" in data:
        probs = data["member_probs"].mean(0)  # (M, N, C) -> (N, C): the mean of member probabilities
    elif "member_logits" in data:
        logits = data["member_logits"] - data["member_logits"].max(-1, keepdims=True)
        probs = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).mean(0)
    else:
        return None
    return reliability_bins(probs.astype(float), data["labels"])


def reliability_diagrams(spec, runs: list[Run], out_dir: Path) -> list[Path]:
    """Per experiment of a table: one panel per row, from its lowest seed that has the data."""
    written = []
    for experiment, title in spec.experiments.items():
        panels = []
        for row in spec.rows:
            found = select(runs, experiment, row.method, int(row.members))
            bins = next((b for s in sorted(found) if (b := run_reliability(found[s])) is not None), None)
            if bins is not None:
                panels.append((_label(row.method, int(row.members)), bins))
        if not panels:
            continue
        fig = reliability_grid(
            panels, f"Reliability: {title} (lowest seed; below: share of test examples per bin, with counts)"
        )
        written += save_figure(fig, out_dir, f"{spec.name}_reliability_{experiment}")
    return written


# --- learning curves ------------------------------------------------------------------------------------

CURVE_METRICS = ("nll", "ece", "acc")


def mean_curve(found: dict[int, Run], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``sve.paper.budget.mean_curve`` over the seeds of one row."""
    return mean_of_curves([(r.results.get("curve") or {}).get("points", []) for r in found.values()], key)


def learning_curves(spec, runs: list[Run], out_dir: Path) -> list[Path]:
    """Per experiment of a table: one panel per metric (validation NLL, ECE, accuracy) against optimiser
    steps, one line per row, the mean over its seeds with a band of one standard deviation."""
    written = []
    for experiment, title in spec.experiments.items():
        series = {}
        for row in spec.rows:
            found = select(runs, experiment, row.method, int(row.members))
            curves = {key: mean_curve(found, f"val/{key}") for key in CURVE_METRICS}
            if all(c is not None for c in curves.values()):
                series[_label(row.method, int(row.members))] = (curves, len(found))
        if not series:
            continue
        fig, axes = plt.subplots(1, len(CURVE_METRICS), figsize=(4.2 * len(CURVE_METRICS), 3.4), squeeze=False)
        markers = "osD^v<>pP*X"
        for i, (label, (curves, seeds)) in enumerate(series.items()):
            for ax, key in zip(axes.flat, CURVE_METRICS):
                steps, mean, std = curves[key]
                scale = METRICS[key].scale
                (line,) = ax.plot(
                    steps,
                    mean * scale,
                    marker=markers[i % len(markers)],
                    ms=3.5,
                    lw=1.2,
                    label=f"{label} ({seeds} seed{'s' * (seeds > 1)})",
                )
                ax.fill_between(steps, (mean - std) * scale, (mean + std) * scale, color=line.get_color(), alpha=0.12)
        for ax, key in zip(axes.flat, CURVE_METRICS):
            metric = METRICS[key]
            ax.set_title(f"validation {metric.label} {metric.arrow}".strip(), fontsize=9)
            ax.set_xlabel("optimiser step")
            ax.grid(alpha=0.3)
        axes[0, -1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
        fig.suptitle(f"Learning curves: {title}", fontsize=10)
        fig.tight_layout()
        written += save_figure(fig, out_dir, f"{spec.name}_curves_{experiment}")
    return written
