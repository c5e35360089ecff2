"""What a claim's check reads from the runs: a row's cell of a metric, and the bootstrap terms of differences."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from sve.paper import bootstrap, conformal_splits
from sve.paper.display import METRICS, Metric
from sve.paper.report import Cell, aggregate
from sve.paper.store import Run, parse_row, select
from sve.runs import prediction_files

log = logging.getLogger(__name__)

MISSING = "predictive files missing"
REPLACED = "combined"  # the interval procedure the verdicts used before the coverage grid ("What changed")
# A per-example file's metric must equal results.json's to this (stored units): the files keep nll and brier in
# float32 (about 1e-7) and the OOD curve is float32 in torchmetrics (about 1e-6); a stale file differs by far more.
AGREE = 1e-5
BOOTSTRAP = {"replicates": bootstrap.REPLICATES, "level": bootstrap.LEVEL, "seed": bootstrap.SEED}


@dataclass(frozen=True)
class Difference:
    """A's advantage over B in display units (positive: A better in the metric's direction), with its
    interval (``low``, ``high``) when the per-example files allow one; ``training`` False when the interval
    leaves out the seeds' training variance (a row with one seed)."""

    point: float
    low: float | None = None
    high: float | None = None
    training: bool = True
    p: float | None = None  # the two-sided p-value the interval inverts (sve.paper.bootstrap.p_value)

    def text(self, digits: int) -> str:
        body = f"{self.point:+.{digits}f}"
        return body if self.low is None else f"{body} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"


class Terms(list):
    """The bootstrap terms of a difference, and the seeds it leaves out for want of per-example files."""

    def __init__(self, terms=(), left_out: tuple[int, ...] = ()):
        super().__init__(terms)
        self.left_out = left_out


def seeds_note(*terms) -> str | None:
    left_out = sorted({s for t in terms if isinstance(t, Terms) for s in t.left_out})
    if not left_out:
        return None
    return f"difference and interval without seed{'s' * (len(left_out) > 1)} {', '.join(map(str, left_out))}: {MISSING}"


def metric_of(key: str) -> tuple[Metric, str | None]:
    """The metric (direction, scale, digits) of ``key`` and the shift severity it is read at, if any."""
    severity = None
    if key.startswith("sev"):
        level, _, key = key.partition("/")
        severity = level[3:]
    if key not in METRICS:
        raise ValueError(f"unknown metric {key!r}; choose one of {sorted(METRICS)} (or sev<k>/<metric>)")
    return METRICS[key], severity


def run_value(run: Run, metric: Metric, severity: str | None) -> float | None:
    if severity is None:
        return run.metric(metric.key)
    value = ((run.results.get("shift") or {}).get("by_severity") or {}).get(severity, {}).get(metric.key)
    return float(value) if isinstance(value, (int, float)) else None


def cell(runs: list[Run], experiment: str, row: str, key: str) -> Cell | None:
    """The table's cell of one metric of one row (mean and spread over seeds, display units); None without
    runs."""
    metric, severity = metric_of(key)
    method, members = parse_row(row)
    values = [
        v
        for r in select(runs, experiment, method, members).values()
        if (v := run_value(r, metric, severity)) is not None
    ]
    return aggregate(values, metric, expected=0)


def improvement(a: Cell, b: Cell, metric: Metric) -> float:
    """How much ``a`` is better than ``b`` in the metric's direction (negative: worse)."""
    return (a.mean - b.mean) if metric.higher_is_better else (b.mean - a.mean)


def within_noise(a: Cell, b: Cell, difference: float) -> bool:
    spread = max(a.std or 0.0, b.std or 0.0)
    return one_seed(a, b) or abs(difference) <= spread


def one_seed(*cells: Cell) -> bool:
    """A cell has a single seed, so the seeds' spread is unknown: no difference is clear of it."""
    return min(c.seeds for c in cells) < 2


# --- intervals from the per-example files ----------------------------------------------------------------


def set_names(run: Run, severity: str | None, key: str) -> list[str]:
    """The evaluation sets a metric reads: test (and ood for the OOD metrics), or a severity's corruption sets
    as results.json lists them (severity 0 is the clean test set)."""
    if severity is None:
        return (
            [prediction_files.TEST, prediction_files.OOD] if key in bootstrap.OOD_METRICS else [prediction_files.TEST]
        )
    if severity == "0":
        return [prediction_files.TEST]
    by_corruption = (run.results.get("shift") or {}).get("by_corruption") or {}
    return sorted(f"shift/{c}/{severity}" for c, per in by_corruption.items() if severity in per)


class Evidence:
    """The runs' per-example files (``sve.paper.bootstrap``), each read once per report, and the intervals of the
    differences between rows."""

    def __init__(self, runs: list[Run], options: dict | None = None):
        self.runs = runs
        options = {**BOOTSTRAP, **(options or {})}
        unknown = sorted(set(options) - set(BOOTSTRAP))
        if unknown:
            raise ValueError(f"bootstrap options {unknown} are not valid; choose among {sorted(BOOTSTRAP)}")
        self.replicates, self.level = int(options["replicates"]), float(options["level"])
        self.seed = int(options["seed"])
        self._sets: dict[Path, prediction_files.Examples | None] = {}
        self._statistics: dict[tuple[Path, str], bootstrap.Statistic | str] = {}

    def examples(self, run: Run, name: str) -> prediction_files.Examples | None:
        path = run.path.parent / prediction_files.PREDICTIVE / f"{name}.npz"
        if path not in self._sets:
            self._sets[path] = prediction_files.read_predictive(path, name)
        return self._sets[path]

    def statistic(self, run: Run, key: str) -> bootstrap.Statistic | str:
        """The run's metric ``key`` as a function of resampling weights, or why there is none."""
        if (run.path, key) not in self._statistics:
            self._statistics[run.path, key] = self._statistic(run, key)
        return self._statistics[run.path, key]

    def _statistic(self, run: Run, key: str) -> bootstrap.Statistic | str:
        metric, severity = metric_of(key)
        if metric.key not in bootstrap.KEYS:
            return f"no per-example statistic for {metric.key}"
        names = set_names(run, severity, metric.key)
        sets = [self.examples(run, name) for name in names]
        if not names or any(s is None for s in sets):
            return MISSING
        if metric.key in conformal_splits.NEEDS_DISAGREEMENT and not all(map(conformal_splits.has_disagreement, sets)):
            return MISSING  # a file written before the members' disagreement was kept beside the predictive
        found = bootstrap.statistic(metric.key, sets)
        expected = run_value(run, metric, severity)
        if expected is None or not abs(found.value() - expected) <= AGREE:
            log.warning(
                "%s: %s from the per-example files is %r, results.json has %r; no interval",
                run.path.parent,
                key,
                found.value(),
                expected,
            )
            return f"{run.path.parent}/{prediction_files.PREDICTIVE} disagrees with results.json on {key}"
        return found

    def advantage(self, experiment: str, a: str, b: str, key: str) -> list[bootstrap.Term] | str:
        """The terms of A's advantage over B in display units, averaged over the seeds; or why there are none."""
        metric = metric_of(key)[0]
        rows = []
        for row in (a, b):
            runs = select(self.runs, experiment, *parse_row(row))
            rows.append({seed: self.statistic(run, key) for seed, run in runs.items()})
        if set(rows[0]) != set(rows[1]):
            return f"the rows have different seeds ({sorted(rows[0])} against {sorted(rows[1])})"
        reasons = sorted({v for row in rows for v in row.values() if isinstance(v, str)})
        # A seed whose per-example files are missing (a run trained before they were written) is left out of the
        # interval, and the verdict says so; any other reason (a file that disagrees with results.json) voids it.
        usable = sorted(s for s in rows[0] if not isinstance(rows[0][s], str) and not isinstance(rows[1][s], str))
        if not usable or set(reasons) - {MISSING}:
            return "; ".join(reasons)
        coef = metric.scale * (1.0 if metric.higher_is_better else -1.0) / len(usable)
        terms = Terms(left_out=tuple(s for s in sorted(rows[0]) if s not in usable))
        unit = f"{experiment}: {a} vs {b}"  # the seeds of one advantage: their spread is its training variance
        for seed in usable:
            bootstrap.check_paired(rows[0][seed], rows[1][seed])
            terms += [bootstrap.Term(coef, seed, rows[0][seed], unit), bootstrap.Term(-coef, seed, rows[1][seed], unit)]
        return terms

    def own(self, experiment: str, row: str, key: str) -> list[bootstrap.Term] | str:
        """The terms of one row's own metric in display units, averaged over its seeds (a metric that is itself a
        difference within each run, e.g. ``growth_90``, judged against 0); or why there are none."""
        metric = metric_of(key)[0]
        found = {seed: self.statistic(run, key) for seed, run in select(self.runs, experiment, *parse_row(row)).items()}
        reasons = sorted({v for v in found.values() if isinstance(v, str)})
        usable = sorted(s for s, v in found.items() if not isinstance(v, str))
        if not usable or set(reasons) - {MISSING}:
            return "; ".join(reasons) or "no runs"
        coef = metric.scale * (1.0 if metric.higher_is_better else -1.0) / len(usable)
        unit = f"{experiment}: {row}"
        return Terms(
            [bootstrap.Term(coef, seed, found[seed], unit) for seed in usable],
            left_out=tuple(s for s in sorted(found) if s not in usable),
        )

    def difference(self, terms: list[bootstrap.Term]) -> tuple[Difference, Difference]:
        """The difference with the verdicts' interval, and with the interval of the procedure it replaced
        (``combined``, on the same draws)."""
        found = bootstrap.intervals(terms, (bootstrap.VERDICTS, REPLACED), self.replicates, self.level, self.seed)
        now, before = found[bootstrap.VERDICTS], found[REPLACED]
        return (
            Difference(now.point, now.low, now.high, now.training, now.p),
            Difference(before.point, before.low, before.high, before.training, before.p),
        )


__all__ = ["Difference", "Evidence", "cell"]
