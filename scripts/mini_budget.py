"""The miniature's budget, measured for every method from its runs: ``make mini-budget``.

Writes ``<results>/budget.md`` and ``budget.json`` (``sve.paper.budget``: the rule, minutes per run by method,
each table's run count and every method's convergence along its learning curve). Trains nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sve.cli.quiet import hide_noise
from sve.errors import one_line_errors
from sve.paper.budget import report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results") / "mini", help="the result store")
    parser.add_argument(
        "--tables",
        nargs="+",
        default=None,
        help="table definitions to account for (default: every mini_* table that trains runs)",
    )
    parser.add_argument("--workers", type=int, default=2, help="runs trained at a time")
    args = parser.parse_args(argv)
    hide_noise()  # the method options' libraries are imported as their rows are read (laplace-torch's notice)
    from sve.paper.store import table_names

    unknown = sorted(set(args.tables or ()) - set(table_names()))
    if unknown:
        parser.error(f"--tables {unknown}: not table definitions; choose from {table_names()}")
    text, record = report(args.results, args.tables, args.workers)
    (args.results / "budget.md").write_text(text)
    (args.results / "budget.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    with one_line_errors():
        raise SystemExit(main())
