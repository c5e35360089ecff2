"""The diagrams of a scored set, drawn into matplotlib figures and written as PNG and PDF: the reliability diagram
(accuracy per confidence bin, as the ECE bins it) with its histogram of confidences, and the metrics of shifted
sets against their severity (a results' ``shift.by_severity`` record).

Nothing here picks matplotlib's backend: in a notebook the figures are shown, and the command-line tools pick
Agg (files only) before they draw."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

N_BINS = 15  # as the ECE (sve.metrics.scores): equal-width, right-closed


def save_figure(fig, out_dir: Path, name: str) -> list[Path]:
    """``<out_dir>/<name>.png`` and ``.pdf``; the figure is closed."""
    paths = write_figure(fig, Path(out_dir) / name)
    plt.close(fig)
    return paths


def write_figure(fig, path: str | Path) -> list[Path]:
    """``path`` as it is where it names a file type (``.png``, ``.pdf``, ``.svg``, ...), else ``<path>.png`` and
    ``<path>.pdf``; the folder is made, the figure stays open."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    paths = [path] if path.suffix else [path.with_name(f"{path.name}.png"), path.with_name(f"{path.name}.pdf")]
    for target in paths:
        # No creation date in the PDF: regenerating a figure from the same runs leaves the file unchanged in git.
        metadata = {"CreationDate": None} if target.suffix == ".pdf" else None
        fig.savefig(target, bbox_inches="tight", dpi=150, metadata=metadata)
    return paths


def reliability_bins(probs: np.ndarray, labels: np.ndarray, n_bins: int = N_BINS) -> dict[str, np.ndarray]:
    """Per confidence bin (equal width, right-closed, as the ECE): count, mean confidence, accuracy."""
    import torch

    from sve.metrics.scores import ece_bin_index

    confidence, predicted = probs.max(-1), probs.argmax(-1)
    # The metric's own binning: ceil(confidence * n) rounds the product, which put a confidence one ulp above
    # an edge k/n (11/15; 17/20, 19/20) into the lower bin, unlike the ECE and its reliability record.
    index = ece_bin_index(torch.from_numpy(np.ascontiguousarray(confidence, dtype=np.float64)), n_bins).numpy()
    count = np.bincount(index, minlength=n_bins).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        conf = np.bincount(index, weights=confidence, minlength=n_bins) / count
        acc = np.bincount(index, weights=(predicted == labels).astype(float), minlength=n_bins) / count
    return {"count": count, "confidence": conf, "accuracy": acc}


def draw_reliability(fig, cell, bins: dict[str, np.ndarray], title: str) -> None:
    """One diagram in the grid cell ``cell``: accuracy per confidence bin against the diagonal, the gap to it
    shaded, and under it the histogram of confidences with each bin's example count."""
    top, bottom = cell.subgridspec(2, 1, height_ratios=(3, 1), hspace=0.08).subplots(sharex=True)
    edges = np.linspace(0, 1, N_BINS + 1)
    width = 1 / N_BINS
    filled = bins["count"] > 0
    top.bar(
        edges[:-1][filled],
        bins["accuracy"][filled],
        width=width,
        align="edge",
        color="tab:blue",
        edgecolor="black",
        lw=0.4,
        label="accuracy",
    )
    gap = bins["confidence"][filled] - bins["accuracy"][filled]
    top.bar(
        edges[:-1][filled],
        gap,
        bottom=bins["accuracy"][filled],
        width=width,
        align="edge",
        color="tab:red",
        alpha=0.3,
        lw=0,
        label="gap to confidence",
    )
    top.plot([0, 1], [0, 1], "--", color="grey", lw=0.8)
    top.set(xlim=(0, 1), ylim=(0, 1))
    top.set_title(title, fontsize=8)
    top.set_ylabel("accuracy", fontsize=7)
    top.tick_params(labelsize=6)
    share = bins["count"] / max(bins["count"].sum(), 1)
    bottom.bar(edges[:-1], share, width=width, align="edge", color="grey", edgecolor="black", lw=0.3)
    top_share = max(float(share.max()), 1e-9)
    for left, count, height in zip(edges[:-1], bins["count"], share):
        if count:
            bottom.text(
                left + width / 2,
                height + 0.04 * top_share,
                f"{int(count)}",
                rotation=90,
                ha="center",
                va="bottom",
                fontsize=4.5,
            )
    bottom.set(xlim=(0, 1), ylim=(0, 1.6 * top_share))
    bottom.set_xlabel("confidence", fontsize=7)
    bottom.set_ylabel("share", fontsize=7)
    bottom.tick_params(labelsize=6)


def reliability_grid(panels: list[tuple[str, dict]], title: str, columns: int = 4):
    """The panels in rows of at most ``columns`` (a 1 x 9 strip is unreadable), each with its histogram."""
    columns = min(columns, len(panels))
    rows = -(-len(panels) // columns)
    fig = plt.figure(figsize=(2.7 * columns, 3.3 * rows))
    grid = fig.add_gridspec(rows, columns, hspace=0.45, wspace=0.35)
    for i, (label, bins) in enumerate(panels):
        draw_reliability(fig, grid[i // columns, i % columns], bins, label)
    fig.suptitle(title, fontsize=9)
    return fig


def reliability_figure(probs: np.ndarray, labels: np.ndarray, title: str = "", path: str | Path | None = None):
    """The reliability diagram of a predictive (N, C) on its labels (N,), one panel as ``reliability_grid`` draws
    it, named by its ECE; written to ``path`` (``write_figure``) when given. Returns the figure."""
    import torch

    from sve.metrics.scores import predictive_metrics

    probs, labels = np.asarray(probs, dtype=np.float64), np.asarray(labels)
    ece = predictive_metrics(torch.from_numpy(probs), torch.from_numpy(labels))["ece"]
    fig = reliability_grid([(f"ECE {100 * ece:.2f}%", reliability_bins(probs, labels))], title)
    if path is not None:
        write_figure(fig, path)
    return fig


# What severity_figure draws of a shift record's metrics: axis label and display scale (fractions in %).
SEVERITY_METRICS = {"acc": ("accuracy (%)", 100), "ece": ("ECE (%)", 100), "nll": ("NLL", 1), "brier": ("Brier", 1)}


def severity_figure(
    by_severity: dict, label: str | None = None, title: str = "", metrics=("acc", "ece", "nll"), fig=None
):
    """The metrics of a ``shift.by_severity`` record ({"0": the clean test set, "1".."5": the mean over
    corruptions}, as results.json and ``sve-eval`` write it) against the severity, one panel per metric. With
    ``fig`` (one this function drew) the curve is added to its panels, so several methods share one figure;
    ``label`` names the curve in the legend. Returns the figure."""
    severities = sorted(by_severity, key=int)
    if fig is None:
        fig, axes = plt.subplots(1, len(metrics), figsize=(3.6 * len(metrics), 3.0), squeeze=False)
        axes = axes[0]
        for ax, key in zip(axes, metrics):
            ax.set(xlabel="severity", ylabel=SEVERITY_METRICS[key][0], xticks=[int(s) for s in severities])
            ax.grid(alpha=0.3)
        if title:
            fig.suptitle(title, fontsize=9)
    else:
        axes = fig.axes[: len(metrics)]
    for ax, key in zip(axes, metrics):
        scale = SEVERITY_METRICS[key][1]
        ax.plot([int(s) for s in severities], [scale * by_severity[s][key] for s in severities], "o-", label=label)
        if label is not None:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


SHIFTED_PANELS = {
    "acc": ("accuracy (%)", 100),
    "ece": ("ECE (%)", 100),
    "nll": ("NLL", 1),
    "mutual_information": ("mutual information (nats)", 1),
}


def shifted_figure(sets: dict, title: str = "", metrics=tuple(SHIFTED_PANELS)):
    """The test set beside each shifted set (a results.json ``shifted.sets`` record: {set: {metric: value}}), one
    panel per metric, one bar per set; the temperature-scaled value of accuracy, ECE and NLL (with the run's own
    temperature) as a hollow bar beside it. Returns the figure."""
    names = list(sets)
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.0 * len(metrics), 3.0), squeeze=False)
    x = np.arange(len(names))
    for ax, key in zip(axes[0], metrics):
        label, scale = SHIFTED_PANELS[key]
        scaled = f"ts_{key}"
        width = 0.38 if all(scaled in sets[n] for n in names) else 0.7
        ax.bar(x - (width / 2 if width < 0.5 else 0), [scale * sets[n][key] for n in names], width, label="raw")
        if width < 0.5:
            values = [scale * sets[n][scaled] for n in names]
            ax.bar(x + width / 2, values, width, fill=False, hatch="//", label="run's temperature")
        ax.set(ylabel=label, xticks=x, xticklabels=names)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig
