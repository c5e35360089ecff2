"""``sve-sweep table1 [--smoke] [--dry-run] [--results DIR]`` (``make table1``): trains the runs a table or
figure needs, then builds it (``sve.paper.sweep``). The store is ``./results`` unless ``--results`` names one."""

import sys

from sve.errors import one_line_errors


def main() -> None:
    from sve.cli.quiet import hide_noise

    hide_noise()
    with one_line_errors():  # a user error is one line (SVE_DEBUG=1: the traceback)
        from sve.paper.sweep import main as sweep

        sys.exit(sweep())


if __name__ == "__main__":
    main()
