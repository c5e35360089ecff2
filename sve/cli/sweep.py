"""``sve-sweep table1 [--smoke] [--dry-run] [--results DIR]`` (``make table1``): trains the runs a table or
figure needs, then builds it (``sve.paper.sweep``). The store is ``./results`` unless ``--results`` names one."""

import argparse
import sys
from pathlib import Path

from sve.errors import one_line_errors


def main(argv: list[str] | None = None) -> int:
    from sve.paper.store import is_table, table_names
    from sve.paper.sweep import build, sweep

    parser = argparse.ArgumentParser(
        prog="sve-sweep", description="Train the runs that tables or figures need, then build them."
    )
    parser.add_argument(
        "items",
        nargs="+",
        metavar="NAME|OVERRIDE",
        help=f"definitions in configs/tables/ ({', '.join(table_names())}) or your own "
        "definition files (<path>.yaml), run in this order, then "
        "Hydra overrides for every run, e.g. dataset.root=/data/sst2",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny models, synthetic data, under results/smoke/")
    parser.add_argument(
        "--results", type=Path, default=None, help="the result store (default: ./results, or $SVE_RESULTS)"
    )
    parser.add_argument(
        "--config-dir",
        type=Path,
        default=None,
        help="your own config folder (<dir>/experiment/, method/, dataset/ ...), searched as "
        "sve-train --config-dir searches it, by every run",
    )
    parser.add_argument("--dry-run", action="store_true", help="list the runs and their commands, train nothing")
    parser.add_argument("--measure", action="store_true", help="cost tables: measure again even if measured")
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print each row's memory plan per device (sve.runs.plan), train and download nothing",
    )
    parser.add_argument(
        "--rows",
        nargs="+",
        default=(),
        metavar="METHOD:M",
        help="only these rows, e.g. --rows deep_ensemble:4 (default: every row; one table only)",
    )
    # Intermixed: overrides after an option (`sve-sweep t.yaml --results r dataset.root=...`) are still items;
    # plain parse_args stops the positional list at the first option and refuses the rest as unrecognized.
    args = parser.parse_intermixed_args(argv)
    # --rows takes every value after it: an override or a table name written after the rows (`--rows sve:4
    # dataset.root=...`) lands among them. A row is METHOD:M, so anything else goes back to the items.
    rows = [r for r in args.rows if ":" in r and "=" not in r and not r.startswith(("~", "+"))]
    items = [*args.items, *(r for r in args.rows if r not in rows)]
    overrides = [item for item in items if "=" in item or item.startswith(("~", "+"))]
    names = [item for item in items if item not in overrides]
    if args.config_dir is not None:
        if not args.config_dir.is_dir():
            parser.error(
                f"--config-dir {args.config_dir}: no such directory (a config folder holds experiment/, "
                "method/, dataset/ ...)"
            )
        # As an override, so the runs in subprocesses and the smoke runs composed here both search it; absolute,
        # as each run resolves it on its own.
        overrides.append(f"hydra.searchpath=[file://{args.config_dir.resolve()}]")
    unknown = [name for name in names if not is_table(name)]
    if unknown or not names:
        parser.error(
            f"unknown table {unknown}; choose from {table_names()} or name a definition file (<path>.yaml)"
            if unknown
            else "name a table"
        )
    if args.plan:
        from sve.paper.plan_tables import plan_tables

        return 1 if plan_tables(names, args.smoke, overrides) else 0
    failures = sweep(names, args.smoke, args.results, args.dry_run, overrides, args.measure, rows)
    if args.dry_run:
        return 0
    for name in names:
        for path in build(name, args.smoke, args.results):
            print(f"wrote {path}")
            if path.suffix == ".md":
                print(path.read_text())
    if failures:
        print(f"\n{len(failures)} run(s) failed (details in failed.json and train.log of each run directory):")
        print("\n".join(f"  - {line}" for line in failures))
        return 1
    return 0


def entry() -> None:
    from sve.cli.quiet import hide_noise

    hide_noise()
    with one_line_errors():  # a user error is one line (SVE_DEBUG=1: the traceback)
        sys.exit(main())


if __name__ == "__main__":
    entry()
