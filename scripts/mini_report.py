"""Writes results/mini/README.md from the miniature's runs: ``make mini-report`` (``make mini`` ends with it).

The prose is the template ``sve/configs/claims/mini_readme.md``; everything numeric is filled in from the runs:

- ``{{runs}}``: how many runs, from which commits (a ``-dirty`` commit is flagged);
- ``{{times}}``: per experiment, the runs trained (tuning included) and their summed wall time;
- ``{{settings}}``: per experiment, the model, data sizes, epochs and batch, and each row's learning rate
  (chosen on validation, ``tuned.json``, with the grid it searched and any edge it was left on; or fixed);
- ``{{budget}}``: the budget measured for every method (``sve.paper.budget``: minutes per run, run counts, each
  method's convergence along its learning curve);
- ``{{table:<name>}}``: the built table ``<root>/tables/<name>.md`` (``make mini-tables`` builds them);
- ``{{figure:<file>}}``: a link to ``<root>/figures/<file>`` when it exists;
- ``{{claims}}``: the verdicts of ``sve/configs/claims/mini.yaml`` (``sve.paper.claims``): each comparison's difference
  with its 95% interval, "held", "reversed" or "unresolved", strict and lenient counted apart, and how far the
  members of each SVE-family row it compares moved apart;
- ``{{changes}}``: every verdict that changed from the procedure these replaced, with both intervals;
- ``{{multiplicity}}``: the headline counts over every claim, unadjusted and with Holm's correction for the family
  of strict comparisons (``sve.paper.claims_text.multiplicity_markdown``);
- ``{{singular_values}}``: for every SVE-family row, how far training moved the singular values
  (``sve.paper.movement``): the members' spread around their mean as a multiple of its initial value
  sigma_init * sqrt((M-1)/M), and the mean's shift from the pretrained values;
- ``{{status}}``: whether the miniature is complete, else the rows that still miss runs (each table's "Missing
  runs" list, a row shared by several tables named once), so a README written while the sweeps still run says so;
- ``{{reproduced}}``: for every teacher that ``make mini-distill`` trained again, whether its test metrics are the
  committed run's to the last digit, or how far they are (``reproduced.json``);
- ``{{procedure}}``: one paragraph on how those intervals and verdicts are made, with the claims file's
  bootstrap settings (``sve.paper.claims_text.procedure``).
"""

from __future__ import annotations

import argparse
import functools
import re
from collections import defaultdict
from pathlib import Path

from sve.cli.quiet import hide_noise
from sve.paper import open_answers, seed_stability
from sve.paper.budget import all_runs as all_results
from sve.paper.budget import report as budget_report
from sve.paper.claims import judge, load_claims
from sve.paper.claims_text import changes_markdown, claims_markdown, multiplicity_markdown, procedure
from sve.paper.display import METHOD_NAMES
from sve.paper.movement import SEPARATED, TEACHER, all_movements
from sve.paper.sittings import SITTINGS, recorded_runs, wall_seconds
from sve.paper.store import TEACHERS, load_runs
from sve.paths import CLAIMS
from sve.runs.results import read_json, read_results, relative_difference

TEMPLATE = CLAIMS / "mini_readme.md"


def experiment_of(results: dict) -> str:
    return results.get("experiment") or (results.get("config") or {}).get("experiment_name") or "?"


def runs_section(found: list[tuple[Path, dict]]) -> str:
    commits = defaultdict(int)
    for _, r in found:
        commits[r.get("git_commit") or "unknown"] += 1
    lines = [f"{len(found)} runs trained (tuning runs included), at these commits of this repository:", ""]
    for commit, n in sorted(commits.items(), key=lambda kv: -kv[1]):
        flag = " **(uncommitted changes)**" if commit.endswith("-dirty") else ""
        lines.append(f"- `{commit[:12]}`: {n} runs{flag}")
    return "\n".join(lines)


def times_section(found: list[tuple[Path, dict]], root: Path | None = None) -> str:
    """Per experiment the runs' summed time; then the wall time of ``make mini``: measured from the sweeps'
    record (``sittings.jsonl``: two workers overlapping in time count once) where there is one, else
    estimated as half the sum (two workers on 2 cores); and what rebuilding from the committed runs costs."""
    seconds, count = defaultdict(float), defaultdict(int)
    for _, r in found:
        seconds[experiment_of(r)] += float(r.get("wall_time_s") or 0.0)
        count[experiment_of(r)] += 1
    lines = ["| experiment | runs trained | time, summed over runs | per run |", "|:--|--:|--:|--:|"]
    for e in sorted(seconds):
        lines.append(f"| `{e}` | {count[e]} | {seconds[e] / 60:.0f} min | {seconds[e] / count[e] / 60:.1f} min |")
    total = sum(seconds.values())
    lines += [f"| all | {sum(count.values())} | {total / 3600:.2f} h | |", ""]
    recorded = recorded_runs(root) if root is not None else []
    measured = wall_seconds(recorded)
    if measured:
        lines.append(
            f"Each run used one CPU thread, two at a time on the 2 cores (`make mini`'s two workers). "
            f"Measured wall time: {measured / 3600:.2f} h during which at least one run was training (runs "
            f"overlapping in time counted once; {len(recorded)} runs by "
            f"{len({r.get('pid') for r in recorded})} sweep processes, in `{SITTINGS}`)."
        )
    else:
        lines.append(
            f"Each run used one CPU thread; `make mini` runs two at a time on the 2 cores, so its wall "
            f"time is about half the sum: {total / 7200:.1f} h (no record of the sweeps' own wall time)."
        )
    lines[-1] += (
        " That is what retraining everything costs (`make mini` from scratch; `budget.md` splits it into "
        "tuning and seeds). Checking these numbers needs none of it: committed runs are never trained "
        "again, and `make mini-report` rebuilds the tables, figures and this file from them in minutes."
    )
    return "\n".join(lines)


def scores_text(tuned: dict) -> str:
    scores = ", ".join(f"{v}: {s:.3f}" for v, s in tuned["scores"].items())
    return f"{tuned['metric'].split('/')[-1]}: {scores}"


def learning_rates(root: Path, experiment: str) -> list[str]:
    out = []
    for row in sorted((root / "runs" / experiment).glob("*_m*")):
        tuned = row / "tuned.json"
        method, _, members = row.name.rpartition("_m")
        name = f"{METHOD_NAMES.get(method, method)} (M={members})"
        if tuned.exists():
            t = read_json(tuned, "delete it to choose the learning rate again (make mini)")
            if t.get("from"):  # its scores stand once, on the row that chose the rate
                rate = f"{t['value']} (the choice of {t['from']})"
            else:
                grown = f"; grid grown by {', '.join(t['extended'])}" if t.get("extended") else ""
                edge = f"; **left on the {t['edge']} edge of the searched grid**" if t.get("edge") else ""
                rate = f"{t['value']} (validation {scores_text(t)}{grown}{edge})"
            knob = t.get("knob")
            if knob:  # the row's own diversity knob, tuned at that rate on a grid fixed before any result
                rate += f", diversity knob {knob['key']} {knob['value']} (validation {scores_text(knob)})"
            out.append(f"{name}: {rate}")
        else:
            seeds = sorted(row.glob("seed*/results.json"))
            if seeds:
                lr = read_results(seeds[0])["config"]["method"].get("lr")
                out.append(f"{name}: {lr} (fixed)")
    return out


def settings_section(root: Path, found: list[tuple[Path, dict]]) -> str:
    first: dict[str, dict] = {}
    for _, r in found:
        first.setdefault(experiment_of(r), r)
    lines = []
    for e, r in sorted(first.items()):
        c = r.get("config") or {}
        d, t, b = c.get("dataset") or {}, c.get("trainer") or {}, c.get("backbone") or {}
        val = d.get("val_size") if d.get("val_size") is not None else d.get("val_holdout")  # a subset of the hold-out
        sizes = ", ".join(
            f"{name} {n}"
            for name, n in (("train", d.get("train_size")), ("val", val), ("test", d.get("test_size")))
            if n is not None
        )
        epochs = t.get("max_epochs")
        pretrained = "pretrained" if b.get("pretrained", True) else "random init"
        lines.append(
            f"- `{e}`: {b.get('name')} ({pretrained}), {d.get('name')} ({sizes}), "
            f"{epochs} epoch{'s' if epochs != 1 else ''} at batch {d.get('batch_size')}; learning rates: "
            + "; ".join(learning_rates(root, e))
        )
    return "\n".join(lines)


# A run trained again on another machine differs from the 7th digit on (its kernels' rounding, grown along
# training; measured up to 1.6e-5 relative, in a member's ECE): within this, and at equal accuracy, it is the
# same run for the report's purposes. Beyond it, or at another accuracy, it is flagged.
SAME_RUN = 1e-4


def reproduction_gap(record: dict) -> tuple[float, str | None]:
    """(largest relative difference, its metric) between a retrained copy's test metrics and its run's."""
    gaps = [(relative_difference(*pair), key) for key, pair in (record.get("differ") or {}).items()]
    return max(gaps) if gaps else (0.0, None)


def same_run(record: dict) -> bool:
    return "test/acc" not in (record.get("differ") or {}) and reproduction_gap(record)[0] <= SAME_RUN


def reproduced_section(root: Path) -> str:
    """One line per run that ``mini_distill.py --retrain-teachers`` trained again: equal to the last digit, or
    its largest relative difference (and where), with the CPUs of the two runs where recorded."""
    records = sorted(Path(root, TEACHERS).rglob("reproduced.json"))
    if not records:
        return "*(no run trained again yet: `make mini-distill`)*"
    lines = []
    for path in records:
        record = read_json(path, "delete it to train the teacher again")
        gap, key = reproduction_gap(record)
        cpus = {k: (v or {}).get("cpu") for k, v in (record.get("numerics") or {}).items()}
        first, then = cpus.get("committed"), cpus.get("retrained")
        where = (
            "; CPUs not recorded (runs before results.json kept them)"
            if first is None and then is None
            else f"; CPUs {first or 'not recorded'} then {then or 'not recorded'}"
        )
        verdict = (
            "equal to the last digit"
            if not record.get("differ")
            else f"accuracy equal, the other test metrics within {gap:.1e} relative (largest: `{key}`{where})"
            if same_run(record)
            else f"**differs: {gap:.1e} relative in `{key}`**{where}"
        )
        lines.append(f"- `{Path(record['teacher']).relative_to('results/mini/runs')}`: {verdict}")
    return "\n".join(lines)


def singular_values_section(root: Path, runs: list | None = None, threshold: float | None = None) -> str:
    """One line per SVE-family row (``sve.paper.movement``): over the seeds that recorded it, the members' spread
    around their mean, its initial value sigma_init * sqrt((M-1)/M) and their ratio, and the mean's shift; which
    seeds' numbers come from a retrained copy (``teachers/``), and which retraining would give the missing ones."""
    threshold = SEPARATED if threshold is None else threshold
    moved = all_movements(root, runs if runs is not None else load_runs(root))
    if not moved:
        return "*(no SVE-family run yet)*"
    lines = [
        "| experiment | method | M | sigma_init | seeds recorded | member spread (%) | initial spread (%) | "
        "ratio | mean shift (%) |",
        "|:--|:--|--:|--:|:--|--:|--:|--:|--:|",
    ]
    missing, copied = [], False
    for m in moved:
        spread, shift = m.mean("member_spread"), m.mean("mean_shift")
        from_copies = [s for s in m.known if m.source.get(s) == TEACHER]
        copied = copied or bool(from_copies)
        seeds = f"{len(m.known)} of {len(m.record)}" + (
            f" ({len(from_copies)} from `teachers/`)¹" if from_copies else ""
        )
        ratio = (
            "one member"
            if m.members == 1
            else "–"
            if m.ratio is None
            else f"{m.ratio:.2f}" + (" (not separated)" if m.ratio < threshold else "")
        )
        initial = "–" if m.initial is None else f"{100 * m.initial:.2f}"
        lines.append(
            f"| `{m.experiment}` | {METHOD_NAMES.get(m.method, m.method)} | {m.members} | {m.sigma_init} | "
            f"{seeds} | {'–' if spread is None else f'{100 * spread:.2f}'} | {initial} | {ratio} | "
            f"{'–' if shift is None else f'{100 * shift:.2f}'} |"
        )
        if m.missing:
            missing.append(
                f"`{m.experiment}/{m.method}_m{m.members}` seed{'s' if len(m.missing) > 1 else ''} "
                f"{', '.join(map(str, m.missing))}"
            )
    lines += [
        "",
        f"Ratio: the trained spread over its initial value; below {threshold:g} the members did not "
        "separate (they still differ by their initial noise only). One member has no spread.",
    ]
    if copied:
        lines += [
            "",
            "¹ Trained before results.json recorded the movement; the numbers are those of the copy that "
            "`make mini-distill` trained again from the same command into `teachers/` (its test metrics against "
            "the committed run's: the distillation section above).",
        ]
    if missing:
        lines += [
            "",
            "–: trained before results.json recorded the movement (`method_report.singular_values`), with "
            "no retrained copy: " + "; ".join(missing) + ". Training such a seed again from the command its "
            "results.json records (as `scripts/mini_distill.py --retrain-teachers` does for the SVE teachers) "
            "would give it; no table reads the copy.",
        ]
    return "\n".join(lines)


MISSING_LINE = re.compile(r"^- (?P<row>.+? \(M=\d+\)): seeds? (?P<seeds>\d+(?:, \d+)*)")


def status_section(root: Path) -> str:
    """From the built tables' "Missing runs" lists (``sve.paper.render``): one line per row still missing seeds."""
    missing: dict[str, str] = {}  # row (experiment · method (M=...)) -> its missing seeds
    for table in sorted(Path(root, "tables").glob("*.md")):
        for line in table.read_text().splitlines():
            match = MISSING_LINE.match(line)
            if match:
                missing.setdefault(match["row"], match["seeds"])
    if not missing:
        return "**Complete**: every row of every table below has all its runs."
    seeds = sum(len(s.split(",")) for s in missing.values())
    lines = [
        f"**In progress**: {len(missing)} rows still miss runs ({seeds} seeds; their tuning runs not counted).",
        "The sweeps that train them skip every run committed here; the tables mark the missing cells –.",
        "",
    ]
    lines += [f"- {row}: seed{'s' if ',' in s else ''} {s}" for row, s in sorted(missing.items())]
    return "\n".join(lines)


def budget_section(root: Path) -> str:
    """``budget.md``'s tables without its title (``sve.paper.budget.report``, as ``make mini-budget`` writes it)."""
    text, _ = budget_report(root, None)
    return re.sub(r"^# .*\n+", "", text, count=1).replace("\n## ", "\n#### ").strip()


def table_section(root: Path, name: str) -> str:
    path = root / "tables" / f"{name}.md"
    if not path.exists():
        return f"*(table {name} not built yet: `make mini-tables`)*"
    return re.sub(r"^## ", "### ", path.read_text().strip(), count=1, flags=re.M)


def figure_section(root: Path, name: str) -> str:
    path = root / "figures" / name
    return f"![{name}](figures/{name})" if path.exists() else f"*(figure {name} not drawn yet)*"


def render(root: Path, template: str) -> str:
    found = all_results(root)
    runs = load_runs(root)
    claims = load_claims("mini")

    @functools.cache
    def judged() -> list:  # the intervals take most of a rebuild: computed once for the claims and the changes
        return judge(claims, runs)

    fill = {
        "runs": lambda: runs_section(found),
        "times": lambda: times_section(found, root),
        "settings": lambda: settings_section(root, found),
        "budget": lambda: budget_section(root),
        "singular_values": lambda: singular_values_section(root, runs, float(claims.get("separation", SEPARATED))),
        "status": lambda: status_section(root),
        "reproduced": lambda: reproduced_section(root),
        "claims": lambda: claims_markdown("mini", root, runs, judged()),
        "changes": lambda: changes_markdown(judged()),
        "multiplicity": lambda: multiplicity_markdown(
            judged(), seed_notes=seed_stability.notes(seed_stability.read(root), judged())
        ),
        "procedure": lambda: procedure(claims, root),
    }

    def replace(match: re.Match) -> str:
        key, _, arg = match.group(1).partition(":")
        if key == "table":
            return table_section(root, arg)
        if key == "figure":
            return figure_section(root, arg)
        if key not in fill:
            raise ValueError(
                f"unknown placeholder {{{{{match.group(1)}}}}}; choose table:<name>, figure:<file> "
                f"or one of {sorted(fill)}"
            )
        return fill[key]()

    return re.sub(r"\{\{([^}]+)\}\}", replace, template)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write results/mini/README.md from the miniature's runs.")
    parser.add_argument("--results", type=Path, default=Path("results") / "mini")
    parser.add_argument("--template", type=Path, default=TEMPLATE)
    args = parser.parse_args(argv)
    hide_noise()  # composing the method options imports their libraries (laplace-torch's notice at import)
    open_answers.build(args.results)  # tables/mini_open_answers.md, which the template shows
    text = render(args.results, args.template.read_text())
    out = args.results / "README.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
