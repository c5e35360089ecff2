"""``python scripts/bench.py ...``: the same as ``sve-bench`` (``sve/cli/bench.py``)."""

from sve.cli.bench import main

if __name__ == "__main__":
    main()
