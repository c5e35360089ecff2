"""``sve-eval run_dir=<run dir> [dataset=<option>] [key=value ...]`` (``python evaluate.py ...`` in a
checkout): a trained run evaluated again from its checkpoint, without training (``sve.runs.evaluate``)."""

import sys

from sve.errors import one_line_errors


def main() -> None:
    with one_line_errors():  # a user error is one line (SVE_DEBUG=1: the traceback)
        from sve.runs.evaluate import main as evaluate

        sys.exit(evaluate(sys.argv[1:]))


if __name__ == "__main__":
    main()
