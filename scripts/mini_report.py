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
  with its paired-bootstrap 95% interval, "held", "reversed" or "unresolved";
- ``{{singular_values}}``: for every SVE-family row, how far training moved the singular values (the
  members' spread around their mean and the mean's shift from the pretrained values, from each run's
  ``method_report``), beside its ``sigma_init``: a spread still near sigma_init says the members differ by
  their initial noise only;
- ``{{status}}``: whether the miniature is complete, else the rows that still miss runs (each table's "Missing
  runs" list, a row shared by several tables named once), so a README written while the sweeps still run says so;
- ``{{reproduced}}``: for every teacher that ``make mini-distill`` trained again, whether its test metrics are the
  committed run's to the last digit, or how far they are (``reproduced.json``);
- ``{{procedure}}``: one paragraph on how those intervals and verdicts are made, with the claims file's
  bootstrap settings (``sve.paper.claims.procedure``).
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

from sve.paper.budget import all_runs as all_results
from sve.paper.budget import report as budget_report
from sve.paper.claims import CLAIMS, claims_markdown, load_claims, procedure
from sve.paper.report import METHOD_NAMES, load_runs, members_of
from sve.paper.store import TEACHERS
from sve.paper.sweep import SITTINGS, recorded_runs, wall_seconds
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


TARGET_HOURS = 6.0  # wall time the miniature is sized for, on 2 CPU cores (issue 23)


def times_section(found: list[tuple[Path, dict]], root: Path | None = None) -> str:
    """Per experiment the runs' summed time; then the wall time of ``make mini``: measured from the sweeps'
    record (``sittings.jsonl``: two workers overlapping in time count once) where there is one, else
    estimated as half the sum (two workers on 2 cores)."""
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
        hours = measured / 3600
        lines.append(f"Each run used one CPU thread, two at a time on the 2 cores (`make mini`'s two workers). "
                     f"Measured wall time: {hours:.2f} h during which at least one run was training (runs "
                     f"overlapping in time counted once; {len(recorded)} runs by "
                     f"{len({r.get('pid') for r in recorded})} sweep processes, in `{SITTINGS}`).")  # fmt: skip
    else:
        hours = total / 7200
        lines.append(f"Each run used one CPU thread; `make mini` runs two at a time on the 2 cores, so its wall "
                     f"time is about half the sum: {hours:.1f} h (no record of the sweeps' own wall time).")
    over = hours / TARGET_HOURS
    if over > 1.1:
        lines[-1] += (f" That is {over:.1f} times the target of about {TARGET_HOURS:.0f} h for the whole of "
                      "`make mini`; `budget.md` splits it into tuning and seeds, and says what the seeds alone "
                      "would cost" + fitting_subsets(root) + ".")
    return "\n".join(lines)


def fitting_subsets(root: Path | None) -> str:
    """What ``budget.json`` (``make mini-budget``) says the target would take: the largest fraction of today's
    training subsets at which the same rows, seeds, grids and evaluation fit it."""
    budget = root / "budget.json" if root is not None else None
    if budget is None or not budget.exists():
        return ""
    record = read_json(budget, "make mini-budget writes it again")
    if "fraction_to_fit" not in record:  # a budget.json written before it said so
        return ""
    fraction = record["fraction_to_fit"]
    if fraction is None:
        return " and that evaluation alone exceeds the target, so fitting it needs fewer rows, seeds or test examples"
    return (f" and that the same rows, seeds, grids and evaluation would fit it only with training subsets of at "
            f"most {100 * fraction:.0f}% of today's")


def learning_rates(root: Path, experiment: str) -> list[str]:
    out = []
    for row in sorted((root / "runs" / experiment).glob("*_m*")):
        tuned = row / "tuned.json"
        method, _, members = row.name.rpartition("_m")
        name = f"{METHOD_NAMES.get(method, method)} (M={members})"
        if tuned.exists():
            t = read_json(tuned, "delete it to choose the learning rate again (make mini)")
            scores = ", ".join(f"{v}: {s:.3f}" for v, s in t["scores"].items())
            source = f"the choice of {t['from']}, " if t.get("from") else ""
            grown = f"; grid grown by {', '.join(t['extended'])}" if t.get("extended") else ""
            edge = f"; **left on the {t['edge']} edge of the searched grid**" if t.get("edge") else ""
            out.append(f"{name}: {t['value']} ({source}validation {t['metric'].split('/')[-1]}: {scores}{grown}{edge})")
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
        sizes = ", ".join(f"{name} {n}" for name, n in (("train", d.get("train_size")), ("val", val),
                                                         ("test", d.get("test_size"))) if n is not None)  # fmt: skip
        epochs = t.get("max_epochs")
        pretrained = "pretrained" if b.get("pretrained", True) else "random init"
        lines.append(f"- `{e}`: {b.get('name')} ({pretrained}), {d.get('name')} ({sizes}), "
                     f"{epochs} epoch{'s' if epochs != 1 else ''} at batch {d.get('batch_size')}; learning rates: "
                     + "; ".join(learning_rates(root, e)))  # fmt: skip
    return "\n".join(lines)


# A run trained again on another machine differs from the 7th digit on (its kernels' rounding, grown along
# training; measured up to 1.6e-5 relative, in a member's ECE): within this, and at equal accuracy, it is the
# same run for the report's purposes. Beyond it, or at another accuracy, it is flagged.
SAME_RUN = 1e-4


def reproduction_gap(record: dict) -> tuple[float, str | None]:
    """The largest relative difference between a retrained copy's test metrics and its run's
    (``reproduced.json``), and the metric that has it."""
    gaps = [(relative_difference(*pair), key) for key, pair in (record.get("differ") or {}).items()]
    return max(gaps) if gaps else (0.0, None)


def same_run(record: dict) -> bool:
    return "test/acc" not in (record.get("differ") or {}) and reproduction_gap(record)[0] <= SAME_RUN


def reproduced_movement(root: Path, run: Path) -> dict | None:
    """The movement recorded by the run's copy that ``mini_distill.py --retrain-teachers`` trained again, when
    that copy reproduced the run's test metrics (``same_run``: to the last digit, or to another machine's
    rounding; its ``reproduced.json``)."""
    copy = Path(root, TEACHERS, run.relative_to(Path(root, "runs")))
    if not (copy / "reproduced.json").is_file() or not (copy / "results.json").is_file():
        return None
    if not same_run(read_json(copy / "reproduced.json", "delete it to train the teacher again")):
        return None
    return (read_results(copy / "results.json").get("method_report") or {}).get("singular_values")


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
        where = ("; CPUs not recorded (runs before results.json kept them)" if first is None and then is None
                 else f"; CPUs {first or 'not recorded'} then {then or 'not recorded'}")  # fmt: skip
        verdict = ("equal to the last digit" if not record.get("differ")
                   else f"accuracy equal, the other test metrics within {gap:.1e} relative (largest: `{key}`{where})"
                   if same_run(record)
                   else f"**differs: {gap:.1e} relative in `{key}`**{where}")  # fmt: skip
        lines.append(f"- `{Path(record['teacher']).relative_to('results/mini/runs')}`: {verdict}")
    return "\n".join(lines)


def singular_values_section(root: Path) -> str:
    """One line per SVE-family row (a method that decomposed weights: ``svd_seconds`` in its report), over its
    seeds' runs (a seed that is a copy of the chosen tuning run included; tuning runs themselves left out),
    with the mean over the seeds that recorded the movement."""
    rows: dict[tuple, list] = defaultdict(list)
    for path in sorted(Path(root, "runs").glob("*/*/seed*/results.json")):
        r = read_results(path)
        report = r.get("method_report") or {}
        if "svd_seconds" not in report:
            continue
        sigma = (r.get("config") or {}).get("sigma_init")
        rows[(experiment_of(r), r.get("method"), members_of(r), sigma)].append(
            report.get("singular_values") or reproduced_movement(root, path.parent))
    if not rows:
        return "*(no SVE-family run yet)*"
    lines = ["| experiment | method | M | sigma_init | seeds recorded | member spread (%) | mean shift (%) |",
             "|:--|:--|--:|--:|--:|--:|--:|"]  # fmt: skip
    for (experiment, method, members, sigma), moved in sorted(rows.items(), key=str):
        known = [m for m in moved if m]
        spread = f"{100 * sum(m['member_spread'] for m in known) / len(known):.2f}" if known else "–"
        shift = f"{100 * sum(m['mean_shift'] for m in known) / len(known):.2f}" if known else "–"
        lines.append(f"| `{experiment}` | {METHOD_NAMES.get(method, method)} | {members} | {sigma} | "
                     f"{len(known)} of {len(moved)} | {spread} | {shift} |")  # fmt: skip
    lines += ["", "–: runs trained before results.json recorded the movement (`method_report.singular_values`); a run "
              "that `make mini-distill` trained again (`teachers/`) to the same accuracy and test metrics within "
              f"{SAME_RUN:.0e} relative (another machine's rounding; see the distillation section) reports its copy's."]
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
    lines = [f"**In progress**: {len(missing)} rows still miss runs ({seeds} seeds; their tuning runs not counted).",
             "The sweeps that train them skip every run committed here; the tables mark the missing cells –.", ""]
    lines += [f"- {row}: seed{'s' if ',' in s else ''} {s}" for row, s in sorted(missing.items())]
    return "\n".join(lines)


def budget_section(root: Path) -> str:
    """``budget.md``'s tables without its title (``sve.paper.budget.report``, as ``make mini-budget`` writes it)."""
    text, _ = budget_report(root, None, TARGET_HOURS)
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
    fill = {"runs": lambda: runs_section(found), "times": lambda: times_section(found, root),
            "settings": lambda: settings_section(root, found),
            "budget": lambda: budget_section(root),
            "singular_values": lambda: singular_values_section(root),
            "status": lambda: status_section(root),
            "reproduced": lambda: reproduced_section(root),
            "claims": lambda: claims_markdown("mini", root, runs),
            "procedure": lambda: procedure(load_claims("mini"))}  # fmt: skip

    def replace(match: re.Match) -> str:
        key, _, arg = match.group(1).partition(":")
        if key == "table":
            return table_section(root, arg)
        if key == "figure":
            return figure_section(root, arg)
        if key not in fill:
            raise ValueError(f"unknown placeholder {{{{{match.group(1)}}}}}; choose table:<name>, figure:<file> "
                             f"or one of {sorted(fill)}")  # fmt: skip
        return fill[key]()

    return re.sub(r"\{\{([^}]+)\}\}", replace, template)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write results/mini/README.md from the miniature's runs.")
    parser.add_argument("--results", type=Path, default=Path("results") / "mini")
    parser.add_argument("--template", type=Path, default=TEMPLATE)
    args = parser.parse_args(argv)
    text = render(args.results, args.template.read_text())
    out = args.results / "README.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
