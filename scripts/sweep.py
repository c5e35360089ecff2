"""``python scripts/sweep.py table1 ...``: the same as ``sve-sweep`` (``sve/cli/sweep.py``)."""

from sve.cli.sweep import main

if __name__ == "__main__":
    main()
