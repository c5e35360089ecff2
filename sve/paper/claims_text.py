"""The claims' verdicts as markdown: their tables with a summary each, the changed verdicts, the procedure's words."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from sve.paper import bootstrap
from sve.paper.claims import (
    HELD,
    LENIENT,
    NOT_HELD,
    REVERSED,
    STRICT,
    UNRESOLVED,
    Verdict,
    changed,
    counts,
    family,
    holm,
    judge,
    load_claims,
    margins_of,
    row_label,
)
from sve.paper.evidence import BOOTSTRAP
from sve.paper.store import Run

KIND_NAMES = {STRICT: 'Strict ("better")', LENIENT: 'Lenient ("not worse" within a margin)'}
GRID_CELLS = Path("diagnostics/coverage_grid/cells.jsonl")  # under a results root (make mini-coverage-grid)


def summary(verdicts: list[Verdict]) -> str:
    if not verdicts:
        return "No verdict yet: the runs it needs are missing."
    parts = []
    # One-seed rows' intervals cover the test set only: shown with the claim, counted apart from the tallies.
    seeded = [v for v in verdicts if v.training]
    for kind, n in counts(seeded).items():
        total = sum(n.values())
        if total:
            parts.append(
                f"{KIND_NAMES[kind]}: of {total} with a 95% interval, held in {n[HELD]}, reversed in "
                f"{n[REVERSED]}, unresolved in {n[UNRESOLVED]}."
            )
        if kind == LENIENT and n[HELD]:
            # A lenient hold whose interval contains 0 says "not worse", not "better": counted apart.
            better = sum(
                v.verdict == HELD and v.interval is not None and v.interval[0] > 0
                for v in seeded
                if v.kind == LENIENT and v.no_interval is None
            )
            parts.append(
                f"Of those {n[HELD]} held, {better} also better (interval above 0) and {n[HELD] - better} "
                "not worse only (interval containing 0)."
            )
    test_only = [v for v in verdicts if not v.training and v.no_interval is None]
    if test_only:
        held = sum(v.verdict == HELD for v in test_only)
        parts.append(
            f"Not counted above: {len(test_only)} comparisons of one-seed rows, whose intervals cover the test set "
            f"only (held in {held})."
        )
    rest = [v for v in verdicts if v.no_interval is not None]
    if rest:
        clear = [v for v in rest if not v.noise]
        reasons = "; ".join(sorted({v.no_interval for v in rest}))
        held, clear_held = sum(v.held for v in rest), sum(v.held for v in clear)
        parts.append(
            f"{'Another' if parts else 'These'} {len(rest)} comparisons have no interval ({reasons}): by "
            f"the direction of the means the paper's held in {held}; of the {len(clear)} whose difference "
            f"exceeds the seeds' spread, it held in {clear_held}."
        )
    return " ".join(parts)


def verdict_text(v: Verdict, seed_note: str | None = None) -> str:
    """The verdict with its notes; ``seed_note``: whether other bootstrap seeds decide it otherwise
    (``sve.paper.seed_stability``)."""
    word = f"**{v.verdict}**" if v.verdict in (REVERSED, NOT_HELD) else v.verdict
    if v.no_interval is None:
        notes = [v.partial] if v.partial else []
        if seed_note:
            notes.append(seed_note)
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


def to_markdown(
    judged: list[tuple[DictConfig, list[Verdict]]], members: dict | None = None, seed_notes: dict | None = None
) -> str:
    """The claims with their verdict tables; ``members``: {claim title: sentences on how far the members of its
    SVE-family rows moved apart} (``movement_sentences``), printed after its table; ``seed_notes``: the
    borderline verdicts (``sve.paper.seed_stability.notes``)."""
    lines = []
    marked = (seed_notes or {}).get("verdict", {})
    for claim, verdicts in judged:
        lines += [
            f"### {claim.title}",
            "",
            f"**The paper:** {claim.paper}",
            "",
            f"**Our miniature:** {summary(verdicts)}",
            "",
        ]
        if verdicts:
            lines += [
                "| setting | comparison | metric | ours | difference [95% CI] | verdict |",
                "|:--|:--|:--|:--|:--|:--|",
            ]
            for v in verdicts:
                difference = "; ".join(d.text(v.digits) for d in v.differences)
                lines.append(
                    f"| {v.setting} | {v.comparison} | {v.metric} | {v.ours} | {difference} | "
                    f"{verdict_text(v, marked.get(id(v)))} |"
                )
            lines.append("")
        if (members or {}).get(claim.title):
            lines += [members_text(members[claim.title]), ""]
        if claim.get("note"):
            lines += [f"**Why:** {claim.note.strip()}", ""]
    return "\n".join(lines)


def changes_markdown(judged: list[tuple[DictConfig, list[Verdict]]]) -> str:
    """A table of every verdict that changed from the replaced procedure, with both intervals."""
    found = changed(judged)
    total = sum(len(verdicts) for _, verdicts in judged)
    if not found:
        return f"None of the {total} verdicts changed."
    lines = [
        f"{len(found)} of the {total} verdicts changed:",
        "",
        "| setting | comparison | metric | before: difference [95% CI] | verdict | now: difference [95% CI] | "
        "verdict |",
        "|:--|:--|:--|:--|:--|:--|:--|",
    ]
    for v in found:
        before = "; ".join(d.text(v.digits) for d in v.previous.differences)
        now = "; ".join(d.text(v.digits) for d in v.differences)
        lines.append(
            f"| {v.setting} | {v.comparison} | {v.metric} | {before} | {v.previous.verdict} | {now} | {v.verdict} |"
        )
    return "\n".join(lines)


def multiplicity_markdown(
    judged: list[tuple[DictConfig, list[Verdict]]], alpha: float = 0.05, seed_notes: dict | None = None
) -> str:
    """The headline counts over every claim: the family of strict comparisons (``sve.paper.claims.family``), its
    verdicts unadjusted and with Holm's correction, each verdict the correction leaves unresolved, and (with
    ``seed_notes``) the headline verdicts that another bootstrap seed decides otherwise."""
    verdicts = [v for _, found in judged for v in found]
    members = family(verdicts)
    if not members:
        return "No strict comparison has an interval yet."
    adjusted = holm(members, alpha)
    before = {w: sum(v.verdict == w for v in members) for w in (HELD, REVERSED, UNRESOLVED)}
    after = {w: sum(adjusted[id(v)] == w for v in members) for w in (HELD, REVERSED, UNRESOLVED)}
    one_seed = [v for v in verdicts if v.kind == STRICT and v.no_interval is None and not v.training]
    lines = [
        f"The family: the {len(members)} strict comparisons below that one interval decides and whose interval "
        f"covers the seeds' training variance, across {len(judged)} claims. Left out: lenient checks (another "
        f"test: not worse within a margin), trends (several steps), comparisons with no interval, and "
        f"{len(one_seed)} comparisons of one-seed rows (their intervals cover the test set only; shown with "
        "their claims, not counted here).",
        "",
        f"- **With Holm's correction** for {len(members)} comparisons (family-wise error {100 * alpha:g}%), the "
        f"headline: held in {after[HELD]}, reversed in {after[REVERSED]}, unresolved in {after[UNRESOLVED]}.",
        f"- Unadjusted (each comparison at 95% on its own): held in {before[HELD]}, reversed in "
        f"{before[REVERSED]}, unresolved in {before[UNRESOLVED]}.",
        f"- What the correction asks: the smallest p must be below {alpha:g} / {len(members)}. Where the seeds' "
        f"spread dominates an interval, three seeds give Student's t with 2 degrees of freedom, which reaches "
        f"that level only at {bootstrap.quantile(1 - alpha / len(members), 2):.1f} standard errors (the normal "
        f"quantile: {bootstrap.quantile(1 - alpha / len(members)):.1f}; five seeds: "
        f"{bootstrap.quantile(1 - alpha / len(members), 4):.1f}): more seeds, not more test examples, are what "
        "would resolve more of the family.",
    ]
    lines += seeds_lines(members, adjusted, seed_notes)
    loosened = [v for v in members if adjusted[id(v)] != v.verdict]
    if loosened:
        lines += [
            "",
            f"The {len(loosened)} verdicts that the correction leaves unresolved (p: the two-sided p-value the "
            "interval inverts; Holm's threshold for the i-th smallest of m is 0.05 / (m - i + 1)):",
            "",
            "| setting | comparison | metric | difference [95% CI] | p | verdict | with Holm |",
            "|:--|:--|:--|:--|--:|:--|:--|",
        ]
        for v in sorted(loosened, key=lambda v: v.differences[0].p):
            d = v.differences[0]
            lines.append(
                f"| {v.setting} | {v.comparison} | {v.metric} | {d.text(v.digits)} | {d.p:.4f} | {v.verdict} | "
                f"{adjusted[id(v)]} |"
            )
    return "\n".join(lines)


def seeds_lines(members: list[Verdict], adjusted: dict[int, str], seed_notes: dict | None) -> list[str]:
    """The headline's dependence on the bootstrap seed (``sve.paper.seed_stability``), when it was measured."""
    if seed_notes is None:
        return []
    from sve.paper.seed_stability import NOT_MEASURED

    unmeasured = [v for v in members if seed_notes["verdict"].get(id(v)) == NOT_MEASURED]
    moving = [v for v in members if id(v) in seed_notes["holm"]]
    lines = [
        f"- Bootstrap seeds: {len(moving)} of the {len(members)} headline verdicts (with Holm) change with the "
        "bootstrap's seed (`diagnostics/bootstrap_seeds.json`, `make mini-bootstrap-seeds`)"
        + (f"; {len(unmeasured)} were not measured (their runs changed since)" if unmeasured else "")
        + (":" if moving else "."),
    ]
    if moving:
        lines += [
            "",
            "| setting | comparison | metric | difference [95% CI] | with Holm | |",
            "|:--|:--|:--|:--|:--|:--|",
        ]
        for v in moving:
            lines.append(
                f"| {v.setting} | {v.comparison} | {v.metric} | {v.differences[0].text(v.digits)} | "
                f"{adjusted[id(v)]} | {seed_notes['holm'][id(v)]} |"
            )
    return lines


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
            named = (
                list(check.get("rows") or []) + ([check.a] if check.get("a") else []) + list(check.get("against") or [])
            )
            rows += [(e, r) for e in experiments for r in named if (e, r) not in rows]
        for experiment, row in rows:
            moved = movement.row_movement(root, runs, experiment, row)
            if moved is None or moved.members < 2:
                continue
            where = f"{row_label(row)}, {titles.get(experiment, experiment)}"
            if moved.ratio is None:
                out.setdefault(claim.title, []).append(
                    f'{where}: no record of its members\' spread (see "Did the singular values train?").'
                )
                continue
            said = (
                f"{moved.ratio:.2f} times its initial value: the members did not separate (below {threshold:g})"
                if moved.ratio < threshold
                else f"{moved.ratio:.2f} times its initial value"
            )
            out.setdefault(claim.title, []).append(f"{where}: the members' spread is {said}.")
    return out


def procedure(claims: DictConfig | None = None, root: Path | None = None) -> str:
    """One paragraph on how the verdicts are made, with the claims file's bootstrap settings and margins, the
    coverage measured by ``sve.paper.coverage`` (a simulation of a few seconds, run here so the number stated is
    the procedure's own) and, where ``root`` holds it, the coverage grid's summary (``make mini-coverage-grid``)."""
    from sve.paper import coverage

    options = {**BOOTSTRAP, **(OmegaConf.to_container(claims.bootstrap) if claims and claims.get("bootstrap") else {})}
    margins = margins_of(claims)
    level = float(options["level"])
    now, replaced, before, pooled = (
        coverage.coverage_range(p) for p in (bootstrap.VERDICTS, "combined", "per_seed", "hierarchical")
    )
    sizes = ", ".join(f"{n:,}" for n in coverage.SIZES)

    def percent(pair: tuple[float, float]) -> str:
        return f"{100 * pair[0]:.1f}-{100 * pair[1]:.1f}%"

    return (
        f"Each comparison's difference is the first row's advantage over the second in the table's units "
        f"(positive: better in the metric's direction), the difference of the two cells' means over the seeds. "
        f"Its {100 * level:g}% interval covers two sources of chance. The test set: every seed of both rows was "
        f"scored on the same test examples, so each of {int(options['replicates'])} replicates draws one "
        f"resample of those examples with replacement (numpy seed {int(options['seed'])}), shared by every seed "
        f"and both rows (and by a severity's corruption sets, which are the same images; in-distribution and "
        f"OOD examples apart); the difference's variance over the replicates is the test set's part. The seeds: "
        f"each seed's own difference scatters around their mean by the training variance plus the part of the "
        f"test set's noise that differs between seeds (each training gets other examples right, and fills an "
        f"ECE's bins its own way). Both are measured from the same S per-seed differences, so the interval takes "
        f"their whole sample variance s² at Student's t with S − 1 degrees of freedom, and only the test-set "
        f"noise every seed shares (the replicates' variance less the part that differs between seeds, which the "
        f"replicates also measure) at the normal quantile z: the difference ± the square root of (z² × the "
        f"shared test-set variance + t² × s² / S). Three seeds give two degrees of freedom, so t is "
        f"{bootstrap.quantile(level, 2):.2f} instead of {bootstrap.quantile(level):.2f}, and intervals are wide "
        f"wherever the seeds disagree; resampling the three seeds instead (a two-level bootstrap) spreads their "
        f"variance by a third too little and has no t, and covers too rarely. On simulated predictions at the "
        f"miniature's sizes ({coverage.SEEDS} seeds; {sizes} test examples; training variance from none to "
        f"several times the test set's; accuracy and NLL; {coverage.DATASETS} data sets each, "
        f"`sve/paper/coverage.py`), these intervals contained the true difference in {percent(now)} of the data "
        f"sets, the procedure they replaced (all of the test-set noise at z, only the seeds' spread beyond it at "
        f"t) in {percent(replaced)}, the two-level bootstrap in {percent(pooled)}, and the per-seed bootstrap "
        f"used before that (each seed's examples resampled apart, the runs fixed) in {percent(before)}."
        f"{grid_sentence(root)} More seeds narrow the seeds' part twice, by 1/√S and through t "
        f"({bootstrap.quantile(level, 3):.2f} at 4 seeds, {bootstrap.quantile(level, 9):.2f} at 10). A row with "
        f"one seed (the MPNet rows) has no training variance to measure: its interval covers the test set only, "
        f"its verdict says so, and it is left out of the headline counts. Two "
        f'kinds of verdict are counted apart. *Strict* ("better"): *held* when the interval lies entirely on '
        f'the claimed side of 0, *reversed* when entirely on the other, else *unresolved*. *Lenient* ("not '
        f'worse" within a margin): held when the interval lies entirely above minus the margin and the '
        f"difference itself is not below 0, reversed when the interval lies entirely below minus the margin, "
        f"else unresolved; a check's margin is stated in the claim, or else set by one rule fixed in the claims "
        f"file before the verdicts were computed: {margins['points']:g} point for a metric in percent, "
        f"{100 * margins['relative']:g}% of the second row's value for any other (NLL). A difference below 0 "
        f"is never held. A gain compares two experiments' differences, a trend requires every step to hold. A "
        f"seed whose run lacks the per-example files (`predictive/`, written by every evaluation since they "
        f"were introduced) is left out of the difference and its interval, and the verdict names it; a "
        f'comparison where no seed has them is judged by the sign of the means and marked "no interval".'
    )


def grid_sentence(root: Path | None) -> str:
    """The coverage grid's summary, when ``root`` holds a run of it, else nothing."""
    from sve.paper import coverage_grid

    found = coverage_grid.read(Path(root) / GRID_CELLS) if root is not None else {}
    if not found:
        return ""
    results = list(found.values())
    summary = coverage_grid.summary(results)
    lowest = {p: 100 * v["lowest"] for p, v in summary["procedures"].items()}
    return (
        f" Over the wider grid of the regimes the comparisons occupy (`{GRID_CELLS.parent}/README.md`: "
        f"{len(results)} cells of 2, 3 and 5 seeds, test-set noise shared by the seeds from none to all of it, "
        f"training spread from none to five times the test set's, accuracy, NLL, ECE and OOD AUROC; "
        f"{results[0]['datasets']:,} data sets each), the lowest coverage was {lowest[bootstrap.VERDICTS]:.1f}% "
        f"for this procedure and {lowest['combined']:.1f}% for the one it replaced; the grid's rule, fixed "
        f"before it ran, chose `{summary['chosen']}`."
    )


def claims_markdown(
    name: str, root: Path, runs: list[Run] | None = None, judged: list[tuple[DictConfig, list[Verdict]]] | None = None
) -> str:
    """The claims of ``name`` judged on the runs of ``root`` (or the ``judged`` of them), with the sentences on
    their SVE-family rows' members."""
    from sve.paper.store import load_runs

    claims = load_claims(name)
    runs = runs if runs is not None else load_runs(root)
    judged = judged if judged is not None else judge(claims, runs)
    from sve.paper import seed_stability

    seed_notes = seed_stability.notes(seed_stability.read(root), judged)
    return to_markdown(judged, movement_sentences(claims, root, runs), seed_notes)


__all__ = ["to_markdown", "claims_markdown", "changes_markdown", "summary", "procedure", "movement_sentences"]
