"""Judges every claim of the miniature again at other bootstrap seeds and writes which verdicts change:
``python scripts/bootstrap_seeds.py [--results DIR] [--seeds 0 1 2 3 4]`` (``make mini-bootstrap-seeds``).

The record (``DIR/diagnostics/bootstrap_seeds.json``, ``sve.paper.seed_stability``) is what ``make mini-report``
reads to mark borderline verdicts. About a minute and a half per seed on one core.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sve.errors import one_line_errors
from sve.paper import seed_stability


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results/mini"))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(seed_stability.SEEDS))
    parser.add_argument("--claims", default="mini", help="the claims file's name (sve/configs/claims/<name>.yaml)")
    args = parser.parse_args(argv)
    with one_line_errors():
        from tqdm import tqdm

        from sve.paper.claims import load_claims
        from sve.paper.store import load_runs

        record = seed_stability.measure(
            load_claims(args.claims), load_runs(args.results), args.seeds, lambda s: tqdm(s, desc="bootstrap seeds")
        )
        path = args.results / seed_stability.FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n")
        moving = [k for k, e in record["verdicts"].items() if len(set(e["verdict"])) > 1 or len(set(e["holm"])) > 1]
        print(f"{len(moving)} of {len(record['verdicts'])} verdicts change with the bootstrap seed; {path}")
        for k in moving:
            print(f"  {k}: {record['verdicts'][k]['verdict']} (Holm: {record['verdicts'][k]['holm']})")


if __name__ == "__main__":
    main()
