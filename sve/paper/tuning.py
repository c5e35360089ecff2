"""Choosing one hyper-parameter per table row on the validation split, on a log grid that grows until its
best value is interior.

A table's ``tune:`` (``configs/tables/<name>.yaml``) names a key, a starting grid and a validation metric:

    tune: {key: method.lr, grid: [1.0e-4, 3.0e-4, 1.0e-3], metric: nll, seed: 0, per_decade: 2, extend: 3}

The grid's values lie on a log *ladder* with ``per_decade`` steps per decade (2: 1, 3, 10, 30, ...; 3: 1, 2,
5, 10, ...; 1: powers of ten). A choice on the edge of the grid is not a tuned choice: when the best value is
the grid's smallest or largest, the grid grows by the next ladder value beyond it, one run at a time, until
the best value has a worse neighbour on both sides, or ``extend`` values have been added (the choice is then
reported as left on that edge, never silently). Only validation metrics are read, never test ones.

The sweep (``sve.paper.sweep``) trains the grid's runs; this module only decides: ``next_value`` (grow or stop)
and ``choice`` (what ``tuned.json`` records: the whole searched grid, its scores, how far it grew, and
``edge`` when the choice is still on one).
"""

from __future__ import annotations

import math

from sve.errors import InputError

MANTISSAS = {1: (1,), 2: (1, 3), 3: (1, 2, 5)}  # the ladder's values within one decade
DEFAULT_PER_DECADE = 2  # half-decades: 1e-4, 3e-4, 1e-3, ...
DEFAULT_EXTEND = 3  # at most this many values are added beyond the starting grid


def ladder_value(position: int, per_decade: int) -> float:
    """The ladder's value at ``position`` (0 is 1.0): parsed from its decimal text, so 3e-4 is exactly the
    float ``3e-4`` (and names its run directory ``..._0.0003`` like a grid value written in YAML)."""
    mantissas = MANTISSAS[per_decade]
    decade, step = divmod(position, per_decade)
    return float(f"{mantissas[step]}e{decade}")


def ladder_position(value: float, per_decade: int) -> int:
    """The position of ``value`` on the ladder; ``InputError`` when it is not a ladder value."""
    if per_decade not in MANTISSAS:
        raise InputError(f"tune.per_decade={per_decade} is not supported; choose one of {sorted(MANTISSAS)}")
    if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
        raise InputError(f"tune.grid value {value!r} is not a positive number: the grid is a log ladder")
    decade = math.floor(math.log10(value) + 1e-9)
    for step, mantissa in enumerate(MANTISSAS[per_decade]):
        if math.isclose(value, mantissa * 10.0**decade, rel_tol=1e-6):
            return decade * per_decade + step
    examples = ", ".join(f"{m}e{decade}" for m in MANTISSAS[per_decade])
    raise InputError(
        f"tune.grid value {value!r} is not on the log ladder with per_decade={per_decade} (values "
        f"like {examples}); use ladder values, or set tune.per_decade to match the grid"
    )


def settings(tune) -> tuple[list[float], int, int]:
    """(starting grid sorted, per_decade, extend) of a table's ``tune`` block, checked."""
    per_decade = int(tune.get("per_decade", DEFAULT_PER_DECADE))
    extend = int(tune.get("extend", DEFAULT_EXTEND))
    if extend < 0:
        raise InputError(f"tune.extend={extend} must be >= 0 (0: never grow the grid)")
    if not tune.grid:
        raise InputError("tune.grid is empty; give at least one value")
    if extend == 0:  # a fixed grid: any values (a categorical key, say), searched as given
        return list(tune.grid), per_decade, extend
    grid = sorted(float(v) for v in tune.grid)
    for value in grid:
        ladder_position(value, per_decade)
    return grid, per_decade, extend


def best_of(scores: dict[float, float], higher_is_better: bool) -> float:
    """The best-scoring value; on a tie the smaller value (the more conservative step size)."""
    ranked = sorted(scores, key=lambda v: (-scores[v] if higher_is_better else scores[v], v))
    return ranked[0]


def edge_of(best: float, scores: dict[float, float]) -> str | None:
    """ "lower" or "upper" when ``best`` is the smallest or largest searched value (it lacks a neighbour on
    that side, so the optimum may lie beyond it; a one-value grid grows downwards first); None when it is
    interior: a strictly or equally worse value on each side (ties go to the smaller value, ``best_of``)."""
    values = sorted(scores)
    return "lower" if best == values[0] else "upper" if best == values[-1] else None


def added_values(grid: list, searched) -> list:
    """The searched values beyond the starting grid (ladder values are exact decimal floats: ``==`` holds)."""
    return [v for v in searched if v not in grid]


def next_value(tune, scores: dict[float, float], higher_is_better: bool) -> float | None:
    """The grid value to try next, or None when the search is over (the best is interior, or the grid has
    grown by ``extend`` values already). ``scores`` holds every searched value's validation metric."""
    grid, per_decade, extend = settings(tune)
    if extend == 0:
        return None
    added = added_values(grid, scores)
    best = best_of(scores, higher_is_better)
    edge = edge_of(best, scores)
    if edge is None or len(added) >= extend:
        return None
    values = sorted(scores)
    position = ladder_position(values[0] if edge == "lower" else values[-1], per_decade)
    return ladder_value(position - 1 if edge == "lower" else position + 1, per_decade)


def choice(tune, scores: dict, higher_is_better: bool, text) -> dict:
    """What ``tuned.json`` records; ``text(value)`` is how a value is written in run directory names. A fixed
    grid of non-numbers (``extend: 0``) has no edges."""
    grid, _, extend = settings(tune)
    best = best_of(scores, higher_is_better)
    numeric = all(isinstance(v, (int, float)) for v in scores)
    edge = edge_of(best, scores) if numeric else None
    searched = sorted(scores) if numeric else list(scores)
    added = [text(v) for v in added_values(grid, searched)]
    record = {
        "key": tune.key,
        "value": text(best),
        "metric": f"val/{tune.metric}",
        "scores": {text(v): scores[v] for v in searched},
        "grid": [text(v) for v in searched],
        "initial_grid": [text(v) for v in grid],
        "extended": added,
        "edge": edge,
        "seed": int(tune.seed),
        "note": "chosen on the validation split only; every seed of this row uses it",
    }
    if edge is not None:
        record["note"] += (
            f"; left on the {edge} edge of the searched grid after {len(added)} of at most {extend} extensions"
        )
    return record
