"""Errors in what the user gave (config values, data files, checkpoint files), found before any work."""


class InputError(ValueError):
    """The message names the key or the file (and line), the value, and what is valid; ``train.py`` prints
    it without a traceback."""
