"""``python evaluate.py run_dir=<run dir> ...``: the same as ``sve-eval`` (``sve/cli/evaluate.py``)."""

from sve.cli.evaluate import main

if __name__ == "__main__":
    main()
