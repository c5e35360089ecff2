"""How far training moved each SVE-family row's singular values, against where its members started.

A run of a method with per-member singular values (its ``method_report`` has ``svd_seconds``: SVE, SVF, the
top-k variants and the SVE + LoRA hybrids) records ``method_report.singular_values``
(``sve.layers.singular_values.movement``): ``member_spread``, the members' RMS distance from their mean singular
values relative to the mean's norm, and ``mean_shift``, the mean's distance from the pretrained values relative to
theirs.

**The initial spread.** Member m starts at s (1 + eps_m) with eps_m ~ N(0, sigma_init^2) per value, independent
over members. A member's squared distance from the members' sample mean is then sigma^2 (M - 1) / M per value in
expectation (the mean of M draws absorbs 1/M of each draw's variance), so the spread at initialisation is
sigma_init * sqrt((M - 1) / M): 0.71 sigma_init at M = 2, 0.87 sigma_init at M = 4, and 0 for one member. The
ratio of the trained spread to it says whether the members separated in training; near 1, they still differ by
their initial noise only.

**Where the numbers come from.** The run's own results.json; for a run trained before it recorded them, the copy
that ``scripts/mini_distill.py --retrain-teachers`` trained again from the same command (``teachers/``), labelled
as such; otherwise none, and the README says which retraining would give it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from sve.paper.store import TEACHERS, Run, parse_row, select
from sve.runs.results import read_results

SEPARATED = 1.2  # spread / initial spread below this: the members did not separate (the claims file may override)
RUN, TEACHER = "run", "teachers"


def initial_spread(sigma_init: float, members: int) -> float:
    """The members' expected RMS spread around their mean at initialisation (module docstring)."""
    return sigma_init * math.sqrt((members - 1) / members)


def sigma_of(results: dict) -> float | None:
    """The run's sigma_init: the method's own (SVF's is 0), else the experiment's."""
    config = results.get("config") or {}
    value = (config.get("method") or {}).get("sigma_init", config.get("sigma_init"))
    return float(value) if isinstance(value, (int, float)) else None


def is_sv_family(results: dict) -> bool:
    """A method that decomposed its weights into per-member singular values."""
    return "svd_seconds" in (results.get("method_report") or {})


@dataclass
class RowMovement:
    experiment: str
    method: str
    members: int
    sigma_init: float | None
    record: dict[int, dict | None] = field(default_factory=dict)  # seed -> {member_spread, mean_shift} or None
    source: dict[int, str] = field(default_factory=dict)  # seed -> RUN or TEACHER (seeds with a record)

    @property
    def known(self) -> list[int]:
        return [s for s, r in sorted(self.record.items()) if r]

    @property
    def missing(self) -> list[int]:
        return [s for s, r in sorted(self.record.items()) if not r]

    def mean(self, key: str) -> float | None:
        values = [self.record[s][key] for s in self.known]
        return statistics.fmean(values) if values else None

    @property
    def initial(self) -> float | None:
        return None if self.sigma_init is None else initial_spread(self.sigma_init, self.members)

    @property
    def ratio(self) -> float | None:
        """The trained spread over the initial one (None: no record, or no initial spread: one member, sigma 0)."""
        spread, initial = self.mean("member_spread"), self.initial
        return None if spread is None or not initial else spread / initial

    def separated(self, threshold: float = SEPARATED) -> bool | None:
        return None if self.ratio is None else self.ratio >= threshold


def movement_of(root: Path, run: Run) -> tuple[dict | None, str | None]:
    """The run's recorded movement and where it came from (RUN, TEACHER), or (None, None)."""
    found = (run.results.get("method_report") or {}).get("singular_values")
    if found:
        return found, RUN
    try:
        relative = run.path.parent.relative_to(Path(root, "runs"))
    except ValueError:
        return None, None
    copy = Path(root, TEACHERS, relative, "results.json")
    if copy.is_file():
        found = (read_results(copy).get("method_report") or {}).get("singular_values")
        if found:
            return found, TEACHER
    return None, None


def row_movement(root: Path, runs: list[Run], experiment: str, row: str) -> RowMovement | None:
    """The movement of one row (``method:members``) over its seeds; None when it is not an SVE-family row."""
    method, members = parse_row(row)
    seeds = select(runs, experiment, method, members)
    if not seeds or not any(is_sv_family(r.results) for r in seeds.values()):
        return None
    sigmas = {sigma_of(r.results) for r in seeds.values()}
    found = RowMovement(experiment, method, members, sigmas.pop() if len(sigmas) == 1 else None)
    for seed, run in sorted(seeds.items()):
        found.record[seed], source = movement_of(root, run)
        if source:
            found.source[seed] = source
    return found


def all_movements(root: Path, runs: list[Run]) -> list[RowMovement]:
    """Every SVE-family row of the store, by experiment, method and members."""
    rows = sorted({(r.experiment, f"{r.method}:{r.members}") for r in runs if is_sv_family(r.results)}, key=str)
    return [m for experiment, row in rows if (m := row_movement(root, runs, experiment, row)) is not None]


__all__ = ["SEPARATED", "RowMovement", "initial_spread", "row_movement", "all_movements"]
