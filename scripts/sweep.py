"""Train (or resume) the runs a table or figure needs, then build it: ``python scripts/sweep.py table1``.

``--smoke``: the CPU-sized variant (tiny models, synthetic data) under results/smoke/. See sve/sweep.py.
"""

import sys

from sve.errors import one_line_errors
from sve.sweep import main

if __name__ == "__main__":
    with one_line_errors():  # a user error is one line (SVE_DEBUG=1: the traceback)
        sys.exit(main())
