"""``python -m sve.cli.backfill <results root>``: writes the missing ``predictive/<set>.npz`` of every run under a
results root from its saved ``predictions/<set>.npz`` (``sve.runs.prediction_files.backfill``)."""

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from sve.runs.prediction_files import backfill

    parser = argparse.ArgumentParser(
        description="Write the missing predictive/<set>.npz of every run under a "
        "results root from its saved predictions/<set>.npz."
    )
    parser.add_argument("root", type=Path)
    args = parser.parse_args(argv)
    written = [p for results in sorted(args.root.rglob("results.json")) for p in backfill(results.parent)]
    print(f"wrote {len(written)} predictive files under {args.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
