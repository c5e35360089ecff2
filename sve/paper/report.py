"""The paper's tables from stored result files: ``sve-tables [--smoke] [table1 ...]``.

A table is defined once in ``configs/tables/<name>.yaml`` (its experiments, rows of method and member count,
seeds and metrics; the sweep driver ``sve.paper.sweep`` trains the same grid). The builder reads only the
``results.json`` files under a results root, never a live model:

- a run belongs to the cell (experiment, method, members): ``experiment`` is results.json's top-level key or
  the config's ``experiment_name`` (set by every ``configs/experiment/`` file); members are the members or
  samples that produced the predictive (``num_members``, else the method's ``num_samples``, else
  ``ensemble_size``);
- each cell is the mean ± sample standard deviation (ddof 1) over the seeds found; one seed shows no ±, and
  a cell with fewer seeds than the table asks for is marked with †;
- within each experiment the best displayed value of each column is bold and the second best underlined,
  in the metric's direction (acc, AUROC, AUPRC up; ECE, NLL, Brier, FPR95 and costs down);
- a run that is not there is "–" and listed under the table; the paper's numbers (``sve/configs/paper/``) sit in
  their own column and never fill one of ours.

Outputs: ``<root>/tables/<name>.md``, ``.tex`` and ``.csv`` (``<root>`` is ``results/`` or
``results/smoke/``), figures under ``<root>/figures/`` (``sve.paper.figures``).
"""

from __future__ import annotations

import csv
import logging
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig

from sve.errors import InputError
from sve.paper import conformal_splits
from sve.paper.display import METHOD_NAMES, METRICS, Metric
from sve.paper.store import (
    TUNED,
    Run,
    load_spec,
    run_dir,
    select,
)
from sve.paths import CONFIGS, shown
from sve.runs.results import read_json

log = logging.getLogger(__name__)

# --- cells and tables ------------------------------------------------------------------------------------


@dataclass
class Cell:
    mean: float
    std: float | None  # None: one value, or the paper printed none
    seeds: int
    short: bool = False  # fewer seeds than the table asks for
    mark: str | None = None  # "best" | "second"

    def text(self, metric: Metric) -> str:
        body = f"{self.mean:.{metric.digits}f}"
        if self.std is not None:
            body += f" ± {self.std:.{metric.digits}f}"
        return body + ("†" if self.short else "")


def aggregate(values: list[float], metric: Metric, expected: int) -> Cell | None:
    if not values:
        return None
    shown = [v * metric.scale for v in values]
    std = statistics.stdev(shown) if len(shown) > 1 else None
    return Cell(statistics.fmean(shown), std, len(shown), short=len(shown) < expected)


EDGE_MARK = "‡"  # after a method whose tuned value was left on an edge of its grid (tuned_edge)


@dataclass
class Row:
    method: str
    members: int
    cells: dict[str, Cell | None]
    paper: dict[str, Cell | None] = field(default_factory=dict)
    edge: str | None = None  # the tuned value lies on this edge of its searched grid ("lower" | "upper")

    @property
    def label(self) -> str:
        return METHOD_NAMES.get(self.method, self.method) + (EDGE_MARK if self.edge else "")


@dataclass
class Block:
    experiment: str
    title: str
    rows: list[Row]


@dataclass
class Table:
    name: str
    title: str
    metrics: list[Metric]
    blocks: list[Block]
    seeds: list[int]
    missing: list[str]  # one line per cell with absent seeds, naming the run directories
    notes: list[str]
    paper_source: str | None  # the reference file, when its column is shown


def tuned_edge(row_dir: Path) -> tuple[str, str] | None:
    """(key, edge) when the row's tuned.json records its choice on an edge of the searched grid: the tuning
    could not grow past it, so the value is no tuned optimum, and the table says so."""
    path = row_dir / TUNED
    if not path.is_file():
        return None
    choice = read_json(path, "delete it to tune the row again (the sweep rewrites it)")
    return (choice.get("key", "the tuned value"), choice["edge"]) if choice.get("edge") else None


def mark_best(rows: list[Row], metrics: list[Metric]) -> None:
    """Bold (best) and underline (second best) per column, on the values as displayed (ties share a mark);
    none in a column without a direction."""
    for metric in metrics:
        if metric.higher_is_better is None:
            continue
        cells = [row.cells.get(metric.key) for row in rows]
        shown = sorted({round(c.mean, metric.digits) for c in cells if c}, reverse=metric.higher_is_better)
        for cell in filter(None, cells):
            rank = shown.index(round(cell.mean, metric.digits))
            cell.mark = {0: "best", 1: "second"}.get(rank)


def read_paper(path: Path) -> dict[tuple, dict[str, str]]:
    """sve/configs/paper/<table>.csv keyed by (experiment, method, members); blank members match any count."""
    with path.open() as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    return {(r["experiment"], r["method"], r["members"]): r for r in rows}


def paper_numbers(spec: DictConfig, with_paper: bool) -> tuple[dict, str | None]:
    """The paper's rows for a table (``paper``: one CSV or a list, the first file's row winning) and the
    files' names as shown under it; nothing when the table has no paper column."""
    names = spec.get("paper") if with_paper else None
    paths = [paper_path(spec, str(n)) for n in ([names] if isinstance(names, str) else list(names or []))]
    paper: dict = {}
    for path in paths:
        paper = {**read_paper(path), **paper}
    return paper, (", ".join(shown(p) for p in paths) or None) if paper else None


def paper_path(spec: DictConfig, name: str) -> Path:
    """A ``paper:`` file beside the definition (one's own table and its CSV), else under ``sve/configs/``.
    One that is in neither is an error: skipped, the table would be built without its paper column, silently."""
    source = spec.get("source")
    candidates = ([Path(source).parent / name] if source else []) + [CONFIGS / name]
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        raise InputError(
            f"{source or spec.name}: paper: {name} is not a file (looked for "
            f"{', '.join(str(p) for p in candidates)}); fix the path or remove the key, or pass "
            "sve-tables --no-paper"
        )
    return found


def paper_cells(
    paper: dict, experiment: str, method: str, members: int, metrics: list[Metric], any_members: bool = False
) -> dict:
    """The paper's cells of one row; ``any_members``: failing an exact match, the paper's row of the method
    whatever its member count (a miniature compared with the paper's setting, e.g. M = 4 against M = 8)."""
    row = paper.get((experiment, method, str(members))) or paper.get((experiment, method, ""))
    if row is None and any_members:
        row = next((r for (e, m, _), r in paper.items() if (e, m) == (experiment, method)), None)
    if row is None:
        return {}
    cells = {}
    for metric in metrics:
        if row.get(metric.key):  # stored as printed in the paper: no scaling
            std = row.get(f"{metric.key}_std")
            cells[metric.key] = Cell(float(row[metric.key]), float(std) if std else None, seeds=0)
    return cells


def metric_table(spec: DictConfig, runs: list[Run], root: Path, with_paper: bool = True) -> Table:
    """The cells of a table from the runs found; absent runs become "–" and are listed."""
    metrics = [METRICS[k] for k in spec.metrics]
    seeds = list(spec.seeds)
    paper, paper_source = paper_numbers(spec, with_paper)
    blocks, missing, edges = [], [], []
    for experiment, title in spec.experiments.items():
        rows = []
        for row_spec in spec.rows:
            method, members = row_spec.method, int(row_spec.members)
            found = select(runs, experiment, method, members)
            absent = [s for s in seeds if s not in found]
            if absent:
                where = run_dir(root, experiment, method, members, absent[0]).parent
                missing.append(
                    f"{experiment} · {METHOD_NAMES.get(method, method)} (M={members}): seed"
                    f"{'s' if len(absent) > 1 else ''} {', '.join(map(str, absent))} ({where})"
                )
            used = [found[s] for s in sorted(found)]
            cells = {}
            for m in metrics:
                values = [v for v in (r.metric(m.key) for r in used) if v is not None]
                cells[m.key] = aggregate(values, m, len(seeds))
            # A miniature names the paper's experiment it stands for (paper_as: {ours: the paper's}).
            paper_experiment = (spec.get("paper_as") or {}).get(experiment)
            shown = paper_cells(
                paper,
                paper_experiment or experiment,
                method,
                members,
                metrics,
                any_members=paper_experiment is not None,
            )
            edge = tuned_edge(run_dir(root, experiment, method, members, seeds[0] if seeds else 0).parent)
            if edge:
                edges.append(
                    f"{EDGE_MARK} {experiment} · {METHOD_NAMES.get(method, method)} (M={members}): "
                    f"{edge[0]} chosen on the {edge[1]} edge of its searched grid, which could not grow "
                    "further (tuned.json): not an interior optimum"
                )
            rows.append(Row(method, members, cells, shown, edge=edge and edge[1]))
        mark_best(rows, metrics)
        blocks.append(Block(experiment, title, rows))
    return Table(
        spec.name, spec.title, metrics, blocks, seeds, missing, [*edges, *(spec.get("notes") or [])], paper_source
    )


def conformal_table(spec: DictConfig, runs: list[Run], root: Path, smoke: bool = False) -> Table:
    """The conformal table (``kind: conformal``): one block per experiment of the tables named in ``of``, with
    the rows those tables give it (each cell over the seeds its table asks for), in the definition's metrics;
    the set metrics are computed from each run's saved test predictive (``sve.paper.conformal_splits``). A run
    without that file leaves its cell short (†), and the notes name it."""
    blocks: dict[str, Block] = {}
    missing, notes, unread = [], [], []
    for name in spec.of:
        source = load_spec(str(name), smoke)
        source.metrics, source.paper = list(spec.metrics), None
        table = metric_table(source, runs, root, with_paper=False)
        missing += [m for m in table.missing if m not in missing]
        notes += [n for n in table.notes if n.startswith(EDGE_MARK) and n not in notes]
        for block in table.blocks:
            title = f"{block.title} ({block.experiment})"  # two sources title their random-init blocks alike
            shown = blocks.setdefault(block.experiment, Block(block.experiment, title, []))
            known = {(r.method, r.members) for r in shown.rows}
            shown.rows += [r for r in block.rows if (r.method, r.members) not in known]
            for row in block.rows:
                for run in select(runs, block.experiment, row.method, row.members).values():
                    where = shown_path(run.path.parent, root)
                    if conformal_splits.run_metric(run.path.parent, "set_size_90") is None and where not in unread:
                        unread.append(where)
    for block in blocks.values():
        mark_best(block.rows, [METRICS[k] for k in spec.metrics])
    if unread:
        notes.append(f"No saved test predictive (evaluated before those files were written): {', '.join(unread)}.")
    return Table(
        spec.name,
        spec.title,
        [METRICS[k] for k in spec.metrics],
        list(blocks.values()),
        [],
        missing,
        [*(spec.get("notes") or []), *notes],
        None,
    )


def shown_path(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


# --- Table 5: cost from results/bench/table5.json ----------------------------------------------------------


def cost_runs(bench: dict) -> dict[str, dict[str, float]]:
    """Overheads of each method relative to the ``single`` entry of a table5.json (schema in its docstring).

    table5.json: {"setting": {...free-form: backbone, ensemble_size, batch_size, sequence_length, device...},
    "methods": {"<method>": {"parameters": int, "trainable_parameters": int, "train_memory_bytes": int,
    "infer_memory_bytes": int, "infer_gflops": float, "infer_ms": float}}} with "single" among the methods;
    every number measured in one process. Overheads are 100 * (method - single) / single. Parameters are
    reported twice, since they differ by far for SVE: stored (``parameters``, SVE's frozen U and V included)
    as an overhead over the single model's, and trainable as a share of the single model's parameters
    (absent from a file written before trainable counts were recorded).
    """
    methods = bench["methods"]
    base = methods["single"]
    pct = lambda key, m: 100.0 * (m[key] - base[key]) / base[key]  # noqa: E731
    out = {}
    for name, m in methods.items():
        if name == "single":
            continue
        out[name] = {
            "param_overhead_pct": pct("parameters", m),
            **(
                {"trainable_param_pct": 100.0 * m["trainable_parameters"] / base["parameters"]}
                if "trainable_parameters" in m
                else {}
            ),
            "train_memory_overhead_pct": pct("train_memory_bytes", m),
            "infer_memory_overhead_pct": pct("infer_memory_bytes", m),
            "infer_gflops": float(m["infer_gflops"]),
            "infer_ms": float(m["infer_ms"]),
        }
    return out


def read_bench(path: Path, table: str) -> dict[str, dict[str, float]]:
    """``cost_runs`` of a benchmark file; an ``InputError`` naming it when it is not valid JSON or not of the
    schema of ``cost_runs``."""
    fix = f"delete it to measure again (sve-sweep {table} --measure)"
    bench = read_json(path, fix)
    try:
        return cost_runs(bench)
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as err:
        raise InputError(
            f"{path} is not a benchmark file of this framework ({type(err).__name__}: {err}); expected "
            '{"setting": {...}, "methods": {"single": {...}, ...}} with parameters, train_memory_bytes, '
            f"infer_memory_bytes, infer_gflops and infer_ms for each method; {fix}"
        ) from None


def cost_table(spec: DictConfig, root: Path, with_paper: bool = True) -> Table:
    """Table 5: one block, one row per method; "–" everywhere while the benchmark file is absent."""
    bench_path = root / spec.bench
    measured = read_bench(bench_path, spec.name) if bench_path.exists() else {}
    metrics = [METRICS[k] for k in spec.metrics]
    paper, paper_source = paper_numbers(spec, with_paper)
    ((experiment, title),) = spec.experiments.items()
    rows, missing = [], []
    for row_spec in spec.rows:
        method, members = row_spec.method, int(row_spec.members)
        values = measured.get(method, {})
        cells = {m.key: aggregate([values[m.key]], m, 1) if m.key in values else None for m in metrics}
        if not values:
            missing.append(f"{METHOD_NAMES.get(method, method)} (M={members}): not in {bench_path}")
        rows.append(Row(method, members, cells, paper_cells(paper, experiment, method, members, metrics)))
    mark_best(rows, metrics)
    return Table(
        spec.name,
        spec.title,
        metrics,
        [Block(experiment, title, rows)],
        [],
        missing,
        list(spec.get("notes") or []),
        paper_source,
    )
