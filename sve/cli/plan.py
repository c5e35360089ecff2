"""``python -m sve.cli.plan '<JSON list of overrides>'``: one run's memory plan as one summary line, or its
error as one line (``sve.paper.plan_tables`` runs it once per row of a table: ``sve-sweep --plan``)."""

import json
import sys


def main(argv: list[str] | None = None) -> int:
    from sve.runs.plan_report import plan_line

    overrides = json.loads((argv or sys.argv[1:])[0])
    try:
        print(plan_line(overrides), flush=True)
    except Exception as err:  # noqa: BLE001 - the parent reports it for this row and goes on
        print(f"{type(err).__name__}: {err}".replace("\n", " "), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
