"""The paper's claims, checked against stored runs: ``python scripts/mini_report.py`` (``make mini-report``).

A claims file (``sve/configs/claims/<name>.yaml``) lists the paper's claims; each holds checks on the cells of
the tables (a cell: one experiment, method and member count, its test metric averaged over the seeds found,
exactly as ``sve.paper.report`` builds it). A check says which way the paper points and the verdict says whether
ours points the same way. Every comparison is one of two kinds, counted apart:

- **strict**, "better": ``compare`` with ``expect: better`` (the default) or ``worse`` (where the paper expects
  a row to be worse), ``gain`` and ``trend``;
- **lenient**, "not worse within a margin": ``compare`` with ``expect: not_worse`` (margin from the claims
  file's ``margins`` rule) or a metric under ``similar`` (its margin given there, in display units).

The checks:

- ``compare``: row ``a`` against each row of ``against`` on each metric of ``metrics`` (``expect`` their kind)
  and of ``similar`` (lenient, each with its margin: "at similar accuracy");
- ``gain``: how much ``a`` improves on each row of ``against`` in the first experiment against the second
  (Fig. 2: more with pretrained weights than from random ones);
- ``trend``: ``rows`` in order (e.g. SVE at M = 1, 2, 4) each improving on the one before (Table 6).

A row is ``method:members`` (``sve:4``). A metric is a test metric key (``ece``, ``ood_auroc``) or
``sev<k>/<key>`` for the shift sets at severity k (the mean over corruptions, as Fig. 3 plots it).

Each comparison's *difference* is A's advantage over B in display units, positive when A is better in the
metric's direction: the table's difference of the two cells' means over the seeds. Its 95% interval
(``sve.paper.bootstrap.interval``) covers both the finite test set (one resample of the examples per replicate,
shared by every seed and both rows) and the seeds' training variance (their differences' spread beyond the test
set's own noise, at Student's t); 2000 replicates from a fixed seed, both set by the claims file's ``bootstrap``
block. The verdict is three-way, "held", "reversed" or "unresolved":

- strict: held when the interval lies entirely on the claimed side of 0, reversed when entirely on the other,
  else unresolved; a trend holds when every step does and is reversed when any step is;
- lenient with margin m: held when the interval lies entirely above -m *and* the difference is not below 0,
  reversed when it lies entirely below -m, else unresolved;
- a difference on the wrong side of 0 is never held, whatever the kind.

A comparison whose runs lack the per-example files (runs evaluated before they were written:
``python -m sve.cli.backfill <results root>`` writes them from saved predictions where those still exist), whose
rows have different seeds, or whose file disagrees with results.json gets no interval: its verdict falls back
to the direction of the means ("held" or "not held"), "within seed noise" when the difference is at most the
larger of the two cells' standard deviations ("one seed: spread unknown" when a cell has one seed), and says why
it has no interval. Verdicts are computed, never written by hand; a claim's ``note`` (hand-written, after
reading the results) says why a direction did not hold where a reason is known.

``previous`` keeps the procedure this one replaced (each seed's examples resampled apart, the runs fixed;
"at least" held unless the interval lay entirely below 0), so the README can list every verdict that changed.
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

EXPECT = ("better", "worse", "not_worse")
STRICT, LENIENT = "strict", "lenient"
HELD, REVERSED, UNRESOLVED, NOT_HELD = "held", "reversed", "unresolved", "not held"
MISSING = "predictive files missing"
# A per-example file's metric must equal results.json's to this (stored units): the files keep nll and brier in
# float32 (about 1e-7) and the OOD curve is float32 in torchmetrics (about 1e-6); a stale file differs by far more.
AGREE = 1e-5
BOOTSTRAP = {"replicates": bootstrap.REPLICATES, "level": bootstrap.LEVEL, "seed": bootstrap.SEED}
# The margin rule of lenient checks when a claims file gives none (its ``margins`` block): ``points`` for a metric
# shown in percent, ``relative`` times B's value for any other.
MARGINS = {"points": 1.0, "relative": 0.02}


@dataclass(frozen=True)
class Difference:
    """A's advantage over B in display units (positive: A better in the metric's direction), with its
    interval (``low``, ``high``) when the per-example files allow one; ``training`` False when the interval
    leaves out the seeds' training variance (a row with one seed)."""

    point: float
    low: float | None = None
    high: float | None = None
    training: bool = True

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


@dataclass(frozen=True)
class Previous:
    """The verdict of the procedure this one replaced (module docstring), for the list of changed verdicts."""

    verdict: str
    differences: tuple[Difference, ...]


@dataclass
class Verdict:
    setting: str  # the experiment (or experiments) compared
    comparison: str  # "SVE (M=4) vs Single"
    metric: str  # label shown
    ours: str  # the two values (or the sequence), as displayed
    held: bool  # the paper's direction held (from the interval where there is one, else from the means)
    noise: bool  # not resolved: the interval contains its threshold; without one, within the seeds' spread
    verdict: str = ""  # held | reversed | unresolved (an interval); held | not held (the std rule)
    differences: list[Difference] = field(default_factory=list)  # one; a trend: one per step
    no_interval: str | None = None  # why the std rule decided (None: the interval did)
    digits: int = 1
    partial: str | None = None  # which seeds the interval leaves out, and why (None: it has them all)
    one_seed: bool = False  # a cell has one seed: the std rule's spread is unknown (only read without an interval)
    kind: str = STRICT  # STRICT ("better") or LENIENT ("not worse within a margin")
    margin: float | None = None  # a lenient check's margin, in display units
    previous: Previous | None = None  # the replaced procedure's verdict (None: not computed)

    @property
    def interval(self) -> tuple[float, float] | None:
        """(low, high) of the single difference, in display units; None without one (or for a trend)."""
        if len(self.differences) != 1 or self.differences[0].low is None:
            return None
        return self.differences[0].low, self.differences[0].high

    @property
    def training(self) -> bool:
        """Every interval of the verdict covers the seeds' training variance."""
        return all(d.training for d in self.differences if d.low is not None)


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
        unit = f"{experiment}: {a} vs {b}"  # the seeds of one advantage: their spread is its training variance
        for seed in usable:
            bootstrap.check_paired(rows[0][seed], rows[1][seed])
            terms += [bootstrap.Term(coef, seed, rows[0][seed], unit), bootstrap.Term(-coef, seed, rows[1][seed], unit)]
        return terms

    def difference(self, terms: list[bootstrap.Term]) -> tuple[Difference, Difference]:
        """The difference with the verdicts' interval, and with the interval of the procedure it replaced."""
        found = bootstrap.interval(terms, self.replicates, self.level, self.seed)
        before = bootstrap.per_seed_bootstrap(terms, self.replicates, self.level, self.seed)
        return (Difference(found.point, found.low, found.high, found.training),
                Difference(before.point, before.low, before.high, False))


def decide(kind: str, differences: list[Difference], margin: float = 0.0) -> tuple[str, bool]:
    """The three-way verdict of the intervals (module docstring) and whether one contains its threshold.
    ``kind``: better, worse, gain, trend (strict: every step) or not_worse (lenient, within ``margin``)."""
    threshold = -margin if kind == "not_worse" else 0.0
    straddles = any(d.low <= threshold <= d.high for d in differences)
    if kind == "worse":  # the claimed side is below 0
        claimed = all(d.high < 0 and d.point < 0 for d in differences)
        wrong = any(d.low > 0 for d in differences)
    elif kind == "not_worse":  # within the margin, and never with A's point estimate worse than B's
        claimed = all(d.low > threshold and d.point >= 0 for d in differences)
        wrong = any(d.high < threshold for d in differences)
    else:
        claimed = all(d.low > 0 and d.point > 0 for d in differences)
        wrong = any(d.high < 0 for d in differences)
    return (HELD if claimed else REVERSED if wrong else UNRESOLVED), straddles


def decide_previous(kind: str, differences: list[Difference], tolerance: float = 0.0) -> str:
    """The replaced procedure's verdict: ``at_least`` held unless the interval lay entirely below 0; ``similar``
    held from -tolerance up, the point's side not checked; the strict kinds as now."""
    threshold = -tolerance if kind == "similar" else 0.0
    if kind == "worse":
        claimed, wrong = all(d.high < 0 for d in differences), any(d.low > 0 for d in differences)
    else:
        claimed = all(d.low >= threshold if kind == "similar" else d.low > threshold for d in differences)
        wrong = any(d.high < threshold for d in differences)
    if kind == "at_least":
        return REVERSED if wrong else HELD
    return HELD if claimed else REVERSED if wrong else UNRESOLVED


def verdict_from(kind: str, found: list[tuple[Difference, Difference]] | str, fallback: tuple[bool, bool, list[float]],
                 margin: float = 0.0, previous: tuple[str, float, bool] | None = None) -> dict:
    """Verdict fields: from the intervals (each a pair: the verdicts', the replaced procedure's), or (``found`` a
    reason) from the std rule's (held, noise, point differences). ``previous``: the replaced procedure's kind,
    tolerance and std-rule verdict (None: the same as ``kind``'s)."""
    old_kind, tolerance, old_held = previous or (kind, 0.0, fallback[0])
    if isinstance(found, str):
        held, noise, points = fallback
        differences = [Difference(p) for p in points]
        return {"held": held, "noise": noise, "verdict": HELD if held else NOT_HELD, "differences": differences,
                "no_interval": found,
                "previous": Previous(HELD if old_held else NOT_HELD, tuple(differences))}  # fmt: skip
    differences, before = [d for d, _ in found], [b for _, b in found]
    verdict, noise = decide(kind, differences, margin)
    return {"held": verdict == HELD, "noise": noise, "verdict": verdict, "differences": differences,
            "previous": Previous(decide_previous(old_kind, before, tolerance), tuple(before))}


def margin_of(key: str, b: Cell, margins: dict) -> float:
    """The claims file's margin rule (``MARGINS``) for metric ``key`` against B's cell, in display units."""
    metric = metric_of(key)[0]
    if metric.scale == 100:  # shown in percent: a margin in points
        return float(margins["points"])
    return float(margins["relative"]) * abs(b.mean)


def margin_text(margin: float, metric: Metric) -> str:
    """A margin in points as the table shows the metric; a relative one with a digit more (0.008 of NLL)."""
    return f"{margin:.{metric.digits + (metric.scale != 100)}f}"


def compare(check: DictConfig, runs: list[Run], titles: dict, evidence: Evidence | None = None,
            margins: dict | None = None) -> list[Verdict]:
    evidence = evidence or Evidence(runs)
    margins = {**MARGINS, **(margins or {})}
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
            lenient = key in similar or expect == "not_worse"
            margin = (float(similar[key]) if key in similar else margin_of(key, b, margins)) if lenient else None
            held = gain >= 0 if lenient else gain < 0 if expect == "worse" else gain > 0
            # The replaced procedure: "at least as good" allowed a worse mean inside a known spread, "similar" a
            # mean behind by up to its tolerance.
            tie = noise and not one_seed(a, b)
            previous = (("similar", margin, gain >= -margin) if key in similar else
                        ("at_least", 0.0, gain > 0 or tie) if lenient else None)  # fmt: skip
            terms = evidence.advantage(check.experiment, check.a, other, key)
            found = terms if isinstance(terms, str) else [evidence.difference(terms)]
            fields = verdict_from("not_worse" if lenient else expect, found, (held, noise, [gain]), margin or 0.0,
                                  previous)  # fmt: skip
            note = (f" (not worse within {margin_text(margin, metric)})" if lenient else
                    " (expected worse)" if expect == "worse" else "")  # fmt: skip
            out.append(Verdict(titles.get(check.experiment, check.experiment),
                               f"{row_label(check.a)} vs {row_label(other)}{note}", label(key),
                               f"{show(a, key)} vs {show(b, key)}", digits=metric.digits, partial=seeds_note(terms),
                               one_seed=one_seed(a, b), kind=LENIENT if lenient else STRICT, margin=margin,
                               **fields))  # fmt: skip
    return out


def gain(check: DictConfig, runs: list[Run], titles: dict, evidence: Evidence | None = None,
         margins: dict | None = None) -> list[Verdict]:
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
                list(terms[0]) + [bootstrap.Term(-t.coef, t.seed, t.statistic, t.unit) for t in terms[1]])]
            digits = metric.digits
            fields = verdict_from("gain", found, (gains[0] > gains[1], noise, [gains[0] - gains[1]]))
            out.append(Verdict(f"{titles.get(first, first)} vs {titles.get(second, second)}",
                               f"gain of {row_label(check.a)} over {row_label(other)}", label(key),
                               f"{gains[0]:+.{digits}f} vs {gains[1]:+.{digits}f}", digits=digits,
                               partial=seeds_note(*terms), one_seed=one_seed(*flat), **fields))  # fmt: skip
    return out


def trend(check: DictConfig, runs: list[Run], titles: dict, evidence: Evidence | None = None,
          margins: dict | None = None) -> list[Verdict]:
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
    margins = margins_of(claims)
    out = []
    for claim in claims.claims:
        verdicts = []
        for check in claim.checks:
            kind = check.get("kind", "compare")
            if kind not in KINDS:
                raise ValueError(f"check kind {kind!r} is not valid; choose one of {list(KINDS)}")
            verdicts += KINDS[kind](check, runs, titles, evidence, margins)
        out.append((claim, verdicts))
    return out


def margins_of(claims: DictConfig | None) -> dict:
    """The claims file's margin rule over the defaults (``MARGINS``); an unknown key names the valid ones."""
    given = OmegaConf.to_container(claims.margins) if claims is not None and claims.get("margins") else {}
    unknown = sorted(set(given) - set(MARGINS))
    if unknown:
        raise ValueError(f"margins {unknown} are not valid; choose among {sorted(MARGINS)}")
    return {**MARGINS, **given}


def counts(verdicts: list[Verdict]) -> dict[str, dict[str, int]]:
    """{kind: {held, reversed, unresolved: count}} over the verdicts with an interval."""
    return {kind: {w: sum(v.verdict == w for v in verdicts if v.no_interval is None and v.kind == kind)
                   for w in (HELD, REVERSED, UNRESOLVED)} for kind in (STRICT, LENIENT)}  # fmt: skip


KIND_NAMES = {STRICT: "Strict (\"better\")", LENIENT: "Lenient (\"not worse\" within a margin)"}


def summary(verdicts: list[Verdict]) -> str:
    if not verdicts:
        return "No verdict yet: the runs it needs are missing."
    parts = []
    for kind, n in counts(verdicts).items():
        total = sum(n.values())
        if total:
            parts.append(f"{KIND_NAMES[kind]}: of {total} with a 95% interval, held in {n[HELD]}, reversed in "
                         f"{n[REVERSED]}, unresolved in {n[UNRESOLVED]}.")  # fmt: skip
    rest = [v for v in verdicts if v.no_interval is not None]
    if rest:
        clear = [v for v in rest if not v.noise]
        reasons = "; ".join(sorted({v.no_interval for v in rest}))
        held, clear_held = sum(v.held for v in rest), sum(v.held for v in clear)
        parts.append(f"{'Another' if parts else 'These'} {len(rest)} comparisons have no interval ({reasons}): by "
                     f"the direction of the means the paper's held in {held}; of the {len(clear)} whose difference "
                     f"exceeds the seeds' spread, it held in {clear_held}.")  # fmt: skip
    return " ".join(parts)


def verdict_text(v: Verdict) -> str:
    word = f"**{v.verdict}**" if v.verdict in (REVERSED, NOT_HELD) else v.verdict
    if v.no_interval is None:
        notes = [v.partial] if v.partial else []
        if not v.training:
            notes.append("one seed: the interval leaves out training variance")
        if v.kind == LENIENT and v.verdict == UNRESOLVED and v.interval and v.interval[0] > -v.margin:
            notes.append("within the margin, but the difference is below 0")
        return f"{word} ({'; '.join(notes)})" if notes else word
    spread = "one seed: spread unknown" if v.one_seed else "within seed noise"
    notes = ([spread] if v.noise else []) + [f"no interval: {v.no_interval}"]
    return f"{word} ({'; '.join(notes)})"


def members_text(lines: list[str]) -> str:
    return f"**Members:** {' '.join(lines)}" if lines else ""


def to_markdown(judged: list[tuple[DictConfig, list[Verdict]]], members: dict | None = None) -> str:
    """The claims with their verdict tables; ``members``: {claim title: sentences on how far the members of its
    SVE-family rows moved apart} (``movement_sentences``), printed after its table."""
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
        if (members or {}).get(claim.title):
            lines += [members_text(members[claim.title]), ""]
        if claim.get("note"):
            lines += [f"**Why:** {claim.note.strip()}", ""]
    return "\n".join(lines)


def changed(judged: list[tuple[DictConfig, list[Verdict]]]) -> list[Verdict]:
    """The verdicts that differ from the replaced procedure's."""
    return [v for _, verdicts in judged for v in verdicts if v.previous is not None and v.previous.verdict != v.verdict]


def changes_markdown(judged: list[tuple[DictConfig, list[Verdict]]]) -> str:
    """A table of every verdict that changed from the replaced procedure, with both intervals."""
    found = changed(judged)
    total = sum(len(verdicts) for _, verdicts in judged)
    if not found:
        return f"None of the {total} verdicts changed."
    lines = [f"{len(found)} of the {total} verdicts changed:", "",
             "| setting | comparison | metric | before: difference [95% CI] | verdict | now: difference [95% CI] | "
             "verdict |", "|:--|:--|:--|:--|:--|:--|:--|"]  # fmt: skip
    for v in found:
        before = "; ".join(d.text(v.digits) for d in v.previous.differences)
        now = "; ".join(d.text(v.digits) for d in v.differences)
        lines.append(f"| {v.setting} | {v.comparison} | {v.metric} | {before} | {v.previous.verdict} | {now} | "
                     f"{v.verdict} |")  # fmt: skip
    return "\n".join(lines)


def movement_sentences(claims: DictConfig, root: Path, runs: list[Run]) -> dict[str, list[str]]:
    """{claim title: one sentence per SVE-family row with more than one member among its checks' rows}: the
    members' spread as a multiple of its initial value and, below ``separation`` (claims file; default
    ``sve.paper.movement.SEPARATED``), that they did not separate."""
    from sve.paper import movement

    titles = dict(claims.get("settings") or {})
    threshold = float(claims.get("separation", movement.SEPARATED))
    out: dict[str, list[str]] = {}
    for claim in claims.claims:
        rows = []
        for check in claim.checks:
            experiments = check.get("experiments") or [check.experiment]
            named = list(check.get("rows") or []) + ([check.a] if check.get("a") else []) + list(
                check.get("against") or [])
            rows += [(e, r) for e in experiments for r in named if (e, r) not in rows]
        for experiment, row in rows:
            moved = movement.row_movement(root, runs, experiment, row)
            if moved is None or moved.members < 2:
                continue
            where = f"{row_label(row)}, {titles.get(experiment, experiment)}"
            if moved.ratio is None:
                out.setdefault(claim.title, []).append(f"{where}: no record of its members' spread (see \"Did the "
                                                       "singular values train?\").")  # fmt: skip
                continue
            said = (f"{moved.ratio:.2f} times its initial value: the members did not separate (below {threshold:g})"
                    if moved.ratio < threshold else f"{moved.ratio:.2f} times its initial value")  # fmt: skip
            out.setdefault(claim.title, []).append(f"{where}: the members' spread is {said}.")
    return out


def procedure(claims: DictConfig | None = None) -> str:
    """One paragraph on how the verdicts are made, with the claims file's bootstrap settings and margins and the
    coverage measured by ``sve.paper.coverage`` (a simulation of a few seconds, run here so the number stated is
    the procedure's own)."""
    from sve.paper import coverage

    options = {**BOOTSTRAP, **(OmegaConf.to_container(claims.bootstrap) if claims and claims.get("bootstrap") else {})}
    margins = margins_of(claims)
    level = float(options["level"])
    now, before, pooled = (coverage.coverage_range(p) for p in ("combined", "per_seed", "hierarchical"))
    sizes = ", ".join(f"{n:,}" for n in coverage.SIZES)

    def percent(pair: tuple[float, float]) -> str:
        return f"{100 * pair[0]:.1f}-{100 * pair[1]:.1f}%"

    return (f"Each comparison's difference is the first row's advantage over the second in the table's units "
            f"(positive: better in the metric's direction), the difference of the two cells' means over the seeds. "
            f"Its {100 * level:g}% interval covers two sources of chance. The test set: every seed of both rows was "
            f"scored on the same test examples, so each of {int(options['replicates'])} replicates draws one "
            f"resample of those examples with replacement (numpy seed {int(options['seed'])}), shared by every seed "
            f"and both rows (and by a severity's corruption sets, which are the same images; in-distribution and "
            f"OOD examples apart); the difference's variance over the replicates is the test set's part. Training: "
            f"each seed's own difference scatters around their mean by the training variance plus the part of the "
            f"test set's noise that differs between seeds (each training gets other examples right); the replicates "
            f"measure that part, and what the seeds' spread holds beyond it is the training variance, which the "
            f"test-set part does not already contain. The interval is the difference ± the square root of (z² × "
            f"the test-set variance + t² × the training variance / S), with z the normal quantile and t Student's "
            f"with S − 1 degrees of freedom for S seeds. Three seeds measure the training variance with two degrees "
            f"of freedom, so t is {bootstrap.quantile(level, 2):.2f} instead of {bootstrap.quantile(level):.2f} and "
            f"intervals are wide wherever training varies more than the test set; resampling the three seeds "
            f"instead (a two-level bootstrap) spreads their variance by a third too little and has no t, and "
            f"covers too rarely. On simulated predictions at the miniature's sizes ({coverage.SEEDS} seeds; {sizes} "
            f"test examples; training variance from none to several times the test set's; accuracy and NLL; "
            f"{coverage.DATASETS} data sets each, `sve/paper/coverage.py`), these intervals contained the true "
            f"difference in {percent(now)} of the data sets, the two-level bootstrap in {percent(pooled)}, and the "
            f"procedure used before (each seed's examples resampled apart, the runs fixed) in {percent(before)}. More "
            f"seeds narrow the training part twice, by 1/√S and through t ({bootstrap.quantile(level, 3):.2f} at "
            f"4 seeds, {bootstrap.quantile(level, 9):.2f} at 10). A row with one seed (the MPNet rows) has no "
            f"training variance to measure: its interval covers the test set only, and its verdict says so. Two "
            f"kinds of verdict are counted apart. *Strict* (\"better\"): *held* when the interval lies entirely on "
            f"the claimed side of 0, *reversed* when entirely on the other, else *unresolved*. *Lenient* (\"not "
            f"worse\" within a margin): held when the interval lies entirely above minus the margin and the "
            f"difference itself is not below 0, reversed when the interval lies entirely below minus the margin, "
            f"else unresolved; a check's margin is stated in the claim, or else set by one rule fixed in the claims "
            f"file before the verdicts were computed: {margins['points']:g} point for a metric in percent, "
            f"{100 * margins['relative']:g}% of the second row's value for any other (NLL). A difference below 0 "
            f"is never held. A gain compares two experiments' differences, a trend requires every step to hold. A "
            f"seed whose run lacks the per-example files (`predictive/`, written by every evaluation since they "
            f"were introduced) is left out of the difference and its interval, and the verdict names it; a "
            f"comparison where no seed has them is judged by the sign of the means and marked \"no interval\".")


def claims_markdown(name: str, root: Path, runs: list[Run] | None = None,
                    judged: list[tuple[DictConfig, list[Verdict]]] | None = None) -> str:
    """The claims of ``name`` judged on the runs of ``root`` (or the ``judged`` of them), with the sentences on
    their SVE-family rows' members."""
    from sve.paper.report import load_runs

    claims = load_claims(name)
    runs = runs if runs is not None else load_runs(root)
    judged = judged if judged is not None else judge(claims, runs)
    return to_markdown(judged, movement_sentences(claims, root, runs))


__all__ = ["Verdict", "Difference", "Previous", "Evidence", "load_claims", "cell", "judge", "decide",
           "decide_previous", "to_markdown", "claims_markdown", "changes_markdown", "changed", "summary", "counts",
           "procedure", "movement_sentences", "margins_of", "STRICT", "LENIENT"]
