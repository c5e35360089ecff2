"""Entry point: ``python evaluate.py run_dir=<run dir> [dataset=<option>] [key=value ...]``.

Evaluates a trained run again from its checkpoint, without training, and writes ``evaluations/<name>.json``
into its directory (``sve/evaluate.py`` has the options). Not a Hydra app: the config is the run's own, saved
when it trained, and the arguments override it; a Hydra app would compose a fresh config instead.
"""

import sys

from sve.errors import one_line_errors
from sve.evaluate import main

if __name__ == "__main__":
    with one_line_errors():  # a user error is one line (SVE_DEBUG=1: the traceback)
        sys.exit(main(sys.argv[1:]))
