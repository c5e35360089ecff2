"""The command line of ``sve-eval`` and ``sve-distill``: their own ``key=value`` options, the run directory as
a first argument, and the config overrides that remain."""

from __future__ import annotations


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
