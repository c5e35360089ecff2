"""Rebuild tables and figures from the result files that exist, without training.

``python scripts/build_tables.py [table1 ...] [--smoke] [--no-paper] [--results DIR]``; no names: all of
configs/tables/ that belong to the results root (the miniature's ``mini_*`` under results/mini/, the
others under results/). Works on an empty results/ (every cell "–"). See sve/report.py.
"""

import argparse
import sys
from pathlib import Path

from sve.errors import InputError
from sve.report import build, build_all, table_names

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", choices=[[], *table_names()], help="definitions in configs/tables/")
    parser.add_argument("--smoke", action="store_true", help="build from results/smoke/ into results/smoke/")
    parser.add_argument("--no-paper", action="store_true", help="leave out the paper's numbers")
    parser.add_argument("--results", type=Path, default=None, help="results root (default: the repo's results/)")
    args = parser.parse_args()
    try:
        if args.names:
            written = [p for name in args.names for p in build(name, args.smoke, args.results, not args.no_paper)]
        else:
            written = build_all(args.smoke, args.results, not args.no_paper)
    except InputError as err:  # a corrupt result file: one line naming it and what to delete
        sys.exit(f"error: {err}")
    for path in written:
        print(f"wrote {path}")
