"""The paper's claims, checked against stored runs: ``python scripts/mini_report.py`` (``make mini-report``).

A claims file (``sve/configs/claims/<name>.yaml``) lists the paper's claims; each holds checks on the cells of
the tables (a cell: one experiment, method and member count, its test metric averaged over the seeds found,
exactly as ``sve.paper.report`` builds it). A check says which way the paper points and the verdict says whether
ours points the same way. Every comparison is one of two kinds, counted apart:

- **strict**, "better": ``compare`` with ``expect: better`` (the default) or ``worse`` (where the paper expects
  a row to be worse), ``gain``, ``trend`` and ``level``;
- **lenient**, "not worse within a margin": ``compare`` with ``expect: not_worse`` (margin from the claims
  file's ``margins`` rule) or a metric under ``similar`` (its margin given there, in display units).

The checks:

- ``compare``: row ``a`` against each row of ``against`` on each metric of ``metrics`` (``expect`` their kind)
  and of ``similar`` (lenient, each with its margin: "at similar accuracy");
- ``gain``: how much ``a`` improves on each row of ``against`` in the first experiment against the second
  (Fig. 2: more with pretrained weights than from random ones);
- ``trend``: ``rows`` in order (e.g. SVE at M = 1, 2, 4) each improving on the one before (Table 6);
- ``level``: row ``a``'s own metric against 0, for metrics that are already a difference within each run
  (``growth_90``: the conformal sets' size where the members disagree most minus elsewhere).

A row is ``method:members`` (``sve:4``). A metric is a test metric key (``ece``, ``ood_auroc``) or
``sev<k>/<key>`` for the shift sets at severity k (the mean over corruptions, as Fig. 3 plots it).

Each comparison's *difference* is A's advantage over B in display units, positive when A is better in the
metric's direction: the table's difference of the two cells' means over the seeds. Its 95% interval
(``sve.paper.bootstrap.interval``) covers both the finite test set (one resample of the examples per replicate,
shared by every seed and both rows: the noise every seed shares, at z) and what differs between seeds (training,
and the test-set noise each training meets its own way: the per-seed differences' spread, at Student's t); 2000
replicates from a fixed seed, both set by the claims file's ``bootstrap`` block. The verdict is three-way,
"held", "reversed" or "unresolved":

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

``previous`` keeps the verdict of the interval procedure this one replaced (``combined``: all of the test set's
noise at z, only the seeds' spread beyond it at t), judged by the same rules, so the README can list every verdict
that the coverage grid's choice changed.

The cells and the intervals' terms are read by ``sve.paper.evidence``; ``sve.paper.claims_text`` writes the verdicts
as markdown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from sve.paper import bootstrap
from sve.paper.display import METHOD_NAMES, Metric
from sve.paper.evidence import (
    Difference,
    Evidence,
    cell,
    improvement,
    metric_of,
    one_seed,
    seeds_note,
    within_noise,
)
from sve.paper.report import Cell
from sve.paper.store import Run, parse_row
from sve.paths import CLAIMS

EXPECT = ("better", "worse", "not_worse")
STRICT, LENIENT = "strict", "lenient"
HELD, REVERSED, UNRESOLVED, NOT_HELD = "held", "reversed", "unresolved", "not held"
# The margin rule of lenient checks when a claims file gives none (its ``margins`` block): ``points`` for a metric
# shown in percent, ``relative`` times B's value for any other.
MARGINS = {"points": 1.0, "relative": 0.02}


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


def label(key: str) -> str:
    metric, severity = metric_of(key)
    text = f"{metric.label} {metric.arrow}".strip()
    return f"{text}, severity {severity}" if severity is not None else text


def show(value: Cell | None, key: str) -> str:
    return "–" if value is None else value.text(metric_of(key)[0])


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


def verdict_from(
    kind: str, found: list[tuple[Difference, Difference]] | str, fallback: tuple[bool, bool, list[float]], margin=0.0
) -> dict:
    """Verdict fields: from the intervals (each a pair: the verdicts', the replaced procedure's, both judged by
    ``decide``), or (``found`` a reason) from the std rule's (held, noise, point differences)."""
    if isinstance(found, str):
        held, noise, points = fallback
        differences = [Difference(p) for p in points]
        verdict = HELD if held else NOT_HELD
        return {
            "held": held,
            "noise": noise,
            "verdict": verdict,
            "differences": differences,
            "no_interval": found,
            "previous": Previous(verdict, tuple(differences)),
        }
    differences, before = [d for d, _ in found], [b for _, b in found]
    verdict, noise = decide(kind, differences, margin)
    return {
        "held": verdict == HELD,
        "noise": noise,
        "verdict": verdict,
        "differences": differences,
        "previous": Previous(decide(kind, before, margin)[0], tuple(before)),
    }


def margin_of(key: str, b: Cell, margins: dict) -> float:
    """The claims file's margin rule (``MARGINS``) for metric ``key`` against B's cell, in display units."""
    metric = metric_of(key)[0]
    if metric.scale == 100:  # shown in percent: a margin in points
        return float(margins["points"])
    return float(margins["relative"]) * abs(b.mean)


def margin_text(margin: float, metric: Metric) -> str:
    """A margin in points as the table shows the metric; a relative one with a digit more (0.008 of NLL)."""
    return f"{margin:.{metric.digits + (metric.scale != 100)}f}"


def compare(
    check: DictConfig, runs: list[Run], titles: dict, evidence: Evidence | None = None, margins: dict | None = None
) -> list[Verdict]:
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
            terms = evidence.advantage(check.experiment, check.a, other, key)
            found = terms if isinstance(terms, str) else [evidence.difference(terms)]
            fields = verdict_from("not_worse" if lenient else expect, found, (held, noise, [gain]), margin or 0.0)
            note = (
                f" (not worse within {margin_text(margin, metric)})"
                if lenient
                else " (expected worse)"
                if expect == "worse"
                else ""
            )
            out.append(
                Verdict(
                    titles.get(check.experiment, check.experiment),
                    f"{row_label(check.a)} vs {row_label(other)}{note}",
                    label(key),
                    f"{show(a, key)} vs {show(b, key)}",
                    digits=metric.digits,
                    partial=seeds_note(terms),
                    one_seed=one_seed(a, b),
                    kind=LENIENT if lenient else STRICT,
                    margin=margin,
                    **fields,
                )
            )
    return out


def gain(
    check: DictConfig, runs: list[Run], titles: dict, evidence: Evidence | None = None, margins: dict | None = None
) -> list[Verdict]:
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
            found = reason or [
                evidence.difference(
                    list(terms[0]) + [bootstrap.Term(-t.coef, t.seed, t.statistic, t.unit) for t in terms[1]]
                )
            ]
            digits = metric.digits
            fields = verdict_from("gain", found, (gains[0] > gains[1], noise, [gains[0] - gains[1]]))
            out.append(
                Verdict(
                    f"{titles.get(first, first)} vs {titles.get(second, second)}",
                    f"gain of {row_label(check.a)} over {row_label(other)}",
                    label(key),
                    f"{gains[0]:+.{digits}f} vs {gains[1]:+.{digits}f}",
                    digits=digits,
                    partial=seeds_note(*terms),
                    one_seed=one_seed(*flat),
                    **fields,
                )
            )
    return out


def trend(
    check: DictConfig, runs: list[Run], titles: dict, evidence: Evidence | None = None, margins: dict | None = None
) -> list[Verdict]:
    evidence = evidence or Evidence(runs)
    out = []
    for key in check.metrics:
        metric = metric_of(key)[0]
        values = [cell(runs, check.experiment, row, key) for row in check.rows]
        if any(v is None for v in values):
            continue
        steps = [improvement(b, a, metric) for a, b in zip(values, values[1:])]
        noise = any(within_noise(a, b, s) for a, b, s in zip(values, values[1:], steps))
        terms = [
            evidence.advantage(check.experiment, later, earlier, key)
            for earlier, later in zip(check.rows, check.rows[1:])
        ]
        reason = next((t for t in terms if isinstance(t, str)), None)
        found = reason or [evidence.difference(t) for t in terms]
        out.append(
            Verdict(
                titles.get(check.experiment, check.experiment),
                " → ".join(row_label(r) for r in check.rows),
                label(key),
                " → ".join(show(v, key) for v in values),
                digits=metric.digits,
                partial=seeds_note(*terms),
                one_seed=one_seed(*values),
                **verdict_from("trend", found, (all(s > 0 for s in steps), noise, steps)),
            )
        )
    return out


def level(
    check: DictConfig, runs: list[Run], titles: dict, evidence: Evidence | None = None, margins: dict | None = None
) -> list[Verdict]:
    """One row's metric against 0, for metrics that are a difference within each run (``growth_90``: its sets'
    size where the members disagree most minus elsewhere): strict, above 0 in the metric's direction."""
    evidence = evidence or Evidence(runs)
    out = []
    for key in check.metrics:
        metric = metric_of(key)[0]
        value = cell(runs, check.experiment, check.a, key)
        if value is None:
            continue
        point = value.mean if metric.higher_is_better else -value.mean
        noise = value.seeds > 1 and abs(value.mean) <= (value.std or 0.0)
        terms = evidence.own(check.experiment, check.a, key)
        found = terms if isinstance(terms, str) else [evidence.difference(terms)]
        out.append(
            Verdict(
                titles.get(check.experiment, check.experiment),
                f"{row_label(check.a)} against 0",
                label(key),
                show(value, key),
                digits=metric.digits,
                partial=seeds_note(terms),
                one_seed=value.seeds < 2,
                **verdict_from("better", found, (point > 0, noise, [point])),
            )
        )
    return out


KINDS = {"compare": compare, "gain": gain, "trend": trend, "level": level}


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
    return {
        kind: {
            w: sum(v.verdict == w for v in verdicts if v.no_interval is None and v.kind == kind)
            for w in (HELD, REVERSED, UNRESOLVED)
        }
        for kind in (STRICT, LENIENT)
    }


def family(verdicts: list[Verdict]) -> list[Verdict]:
    """The family of strict comparisons a multiplicity correction counts: each strict verdict decided by one
    interval that covers the seeds' training variance. Left out: lenient checks (another test), trends (several
    steps, each its own difference), comparisons without an interval and one-seed rows (test set only)."""
    return [
        v
        for v in verdicts
        if v.kind == STRICT
        and v.no_interval is None
        and len(v.differences) == 1
        and v.differences[0].p is not None
        and v.training
    ]


def holm_step_down(p_values: list[float], verdicts: list[str], alpha: float = 0.05) -> list[str]:
    """Holm's step-down over one family: each comparison's verdict at family-wise error ``alpha``, in the given
    order. Sorted by p-value, the i-th smallest (from 0) is rejected while p <= alpha / (m - i); a rejected
    comparison keeps its own verdict (held or reversed, the side its interval lies on), the rest are
    unresolved. Holm's rejections are a subset of the unadjusted ones at ``alpha``, so no verdict flips side."""
    adjusted, rejecting = [UNRESOLVED] * len(p_values), True
    for i, k in enumerate(sorted(range(len(p_values)), key=p_values.__getitem__)):
        rejecting = rejecting and p_values[k] <= alpha / (len(p_values) - i)
        adjusted[k] = verdicts[k] if rejecting else UNRESOLVED
    return adjusted


def holm(verdicts: list[Verdict], alpha: float = 0.05) -> dict[int, str]:
    """``holm_step_down`` over ``verdicts`` (a ``family``): {id(verdict): its verdict at family-wise error
    ``alpha``}."""
    adjusted = holm_step_down([v.differences[0].p for v in verdicts], [v.verdict for v in verdicts], alpha)
    return {id(v): a for v, a in zip(verdicts, adjusted)}


def changed(judged: list[tuple[DictConfig, list[Verdict]]]) -> list[Verdict]:
    """The verdicts that differ from the replaced procedure's."""
    return [v for _, verdicts in judged for v in verdicts if v.previous is not None and v.previous.verdict != v.verdict]


__all__ = [
    "Verdict",
    "Previous",
    "load_claims",
    "judge",
    "decide",
    "changed",
    "counts",
    "family",
    "holm",
    "holm_step_down",
    "margins_of",
    "STRICT",
    "LENIENT",
]
