"""``sve-tables [table1 ...] [--smoke] [--no-paper] [--results DIR]`` (``make tables``): rebuilds tables and
figures from the result files that exist, without training. No names: every definition of
``sve/configs/tables/`` that belongs to the store (the miniature's ``mini_*`` under a store named ``mini``,
the others elsewhere). Works on an empty store (every cell "–"). See ``sve.paper.report``. Given the directory
of a sweep of ``sve-train -m`` instead (``sve-tables <sweep dir>``), it prints that sweep's own table, each
metric's mean ± std over seeds per group of overrides, and writes it again to the sweep's summary.md, .csv and
.json (``sve.runs.multirun``)."""

import argparse
import sys
from pathlib import Path

from sve.errors import one_line_errors


def main(argv: list[str] | None = None) -> int:
    from sve.cli.quiet import hide_noise
    from sve.paper.store import is_table, table_names

    hide_noise()  # the row labels compose each method option, importing its library (laplace-torch's notice)

    # The docstring after its usage line (``...``: ...), whole: its first line alone stopped mid-sentence.
    description = " ".join(__doc__.replace("``", "").split()).split("): ", 1)[-1]
    parser = argparse.ArgumentParser(prog="sve-tables", description=description[0].upper() + description[1:])
    # Not argparse choices: a definition of one's own project is named by its file, which no list holds.
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"definitions in sve/configs/tables/ ({', '.join(table_names())}) or your own "
        "definition files (<path>.yaml); or one sweep directory of sve-train -m",
    )
    parser.add_argument("--smoke", action="store_true", help="build from <store>/smoke/ into <store>/smoke/")
    parser.add_argument("--no-paper", action="store_true", help="leave out the paper's numbers")
    parser.add_argument("--results", type=Path, default=None, help="the store (default: ./results)")
    args = parser.parse_intermixed_args(argv)  # names after an option (`--results r table1`) are names too
    sweep = sweep_directory(args, parser)
    if sweep is not None:
        return sweep_table(sweep)
    unknown = [name for name in args.names if not is_table(name)]
    if unknown:
        parser.error(f"unknown table {unknown}; choose from {table_names()} or name a definition file (<path>.yaml)")
    # A store named on the command line that is not there is a typo, not an empty store: building it would
    # create the directory and fill it with tables of "–" cells, which look like a store with no runs.
    if args.results is not None and not args.results.is_dir():
        parser.error(
            f"--results {args.results}: no such directory (a store holds runs/ and tables/; "
            "leave --results out for ./results)"
        )
    from sve.paper.build import build, build_all  # matplotlib and torch: only once there is work

    if args.names:
        written = [p for name in args.names for p in build(name, args.smoke, args.results, not args.no_paper)]
    else:
        written = build_all(args.smoke, args.results, not args.no_paper)
    for path in written:
        print(f"wrote {path}")
    return 0


def sweep_directory(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Path | None:
    """The sweep directory named (as the one NAME, or as --results), or None when a results store is meant."""
    from sve.runs.multirun import is_sweep

    directories = [Path(name) for name in args.names if Path(name).is_dir()]
    if not directories:
        return args.results if args.results is not None and is_sweep(args.results) else None
    not_sweeps = [str(d) for d in directories if not is_sweep(d)]
    if not_sweeps:
        parser.error(
            f"{not_sweeps[0]} is a directory but not a sweep of sve-train -m (it has no multirun.yaml, "
            "summary.json or job directories with .hydra/overrides.yaml); a results store is named with --results"
        )
    if len(args.names) > 1 or args.results is not None or args.smoke or args.no_paper:
        parser.error(
            f"{directories[0]} is a sweep directory: name it alone (table names, --results, --smoke and "
            "--no-paper are for the paper's tables)"
        )
    return directories[0]


def sweep_table(sweep_dir: Path) -> int:
    """Prints the sweep's mean ± std table and writes its summary files (``sve.runs.multirun.write_summary``)."""
    from sve.runs.multirun import write_summary

    summary, markdown = write_summary(sweep_dir)
    print(markdown)
    if summary["not_finished"]:
        print(
            f"{len(summary['not_finished'])} run(s) did not finish and are not in the table: "
            f"{', '.join(summary['not_finished'])} (summary.json says why)"
        )
    for name in ("summary.md", "summary.csv", "summary.json"):
        print(f"wrote {sweep_dir / name}")
    return 0


def entry() -> None:
    with one_line_errors():  # a corrupt result file: one line naming it and what to delete
        sys.exit(main())


if __name__ == "__main__":
    entry()
