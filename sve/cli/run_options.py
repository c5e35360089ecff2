"""The command line of ``sve-eval`` and ``sve-distill``: their own ``key=value`` options, the run directory as
a first argument, and the config overrides that remain."""

from __future__ import annotations

import sys
from collections.abc import Callable


def run_command(usage: Callable[[], str], command: Callable[[list[str]], int]) -> None:
    """A run command's entry point: its usage for no arguments or --help (before torch: it answers at once), else
    ``command`` on the arguments with the libraries' notices hidden and a user error in one line
    (SVE_DEBUG=1: the traceback)."""
    argv = sys.argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        sys.exit(0 if argv else 2)
    from sve.cli.quiet import hide_noise
    from sve.errors import one_line_errors

    hide_noise()
    with one_line_errors():
        sys.exit(command(argv))


def command_options(argv: list[str], defaults: dict) -> tuple[dict, list[str]]:
    """A run command's own ``key=value`` options (the keys of ``defaults``) and the config overrides; a first
    argument without ``=`` is the run directory (``sve-eval <run dir> ...``, as people type it)."""
    options, overrides = dict(defaults), []
    for i, arg in enumerate(argv):
        key, eq, value = arg.partition("=")
        if key in defaults and eq:
            options[key] = value
        elif i == 0 and not eq and not arg.startswith(("~", "-", "+")):
            options["run_dir"] = arg
        else:
            overrides.append(arg)
    return options, overrides
