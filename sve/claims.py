"""The paper's claims, checked against stored runs: ``python scripts/mini_report.py`` (``make mini-report``).

A claims file (``configs/claims/<name>.yaml``) lists the paper's claims; each holds checks on the cells of
the tables (a cell: one experiment, method and member count, its test metric averaged over the seeds found,
exactly as ``sve.report`` builds it). A check says which way the paper points and the verdict says whether
ours points the same way:

- ``compare``: row ``a`` against each row of ``against`` on each metric, ``expect`` one of ``better`` (the
  default), ``worse`` or ``at_least`` (better, or apart by less than the seeds' spread); ``similar`` gives
  metrics where ``a`` may trail by a tolerance in displayed units (accuracy "at similar accuracy").
- ``gain``: how much ``a`` improves on each row of ``against`` in the first experiment against the second
  (Fig. 2: more with pretrained weights than from random ones).
- ``trend``: ``rows`` in order (e.g. SVE at M = 1, 2, 4) each improving on the one before (Table 6).

A row is ``method:members`` (``sve:4``). A metric is a test metric key (``ece``, ``ood_auroc``) or
``sev<k>/<key>`` for the shift sets at severity k (the mean over corruptions, as Fig. 3 plots it). A
difference smaller than the larger of the two cells' standard deviations is called "within seed noise", so
a reader sees which verdicts the seeds can tell apart. Verdicts are computed, never written by hand; a
claim's ``note`` (hand-written, after reading the results) says why a direction did not hold where a
reason is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from sve.report import METHOD_NAMES, METRICS, REPO, Cell, Metric, Run, aggregate, parse_row, select

CLAIMS = REPO / "configs" / "claims"
EXPECT = ("better", "worse", "at_least")


@dataclass
class Verdict:
    setting: str  # the experiment (or experiments) compared
    comparison: str  # "SVE (M=4) vs Single"
    metric: str  # label shown
    ours: str  # the two values (or the sequence), as displayed
    held: bool
    noise: bool  # the difference is within the seeds' spread


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
    return a.seeds < 2 or b.seeds < 2 or abs(difference) <= spread


def label(key: str) -> str:
    metric, severity = metric_of(key)
    text = f"{metric.label} {metric.arrow}".strip()
    return f"{text}, severity {severity}" if severity is not None else text


def show(value: Cell | None, key: str) -> str:
    return "–" if value is None else value.text(metric_of(key)[0])


def compare(check: DictConfig, runs: list[Run], titles: dict) -> list[Verdict]:
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
                held = {"better": gain > 0, "worse": gain < 0, "at_least": gain > 0 or noise}[expect]
            out.append(Verdict(titles.get(check.experiment, check.experiment),
                               f"{row_label(check.a)} vs {row_label(other)}"
                               + (f" (similar within {similar[key]})" if key in similar else
                                  " (expected worse)" if expect == "worse" else ""),
                               label(key), f"{show(a, key)} vs {show(b, key)}", held, noise))  # fmt: skip
    return out


def gain(check: DictConfig, runs: list[Run], titles: dict) -> list[Verdict]:
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
            noise = min(v.seeds for v in flat) < 2 or abs(gains[0] - gains[1]) <= max(v.std or 0.0 for v in flat)
            digits = metric.digits
            out.append(Verdict(f"{titles.get(first, first)} vs {titles.get(second, second)}",
                               f"gain of {row_label(check.a)} over {row_label(other)}", label(key),
                               f"{gains[0]:+.{digits}f} vs {gains[1]:+.{digits}f}", gains[0] > gains[1],
                               noise))  # fmt: skip
    return out


def trend(check: DictConfig, runs: list[Run], titles: dict) -> list[Verdict]:
    out = []
    for key in check.metrics:
        metric = metric_of(key)[0]
        values = [cell(runs, check.experiment, row, key) for row in check.rows]
        if any(v is None for v in values):
            continue
        steps = [improvement(b, a, metric) for a, b in zip(values, values[1:])]
        noise = any(within_noise(a, b, s) for a, b, s in zip(values, values[1:], steps))
        out.append(Verdict(titles.get(check.experiment, check.experiment),
                           " → ".join(row_label(r) for r in check.rows), label(key),
                           " → ".join(show(v, key) for v in values), all(s > 0 for s in steps), noise))  # fmt: skip
    return out


KINDS = {"compare": compare, "gain": gain, "trend": trend}


def judge(claims: DictConfig, runs: list[Run]) -> list[tuple[DictConfig, list[Verdict]]]:
    """Every claim with the verdicts of its checks (checks whose cells are missing give none)."""
    titles = dict(claims.get("settings") or {})
    out = []
    for claim in claims.claims:
        verdicts = []
        for check in claim.checks:
            kind = check.get("kind", "compare")
            if kind not in KINDS:
                raise ValueError(f"check kind {kind!r} is not valid; choose one of {list(KINDS)}")
            verdicts += KINDS[kind](check, runs, titles)
        out.append((claim, verdicts))
    return out


def summary(verdicts: list[Verdict]) -> str:
    if not verdicts:
        return "No verdict yet: the runs it needs are missing."
    held = sum(v.held for v in verdicts)
    clear = [v for v in verdicts if not v.noise]
    clear_held = sum(v.held for v in clear)
    return (f"The paper's direction held in {held} of {len(verdicts)} comparisons; of the {len(clear)} whose "
            f"difference exceeds the seeds' spread, it held in {clear_held}.")


def to_markdown(judged: list[tuple[DictConfig, list[Verdict]]]) -> str:
    lines = []
    for claim, verdicts in judged:
        lines += [f"### {claim.title}", "", f"**The paper:** {claim.paper}", "",
                  f"**Our miniature:** {summary(verdicts)}", ""]  # fmt: skip
        if verdicts:
            lines += ["| setting | comparison | metric | ours | direction held? |", "|:--|:--|:--|:--|:--|"]
            for v in verdicts:
                verdict = ("yes" if v.held else "**no**") + (" (within seed noise)" if v.noise else "")
                lines.append(f"| {v.setting} | {v.comparison} | {v.metric} | {v.ours} | {verdict} |")
            lines.append("")
        if claim.get("note"):
            lines += [f"**Why:** {claim.note.strip()}", ""]
    return "\n".join(lines)


def claims_markdown(name: str, root: Path, runs: list[Run] | None = None) -> str:
    from sve.report import load_runs

    return to_markdown(judge(load_claims(name), runs if runs is not None else load_runs(root)))


__all__ = ["Verdict", "load_claims", "cell", "judge", "to_markdown", "claims_markdown", "summary"]
