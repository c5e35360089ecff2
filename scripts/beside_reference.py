"""Prints each run of a quick-start target beside the committed reference run of the same name:
``python scripts/beside_reference.py RUNS REFERENCE`` (``make sst2-cpu``: outputs/sst2_minilm_cpu beside
results/reference/sst2_minilm_cpu). The target trains into RUNS, never into REFERENCE, so the reference numbers
are never taken for a run of one's own."""

from __future__ import annotations

import sys
from pathlib import Path

from sve.errors import InputError, one_line_errors
from sve.runs.results import format_beside, read_results


def main(argv: list[str]) -> int:
    runs, reference = (Path(a) for a in argv)
    names = sorted(p.parent.name for p in runs.glob("*/results.json"))
    if not names:
        raise InputError(f"{runs} holds no finished run (no <name>/results.json)")
    for name in names:
        theirs = reference / name / "results.json"
        print(f"\n{runs / name} beside {theirs if theirs.exists() else 'no reference run'}:")
        print(
            format_beside(read_results(runs / name / "results.json"), read_results(theirs) if theirs.exists() else None)
        )
    return 0


if __name__ == "__main__":
    with one_line_errors():
        sys.exit(main(sys.argv[1:]))
