"""Writes the tables and figures of the paper's definitions (``sve/configs/tables``) from the result files: the
table builder's entry (``sve-tables``, ``make tables``, ``make mini-tables``)."""

from __future__ import annotations

from pathlib import Path

from sve.errors import InputError
from sve.paper import figures, render
from sve.paper.report import conformal_table, cost_table, metric_table
from sve.paper.store import MINI, definition_path, load_runs, load_spec, results_root, table_names
from sve.paths import results_root as store_root


def build(name: str, smoke: bool = False, root: Path | None = None, with_paper: bool = True) -> list[Path]:
    """Writes the outputs of one table or figure definition from the result files; returns their paths."""
    spec = load_spec(name, smoke)
    root = results_root(smoke, root)
    runs = load_runs(root)
    written = []
    if spec.kind in ("metrics", "figure2"):
        table = metric_table(spec, runs, root, with_paper)
        written += render.write_table(table, root / "tables")
        written += figures.reliability_diagrams(spec, runs, root / "figures")
        written += figures.learning_curves(spec, runs, root / "figures")
        if spec.kind == "figure2":
            written += figures.figure2(table, root / "figures")
    elif spec.kind == "cost":
        written += render.write_table(cost_table(spec, root, with_paper), root / "tables")
    elif spec.kind == "conformal":
        written += render.write_table(conformal_table(spec, runs, root, smoke), root / "tables")
    elif spec.kind == "figure3":
        written += figures.figure3(spec, runs, root)
    elif spec.kind == "figureB":
        written += figures.figure_b(spec, runs, root / "figures")
    else:
        raise InputError(
            f"{definition_path(name)}: kind={spec.kind!r} is not a kind of table; choose one of "
            "metrics, cost, conformal, figure2, figure3, figureB"
        )
    return written


def build_all(smoke: bool = False, root: Path | None = None, with_paper: bool = True) -> list[Path]:
    """Every table of the results root: the paper's under ``results/``, the miniature's under
    ``results/mini/`` (``make mini-tables``)."""
    mini = store_root(root).name == MINI
    names = [n for n in table_names() if n.startswith(f"{MINI}_") == mini]
    return [path for name in names for path in build(name, smoke, root, with_paper)]
