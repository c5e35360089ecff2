"""The paper's tables from stored result files: ``python scripts/build_tables.py [--smoke] [table1 ...]``.

A table is defined once in ``configs/tables/<name>.yaml`` (its experiments, rows of method and member count,
seeds and metrics; the sweep driver ``sve.sweep`` trains the same grid). The builder reads only the
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
``results/smoke/``), figures under ``<root>/figures/`` (``sve.figures``).
"""

from __future__ import annotations

import csv
import logging
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from sve.errors import InputError
from sve.paths import CONFIGS, TABLES, shown
from sve.paths import results_root as store_root
from sve.results import UnreadableFile, read_json, read_results

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent  # a source checkout's root: only tests and scripts read it
SMOKE = "smoke"  # results/smoke/: the CPU-sized variant of every target, never mixed into the real tables


@dataclass(frozen=True)
class Metric:
    key: str  # results.json metrics key without the "test/" prefix
    label: str
    higher_is_better: bool | None  # None: a description, not a score (no best or second best)
    scale: float  # displayed value = stored value * scale (fractions are printed in %, as the paper does)
    digits: int

    @property
    def arrow(self) -> str:
        return {True: "↑", False: "↓", None: ""}[self.higher_is_better]


METRICS = {
    m.key: m
    for m in (
        Metric("acc", "Acc (%)", True, 100, 1),
        Metric("ece", "ECE (%)", False, 100, 1),
        Metric("nll", "NLL", False, 1, 2),
        Metric("brier", "Brier", False, 1, 2),
        Metric("ood_auroc", "AUROC (%)", True, 100, 1),
        Metric("ood_auprc", "AUPRC (%)", True, 100, 1),
        Metric("ood_fpr95", "FPR95 (%)", False, 100, 1),
        # Table 5, from results/bench/table5.json, relative to the single model (sve.report.cost_runs).
        Metric("param_overhead_pct", "Param. overhead (%)", False, 1, 1),
        Metric("train_memory_overhead_pct", "Train memory overhead (%)", False, 1, 1),
        Metric("infer_memory_overhead_pct", "Infer. memory overhead (%)", False, 1, 1),
        Metric("infer_gflops", "Infer. GFLOPs", False, 1, 1),
        Metric("infer_ms", "Infer. time (ms)", False, 1, 1),
        # Beyond the paper (sve.evaluation), for tables that list them beside the paper's columns.
        Metric("ts_acc", "TS Acc (%)", True, 100, 1),
        Metric("ts_ece", "TS ECE (%)", False, 100, 1),
        Metric("ts_nll", "TS NLL", False, 1, 2),
        Metric("temperature", "T", None, 1, 2),
        Metric("disagreement", "Disagr. (%)", None, 100, 1),
        Metric("mutual_information", "MI (nats)", None, 1, 3),
    )
}

# The paper's names for the methods (its tables' row labels).
METHOD_NAMES = {
    "single": "Single",
    "svf": "Single w/ SVF",
    "single_lora": "Single w/ LoRA",
    "mc_dropout": "MC Dropout",
    "deep_ensemble": "Deep Ensemble",
    "batch_ensemble": "Batch Ensemble",
    "lora_ensemble": "LoRA-Ensemble",
    "bayes_lora_llla": "Bayes-LoRA (LLLA)",
    "bayes_lora_la": "Bayes-LoRA (LA)",
    "blob": "Blob",
    "last_layer_ensemble": "Last-Layer Ensemble",
    "checkpoint_ensemble": "Ckpt Ensemble",
    "sve": "SV-Ensemble",
}


# --- table definitions ---------------------------------------------------------------------------------


def table_names() -> list[str]:
    return sorted(p.stem for p in TABLES.glob("*.yaml"))


def load_spec(name: str, smoke: bool = False) -> DictConfig:
    """``configs/tables/<name>.yaml``; with ``smoke`` its ``smoke`` block replaces the keys it names."""
    path = TABLES / f"{name}.yaml"
    if not path.exists():
        raise InputError(f"no table definition {path}: {name!r} is not a table; choose one of {table_names()}")
    spec = OmegaConf.load(path)
    for key, value in (spec.get("smoke") or {}).items() if smoke else ():
        spec[key] = value  # replaced, not merged: a smoke block's experiments or rows are the whole list
    spec.name = name
    return spec


def results_root(smoke: bool = False, root: Path | None = None) -> Path:
    """The store (``sve.paths.results_root``: ``root``, else ``$SVE_RESULTS``, else ``./results``), or its
    smoke store."""
    root = store_root(root)
    return root / SMOKE if smoke else root


def run_dir(root: Path, experiment: str, method: str, members: int, seed: int) -> Path:
    """The stable directory of one run: a rerun of a sweep finds it (sve.sweep skips it when done)."""
    return root / "runs" / experiment / f"{method}_m{members}" / f"seed{seed}"


# --- runs ----------------------------------------------------------------------------------------------


@dataclass
class Run:
    path: Path
    experiment: str | None
    method: str
    members: int
    seed: int
    results: dict

    def metric(self, key: str) -> float | None:
        value = self.results.get("metrics", {}).get(f"test/{key}")
        return float(value) if isinstance(value, (int, float)) else None


def members_of(results: dict) -> int:
    """Members or samples that produced the predictive (num_members when the run records it)."""
    if "num_members" in results:
        return int(results["num_members"])
    report = results.get("method_report") or {}
    if "num_samples" in report:  # sampled methods (MC dropout, Bayes-LoRA, BLoB) record their samples here
        return int(report["num_samples"])
    return int(results["ensemble_size"])


_reported: set[Path] = set()  # unreadable result files this process has reported already


def first_report(path: Path) -> bool:
    """True the first time this process reports the unreadable file ``path`` (a sweep that reported a run's
    results.json as failed calls it too, so that the tables built after it do not say it again)."""
    key = Path(path).absolute()
    new = key not in _reported
    _reported.add(key)
    return new


def load_runs(root: Path) -> list[Run]:
    """Every results.json under ``root`` (``root/smoke`` excluded unless it is the root itself). A file that
    is not valid JSON (``sve.results.read_results``) or lacks the keys of a run is skipped with a warning
    naming it and what to do (once per file and process); its cell stays empty and listed as missing."""
    runs = []
    root = Path(root)
    for path in sorted(root.rglob("results.json")):
        parts = path.relative_to(root).parts
        if parts[0] == SMOKE or "tune" in parts[:-1]:  # smoke runs; tuning runs (the chosen one is copied)
            continue
        try:
            results = read_results(path)
            config = results.get("config") or {}
            experiment = results.get("experiment") or config.get("experiment_name")
            runs.append(Run(path, experiment, results["method"], members_of(results), int(results["seed"]), results))
        except UnreadableFile as err:
            if first_report(path):
                log.warning("skipping a run: %s", err)
        except (ValueError, KeyError, TypeError) as err:
            if first_report(path):
                log.warning("skipping %s: not the results of a run (%s: %s); %s", path, type(err).__name__, err,
                            "delete it (or its run directory) to run that run again")  # fmt: skip
    return runs


def parse_row(text: str) -> tuple[str, int]:
    """A row named as ``method:members`` (``sve:4``) -> ("sve", 4); claims and ``tune_as`` name rows so."""
    method, _, members = str(text).partition(":")
    if not method or not members.isdigit():
        raise ValueError(f"row {text!r} must read method:members, e.g. sve:4")
    return method, int(members)


def select(runs: list[Run], experiment: str, method: str, members: int) -> dict[int, Run]:
    """The runs of one cell by seed; a seed found twice keeps the first path in sorted order."""
    found: dict[int, Run] = {}
    for run in runs:
        if (run.experiment, run.method, run.members) == (experiment, method, members):
            if run.seed in found:
                log.warning("seed %d of %s/%s/M=%d twice: using %s, not %s", run.seed, experiment, method, members,
                            found[run.seed].path, run.path)  # fmt: skip
                continue
            found[run.seed] = run
    return found


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


@dataclass
class Row:
    method: str
    members: int
    cells: dict[str, Cell | None]
    paper: dict[str, Cell | None] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return METHOD_NAMES.get(self.method, self.method)


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
    paths = [CONFIGS / n for n in ([names] if isinstance(names, str) else list(names or []))]
    paper: dict = {}
    for path in (p for p in paths if p.exists()):
        paper = {**read_paper(path), **paper}
    return paper, (", ".join(shown(p) for p in paths if p.exists()) or None) if paper else None


def paper_cells(paper: dict, experiment: str, method: str, members: int, metrics: list[Metric],
                any_members: bool = False) -> dict:
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
    blocks, missing = [], []
    for experiment, title in spec.experiments.items():
        rows = []
        for row_spec in spec.rows:
            method, members = row_spec.method, int(row_spec.members)
            found = select(runs, experiment, method, members)
            absent = [s for s in seeds if s not in found]
            if absent:
                where = run_dir(root, experiment, method, members, absent[0]).parent
                missing.append(f"{experiment} · {METHOD_NAMES.get(method, method)} (M={members}): seed"
                               f"{'s' if len(absent) > 1 else ''} {', '.join(map(str, absent))} ({where})")  # fmt: skip
            used = [found[s] for s in sorted(found)]
            cells = {}
            for m in metrics:
                values = [v for v in (r.metric(m.key) for r in used) if v is not None]
                cells[m.key] = aggregate(values, m, len(seeds))
            # A miniature names the paper's experiment it stands for (paper_as: {ours: the paper's}).
            paper_experiment = (spec.get("paper_as") or {}).get(experiment)
            shown = paper_cells(paper, paper_experiment or experiment, method, members, metrics,
                                any_members=paper_experiment is not None)  # fmt: skip
            rows.append(Row(method, members, cells, shown))
        mark_best(rows, metrics)
        blocks.append(Block(experiment, title, rows))
    return Table(spec.name, spec.title, metrics, blocks, seeds, missing, list(spec.get("notes") or []),
                 paper_source)


# --- Table 5: cost from results/bench/table5.json ----------------------------------------------------------


def cost_runs(bench: dict) -> dict[str, dict[str, float]]:
    """Overheads of each method relative to the ``single`` entry of a table5.json (schema in its docstring).

    table5.json: {"setting": {...free-form: backbone, ensemble_size, batch_size, sequence_length, device...},
    "methods": {"<method>": {"parameters": int, "train_memory_bytes": int, "infer_memory_bytes": int,
    "infer_gflops": float, "infer_ms": float}}} with "single" among the methods; every number measured in
    one process. Overheads are 100 * (method - single) / single.
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
            "train_memory_overhead_pct": pct("train_memory_bytes", m),
            "infer_memory_overhead_pct": pct("infer_memory_bytes", m),
            "infer_gflops": float(m["infer_gflops"]),
            "infer_ms": float(m["infer_ms"]),
        }
    return out


def read_bench(path: Path, table: str) -> dict[str, dict[str, float]]:
    """``cost_runs`` of a benchmark file; an ``InputError`` naming it when it is not valid JSON or not of the
    schema of ``cost_runs``."""
    fix = f"delete it to measure again (python scripts/sweep.py {table} --measure)"
    bench = read_json(path, fix)
    try:
        return cost_runs(bench)
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as err:
        raise InputError(f"{path} is not a benchmark file of this framework ({type(err).__name__}: {err}); expected "
                         '{"setting": {...}, "methods": {"single": {...}, ...}} with parameters, train_memory_bytes, '
                         f"infer_memory_bytes, infer_gflops and infer_ms for each method; {fix}") from None


def cost_table(spec: DictConfig, root: Path, with_paper: bool = True) -> Table:
    """Table 5: one block, one row per method; "–" everywhere while the benchmark file is absent."""
    bench_path = root / spec.bench
    measured = read_bench(bench_path, spec.name) if bench_path.exists() else {}
    metrics = [METRICS[k] for k in spec.metrics]
    paper, paper_source = paper_numbers(spec, with_paper)
    (experiment, title), = spec.experiments.items()
    rows, missing = [], []
    for row_spec in spec.rows:
        method, members = row_spec.method, int(row_spec.members)
        values = measured.get(method, {})
        cells = {m.key: aggregate([values[m.key]], m, 1) if m.key in values else None for m in metrics}
        if not values:
            missing.append(f"{METHOD_NAMES.get(method, method)} (M={members}): not in {bench_path}")
        rows.append(Row(method, members, cells, paper_cells(paper, experiment, method, members, metrics)))
    mark_best(rows, metrics)
    return Table(spec.name, spec.title, metrics, [Block(experiment, title, rows)], [], missing,
                 list(spec.get("notes") or []), paper_source)


# --- building ---------------------------------------------------------------------------------------------


def build(name: str, smoke: bool = False, root: Path | None = None, with_paper: bool = True) -> list[Path]:
    """Writes the outputs of one table or figure definition from the result files; returns their paths."""
    from sve import figures, render

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
    elif spec.kind == "figure3":
        written += figures.figure3(spec, runs, root)
    elif spec.kind == "figureB":
        written += figures.figure_b(spec, runs, root / "figures")
    else:
        raise InputError(f"{TABLES / name}.yaml: kind={spec.kind!r} is not a kind of table; choose one of "
                         "metrics, cost, figure2, figure3, figureB")
    return written


MINI = "mini"  # the miniature's tables (configs/tables/mini_*.yaml) live under results/mini/, the rest under results/


def build_all(smoke: bool = False, root: Path | None = None, with_paper: bool = True) -> list[Path]:
    """Every table of the results root: the paper's under ``results/``, the miniature's under
    ``results/mini/`` (``make mini-tables``)."""
    mini = store_root(root).name == MINI
    names = [n for n in table_names() if n.startswith(f"{MINI}_") == mini]
    return [path for name in names for path in build(name, smoke, root, with_paper)]
