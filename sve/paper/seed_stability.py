"""Whether a verdict depends on the bootstrap's own seed: ``make mini-bootstrap-seeds`` judges every claim again at
other bootstrap seeds (``scripts/bootstrap_seeds.py``) and writes ``diagnostics/bootstrap_seeds.json`` under the
results root; the README marks each verdict, unadjusted or with Holm's correction, that some seed decides
otherwise ("borderline").

Why: an interval's bounds come from 2,000 replicates, so they carry Monte Carlo noise of their own. A verdict
whose interval ends near its threshold can hold at one seed and be unresolved at another; the data have not
changed, so such a verdict says less than one that every seed gives. The record keeps each verdict's point
estimate, and a verdict whose point differs from the record's (its runs changed since) is marked "not
measured" rather than matched to an old entry.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from sve.paper.claims import Verdict, family, holm, judge
from sve.paper.store import Run

SEEDS = (0, 1, 2, 3, 4)
FILE = Path("diagnostics/bootstrap_seeds.json")  # under a results root
NOT_MEASURED = "bootstrap seeds not measured for these runs"


def key(title: str, v: Verdict) -> str:
    return " | ".join((title, v.setting, v.comparison, v.metric))


def point(v: Verdict) -> float | None:
    return v.differences[0].point if len(v.differences) == 1 else None


def decisions(judged: list[tuple[DictConfig, list[Verdict]]]) -> dict[str, dict]:
    """{verdict key: its point, verdict and (in the family) Holm's verdict} of one judging."""
    members = family([v for _, found in judged for v in found])
    adjusted = holm(members)
    return {
        key(claim.title, v): {"point": point(v), "verdict": v.verdict, "holm": adjusted.get(id(v))}
        for claim, found in judged
        for v in found
    }


def measure(claims: DictConfig, runs: list[Run], seeds=SEEDS, progress=None) -> dict:
    """Every verdict at each bootstrap seed of ``seeds`` (the claims file's other settings kept)."""
    found = {}
    for seed in progress(seeds) if progress else seeds:
        at_seed = OmegaConf.merge(claims, {"bootstrap": {"seed": int(seed)}})
        for k, d in decisions(judge(at_seed, runs)).items():
            entry = found.setdefault(k, {"point": d["point"], "verdict": [], "holm": []})
            entry["verdict"].append(d["verdict"])
            entry["holm"].append(d["holm"])
    replicates = OmegaConf.select(claims, "bootstrap.replicates")
    return {"seeds": list(seeds), "replicates": replicates, "verdicts": found}


def read(root: Path) -> dict | None:
    path = Path(root) / FILE
    return json.loads(path.read_text()) if path.exists() else None


def notes(record: dict | None, judged: list[tuple[DictConfig, list[Verdict]]]) -> dict[str, dict[int, str]] | None:
    """{"verdict": {id(verdict): note}, "holm": {...}}: the verdicts that some bootstrap seed decides otherwise,
    or whose runs the record did not measure. No record: None (nothing was measured)."""
    if record is None:
        return None
    out: dict[str, dict[int, str]] = {"verdict": {}, "holm": {}}
    now = decisions(judged)
    seeds = len(record["seeds"])
    for claim, found in judged:
        for v in found:
            k = key(claim.title, v)
            entry = record["verdicts"].get(k)
            if entry is None or not _same_point(entry["point"], now[k]["point"]):
                if v.no_interval is None:
                    out["verdict"][id(v)] = NOT_MEASURED
                continue
            for kind in ("verdict", "holm"):
                mine = now[k][kind]
                agree = sum(x == mine for x in entry[kind])
                if mine is not None and agree < seeds:
                    out[kind][id(v)] = f"borderline: {agree} of {seeds} bootstrap seeds give it"
    return out


def _same_point(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= 1e-9 * max(1, abs(a)))


__all__ = ["SEEDS", "FILE", "measure", "read", "notes", "decisions"]
