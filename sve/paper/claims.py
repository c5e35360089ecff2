"""The paper's claims, checked against stored runs: ``python scripts/mini_report.py`` (``make mini-report``).

A claims file (``sve/configs/claims/<name>.yaml``) lists the paper's claims; each holds checks on the cells of
the tables (a cell: one experiment, method and member count, its test metric averaged over the seeds found,
exactly as ``sve.paper.report`` builds it). A check says which way the paper points and the verdict says whether
ours points the same way:

- ``compare``: row ``a`` against each row of ``against`` on each metric, ``expect`` one of ``better`` (the
  default), ``worse`` or ``at_least`` (better, or not distinguishable from it); ``similar`` gives metrics where
  ``a`` may trail by a tolerance in displayed units (accuracy "at similar accuracy").
- ``gain``: how much ``a`` improves on each row of ``against`` in the first experiment against the second
  (Fig. 2: more with pretrained weights than from random ones).
- ``trend``: ``rows`` in order (e.g. SVE at M = 1, 2, 4) each improving on the one before (Table 6).

A row is ``method:members`` (``sve:4``). A metric is a test metric key (``ece``, ``ood_auroc``) or
``sev<k>/<key>`` for the shift sets at severity k (the mean over corruptions, as Fig. 3 plots it).

Each comparison's *difference* is A's advantage over B in display units, positive when A is better in the
metric's direction: the table's difference of the two cells' means over the seeds. Its 95% interval is a
paired bootstrap over the test examples (``sve.paper.bootstrap``: resampled within each seed, the same examples for
both rows, the seeds' differences averaged in every replicate; 2000 replicates from a fixed seed, both set by
the claims file's ``bootstrap`` block). The verdict is three-way, "held", "reversed" or "unresolved":

- ``better``: held when the interval lies entirely above 0, reversed when entirely below 0, else unresolved;
  ``worse`` mirrors it;
- ``at_least``: reversed when the interval lies entirely below 0 (B better at 95%), else held (better, or
  not distinguishable from equal: what "at least as good" allows);
- ``similar`` with tolerance t: held when the interval lies entirely above -t (A trails by less than t),
  reversed when entirely below -t, else unresolved;
- ``gain``: the interval of (the advantage in the first experiment) minus (that in the second), both from one
  set of resamples where the experiments share a seed's test examples (independent ones otherwise); held,
  reversed or unresolved as for ``better``;
- ``trend``: one interval per step (each row against the one before); held when every step's lies above 0,
  reversed when any step's lies below 0, else unresolved (no correction for the number of steps).

A comparison whose runs lack the per-example files (runs evaluated before they were written:
``python -m sve.paper.bootstrap <results root>`` writes them from saved predictions where those still exist), whose
rows have different seeds, or whose file disagrees with results.json gets no interval: its verdict falls back
to the direction of the means ("held" or "not held"), "within seed noise" when the difference is at most the
larger of the two cells' standard deviations ("one seed: spread unknown" when a cell has one seed, which neither
counts as a clear difference nor lets an ``at_least`` check pass on a worse mean), and says why it has no
interval. Verdicts are computed, never
written by hand; a claim's ``note`` (hand-written, after reading the results) says why a direction did not
hold where a reason is known.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from sve.paper import bootstrap
from sve.paper.registry import METHOD_NAMES, METRICS, Metric
from sve.paper.report import Cell, aggregate
from sve.paper.store import Run, parse_row, select
from sve.paths import CLAIMS

log = logging.getLogger(__name__)

EXPECT = ("better", "worse", "at_least")
HELD, REVERSED, UNRESOLVED, NOT_HELD = "held", "reversed", "unresolved", "not held"
MISSING = "predictive files missing"
# A per-example file's metric must equal results.json's to this (stored units): the files keep nll and brier in
# float32 (about 1e-7) and the OOD curve is float32 in torchmetrics (about 1e-6); a stale file differs by far more.
AGREE = 1e-5
BOOTSTRAP = {"replicates": bootstrap.REPLICATES, "level": bootstrap.LEVEL, "seed": bootstrap.SEED}


@dataclass(frozen=True)
class Difference:
    """A's advantage over B in display units (positive: A better in the metric's direction), with its
    interval (``low``, ``high``) when the per-example files allow one."""

    point: float
    low: float | None = None
    high: float | None = None

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


@dataclass
class Verdict:
    setting: str  # the experiment (or experiments) compared
    comparison: str  # "SVE (M=4) vs Single"
    metric: str  # label shown
    ours: str  # the two values (or the sequence), as displayed
    held: bool  # the paper's direction held (from the interval where there is one, else from the means)
    noise: bool  # not resolved: the interval straddles 0 (the tolerance); without one, within the seeds' spread
    verdict: str = ""  # held | reversed | unresolved (an interval); held | not held (the std rule)
    differences: list[Difference] = field(default_factory=list)  # one; a trend: one per step
    no_interval: str | None = None  # why the std rule decided (None: the interval did)
    digits: int = 1
    partial: str | None = None  # which seeds the interval leaves out, and why (None: it has them all)
    one_seed: bool = False  # a cell has one seed: the std rule's spread is unknown (only read without an interval)

    @property
    def interval(self) -> tuple[float, float] | None:
        """(low, high) of the single difference, in display units; None without one (or for a trend)."""
        if len(self.differences) != 1 or self.differences[0].low is None:
            return None
        return self.differences[0].low, self.differences[0].high


def load_claims(name: str) -> DictConfig:
    path = CLAIMS / f"{name}.yaml"
    if not path.exists():
        choices = sorted(p.stem for p in CLAIMS.glob("*.yaml"))
        raise ValueError(f"claims file {name!r} not found in {CLAIMS}; choose one of {choices}")
    return OmegaConf.load(path)


def row_label(text: str) -> str:
    method, members = parse_row(text)
    name = METHOD_NAMES.get(method, method)
    return f"{name} (M={members})" if members > 1 else name


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
    values = [v for r in select(runs, experiment, method, members).values()
              if (v := run_value(r, metric, severity)) is not None]  # fmt: skip
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


def label(key: str) -> str:
    metric, severity = metric_of(key)
    text = f"{metric.label} {metric.arrow}".strip()
    return f"{text}, severity {severity}" if severity is not None else text


def show(value: Cell | None, key: str) -> str:
    return "–" if value is None else value.text(metric_of(key)[0])


# --- intervals from the per-example files ----------------------------------------------------------------


def set_names(run: Run, severity: str | None, key: str) -> list[str]:
    """The evaluation sets a metric reads: test (and ood for the OOD metrics), or a severity's corruption sets
    as results.json lists them (severity 0 is the clean test set)."""
    if severity is None:
        return [bootstrap.TEST, bootstrap.OOD] if key in bootstrap.OOD_METRICS else [bootstrap.TEST]
    if severity == "0":
        return [bootstrap.TEST]
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
        self._sets: dict[Path, bootstrap.Examples | None] = {}
        self._statistics: dict[tuple[Path, str], bootstrap.Statistic | str] = {}

    def examples(self, run: Run, name: str) -> bootstrap.Examples | None:
        path = run.path.parent / bootstrap.PREDICTIVE / f"{name}.npz"
        if path not in self._sets:
            self._sets[path] = bootstrap.read_predictive(path, name)
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
        found = bootstrap.statistic(metric.key, sets)
        expected = run_value(run, metric, severity)
        if expected is None or not abs(found.value() - expected) <= AGREE:
            log.warning("%s: %s from the per-example files is %r, results.json has %r; no interval", run.path.parent,
                        key, found.value(), expected)  # fmt: skip
            return f"{run.path.parent}/{bootstrap.PREDICTIVE} disagrees with results.json on {key}"
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
        for seed in usable:
            bootstrap.check_paired(rows[0][seed], rows[1][seed])
            terms += [bootstrap.Term(coef, seed, rows[0][seed]), bootstrap.Term(-coef, seed, rows[1][seed])]
        return terms

    def difference(self, terms: list[bootstrap.Term]) -> Difference:
        found = bootstrap.interval(terms, self.replicates, self.level, self.seed)
        return Difference(found.point, found.low, found.high)


def decide(kind: str, differences: list[Difference], tolerance: float = 0.0) -> tuple[str, bool]:
    """The three-way verdict of the intervals (module docstring) and whether one contains its threshold.
    ``kind``: better, worse, at_least, similar (A may trail by ``tolerance``), gain or trend (every step)."""
    threshold = -tolerance if kind == "similar" else 0.0
    straddles = any(d.low <= threshold <= d.high for d in differences)
    if kind == "worse":  # the claimed side is below 0
        claimed, wrong = all(d.high < 0 for d in differences), any(d.low > 0 for d in differences)
    else:  # "similar" is held at exactly -tolerance too, as the std rule's gain >= -tolerance
        claimed = all(d.low >= threshold if kind == "similar" else d.low > threshold for d in differences)
        wrong = any(d.high < threshold for d in differences)
    if kind == "at_least":
        return (REVERSED if wrong else HELD), straddles
    return (HELD if claimed else REVERSED if wrong else UNRESOLVED), straddles


def verdict_from(kind: str, differences: list[Difference] | str, fallback: tuple[bool, bool, list[float]],
                 tolerance: float = 0.0) -> dict:
    """Verdict fields: from the intervals, or (``differences`` a reason) from the std rule's (held, noise,
    point differences)."""
    if isinstance(differences, str):
        held, noise, points = fallback
        return {"held": held, "noise": noise, "verdict": HELD if held else NOT_HELD,
                "differences": [Difference(p) for p in points], "no_interval": differences}  # fmt: skip
    verdict, noise = decide(kind, differences, tolerance)
    return {"held": verdict == HELD, "noise": noise, "verdict": verdict, "differences": differences}


def compare(check: DictConfig, runs: list[Run], titles: dict, evidence: Evidence | None = None) -> list[Verdict]:
    evidence = evidence or Evidence(runs)
    expect = check.get("expect", "better")
    if expect not in EXPECT:
        raise ValueError(f"expect={expect!r} is not valid; choose one of {list(EXPECT)}")
    similar = dict(check.get("similar") or {})
    out = []
    for key in [*check.metrics, *similar]:
        metric = metric_of(key)[0]
        a = cell(runs, check.experiment, check.a, key)
        for other in check.against:
            b = cell(runs, check.experiment, other, key)
            if a is None or b is None:
                continue  # a missing cell is listed under its table; no verdict without numbers
            gain = improvement(a, b, metric)
            noise = within_noise(a, b, gain)
            if key in similar:  # "at similar accuracy": no worse than the tolerance
                held = gain >= -float(similar[key])
            else:
                # "at least as good" allows a worse mean inside a known spread, never inside an unknown one
                tie = noise and not one_seed(a, b)
                held = {"better": gain > 0, "worse": gain < 0, "at_least": gain > 0 or tie}[expect]
            terms = evidence.advantage(check.experiment, check.a, other, key)
            found = terms if isinstance(terms, str) else [evidence.difference(terms)]
            fields = verdict_from("similar" if key in similar else expect, found, (held, noise, [gain]),
                                  float(similar.get(key, 0.0)))  # fmt: skip
            out.append(Verdict(titles.get(check.experiment, check.experiment),
                               f"{row_label(check.a)} vs {row_label(other)}"
                               + (f" (similar within {similar[key]})" if key in similar else
                                  " (expected worse)" if expect == "worse" else ""),
                               label(key), f"{show(a, key)} vs {show(b, key)}", digits=metric.digits,
                               partial=seeds_note(terms), one_seed=one_seed(a, b), **fields))  # fmt: skip
    return out


def gain(check: DictConfig, runs: list[Run], titles: dict, evidence: Evidence | None = None) -> list[Verdict]:
    evidence = evidence or Evidence(runs)
    first, second = check.experiments
    out = []
    for key in check.metrics:
        metric = metric_of(key)[0]
        for other in check.against:
            cells = [(cell(runs, e, check.a, key), cell(runs, e, other, key)) for e in (first, second)]
            if any(v is None for pair in cells for v in pair):
                continue
            gains = [improvement(a, b, metric) for a, b in cells]
            flat = [v for pair in cells for v in pair]
            noise = one_seed(*flat) or abs(gains[0] - gains[1]) <= max(v.std or 0.0 for v in flat)
            terms = [evidence.advantage(e, check.a, other, key) for e in (first, second)]
            reason = next((t for t in terms if isinstance(t, str)), None)
            found = reason or [evidence.difference(
                list(terms[0]) + [bootstrap.Term(-t.coef, t.seed, t.statistic) for t in terms[1]])]
            digits = metric.digits
            fields = verdict_from("gain", found, (gains[0] > gains[1], noise, [gains[0] - gains[1]]))
            out.append(Verdict(f"{titles.get(first, first)} vs {titles.get(second, second)}",
                               f"gain of {row_label(check.a)} over {row_label(other)}", label(key),
                               f"{gains[0]:+.{digits}f} vs {gains[1]:+.{digits}f}", digits=digits,
                               partial=seeds_note(*terms), one_seed=one_seed(*flat), **fields))  # fmt: skip
    return out


def trend(check: DictConfig, runs: list[Run], titles: dict, evidence: Evidence | None = None) -> list[Verdict]:
    evidence = evidence or Evidence(runs)
    out = []
    for key in check.metrics:
        metric = metric_of(key)[0]
        values = [cell(runs, check.experiment, row, key) for row in check.rows]
        if any(v is None for v in values):
            continue
        steps = [improvement(b, a, metric) for a, b in zip(values, values[1:])]
        noise = any(within_noise(a, b, s) for a, b, s in zip(values, values[1:], steps))
        terms = [evidence.advantage(check.experiment, later, earlier, key)
                 for earlier, later in zip(check.rows, check.rows[1:])]  # fmt: skip
        reason = next((t for t in terms if isinstance(t, str)), None)
        found = reason or [evidence.difference(t) for t in terms]
        out.append(Verdict(titles.get(check.experiment, check.experiment),
                           " → ".join(row_label(r) for r in check.rows), label(key),
                           " → ".join(show(v, key) for v in values), digits=metric.digits, partial=seeds_note(*terms),
                           one_seed=one_seed(*values),
                           **verdict_from("trend", found, (all(s > 0 for s in steps), noise, steps))))  # fmt: skip
    return out


KINDS = {"compare": compare, "gain": gain, "trend": trend}


def judge(claims: DictConfig, runs: list[Run]) -> list[tuple[DictConfig, list[Verdict]]]:
    """Every claim with the verdicts of its checks (checks whose cells are missing give none)."""
    titles = dict(claims.get("settings") or {})
    evidence = Evidence(runs, OmegaConf.to_container(claims.bootstrap) if claims.get("bootstrap") else None)
    out = []
    for claim in claims.claims:
        verdicts = []
        for check in claim.checks:
            kind = check.get("kind", "compare")
            if kind not in KINDS:
                raise ValueError(f"check kind {kind!r} is not valid; choose one of {list(KINDS)}")
            verdicts += KINDS[kind](check, runs, titles, evidence)
        out.append((claim, verdicts))
    return out


def summary(verdicts: list[Verdict]) -> str:
    if not verdicts:
        return "No verdict yet: the runs it needs are missing."
    parts = []
    intervals = [v for v in verdicts if v.no_interval is None]
    if intervals:
        n = {w: sum(v.verdict == w for v in intervals) for w in (HELD, REVERSED, UNRESOLVED)}
        parts.append(f"Of {len(intervals)} comparisons with a 95% interval, the paper's direction held in "
                     f"{n[HELD]}, was reversed in {n[REVERSED]} and is unresolved in {n[UNRESOLVED]}.")
    rest = [v for v in verdicts if v.no_interval is not None]
    if rest:
        clear = [v for v in rest if not v.noise]
        reasons = "; ".join(sorted({v.no_interval for v in rest}))
        held, clear_held = sum(v.held for v in rest), sum(v.held for v in clear)
        parts.append(f"{'Another' if intervals else 'These'} {len(rest)} comparisons have no interval ({reasons}): by "
                     f"the direction of the means the paper's held in {held}; of the {len(clear)} whose difference "
                     f"exceeds the seeds' spread, it held in {clear_held}.")  # fmt: skip
    return " ".join(parts)


def verdict_text(v: Verdict) -> str:
    word = f"**{v.verdict}**" if v.verdict in (REVERSED, NOT_HELD) else v.verdict
    if v.no_interval is None:
        return word if v.partial is None else f"{word} ({v.partial})"
    spread = "one seed: spread unknown" if v.one_seed else "within seed noise"
    notes = ([spread] if v.noise else []) + [f"no interval: {v.no_interval}"]
    return f"{word} ({'; '.join(notes)})"


def to_markdown(judged: list[tuple[DictConfig, list[Verdict]]]) -> str:
    lines = []
    for claim, verdicts in judged:
        lines += [f"### {claim.title}", "", f"**The paper:** {claim.paper}", "",
                  f"**Our miniature:** {summary(verdicts)}", ""]  # fmt: skip
        if verdicts:
            lines += ["| setting | comparison | metric | ours | difference [95% CI] | verdict |",
                      "|:--|:--|:--|:--|:--|:--|"]  # fmt: skip
            for v in verdicts:
                difference = "; ".join(d.text(v.digits) for d in v.differences)
                lines.append(f"| {v.setting} | {v.comparison} | {v.metric} | {v.ours} | {difference} | "
                             f"{verdict_text(v)} |")  # fmt: skip
            lines.append("")
        if claim.get("note"):
            lines += [f"**Why:** {claim.note.strip()}", ""]
    return "\n".join(lines)


def procedure(claims: DictConfig | None = None) -> str:
    """One paragraph on how the verdicts are made, with the claims file's bootstrap settings."""
    options = {**BOOTSTRAP, **(OmegaConf.to_container(claims.bootstrap) if claims and claims.get("bootstrap") else {})}
    level = f"{100 * float(options['level']):g}%"
    return (f"Each comparison's difference is the first row's advantage over the second in the table's units "
            f"(positive: better in the metric's direction), the difference of the two cells' means. Its {level} "
            f"interval is a paired bootstrap over the test examples: in each of {int(options['replicates'])} "
            f"replicates every seed's test examples are resampled with replacement, the same resample for both "
            f"rows (and for all corruption sets of a severity, which are the same images; in-distribution and OOD "
            f"examples separately), the metric's difference is computed on it, and the seeds' differences are "
            f"averaged; the interval is the replicates' {(1 - float(options['level'])) / 2 * 100:g}th to "
            f"{(1 + float(options['level'])) / 2 * 100:g}th percentiles (numpy seed {int(options['seed'])}, so it "
            f"is reproducible). A direction is *held* when the interval lies entirely on the claimed side of 0 (of "
            f"minus the tolerance for \"similar\"; \"at least\" is held unless it lies entirely on the wrong side), "
            f"*reversed* when it lies entirely on the other side, and *unresolved* when it contains 0: the test set "
            f"cannot tell the rows apart. A gain compares two experiments' differences, a trend requires every step "
            f"to hold. The interval measures how much a finite test set leaves open for the trained runs; it does "
            f"not measure the seed-to-seed spread of training, which the tables' ± shows. A seed whose run lacks "
            f"the per-example files (`predictive/`, written by every evaluation since they were introduced) is left "
            f"out of the difference and its interval, and the verdict names it; a comparison where no seed has "
            f"them is judged by the sign of the means and marked \"no interval\".")


def claims_markdown(name: str, root: Path, runs: list[Run] | None = None) -> str:
    from sve.paper.report import load_runs

    return to_markdown(judge(load_claims(name), runs if runs is not None else load_runs(root)))


__all__ = ["Verdict", "Difference", "Evidence", "load_claims", "cell", "judge", "decide", "to_markdown",
           "claims_markdown", "summary", "procedure"]
