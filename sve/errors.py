"""Errors a user can act on, and how the entry points report them: one line, no traceback.

``InputError``: what the user gave (config values, data files, checkpoint files, run directories) is wrong,
found before any work. ``TrainingDiverged``: the run's own numbers went non-finite (names the step and the
learning rate). ``RunInterrupted``: stopped from outside (SIGTERM). ``one_line_errors`` turns them into one
``error: ...`` line and a non-zero exit status; ``SVE_DEBUG=1`` (or Hydra's ``HYDRA_FULL_ERROR=1``) prints the
traceback before it. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from contextlib import contextmanager


class InputError(ValueError):
    """The message names the key or the file (and line), the value, and what is valid; ``train.py`` prints
    it without a traceback."""


class OfflineError(InputError, OSError):
    """Weights or data that are neither on disk nor reachable (no network); the message names the key to set."""


class TrainingDiverged(FloatingPointError):
    """A non-finite loss, gradient or metric during training, with the step and learning rate."""


class RunInterrupted(RuntimeError):
    """The run was stopped from outside (SIGTERM, or Ctrl-C: SIGINT) before it finished; its last checkpoint is
    kept and the same command resumes it. ``train.py`` exits with 128 + the signal's number, as a process killed
    by it would."""

    def __init__(self, message: str, signal_number: int = signal.SIGTERM):
        super().__init__(message)
        self.signal_number = int(signal_number)


def debugging() -> bool:
    return any(os.environ.get(k, "").strip() not in ("", "0") for k in ("SVE_DEBUG", "HYDRA_FULL_ERROR"))


@contextmanager
def one_line_errors():
    """User errors end the program with one line on stderr (exit 2; 143 for SIGTERM)."""
    try:
        yield
    except RunInterrupted as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(128 + err.signal_number) from None
    except Exception as err:
        user = user_error(err)
        if user is None:
            raise
        if debugging():
            traceback.print_exc()
        hint = "" if debugging() else " (SVE_DEBUG=1 shows the traceback)"
        print(f"error: {user}{hint}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def user_error(err: BaseException) -> BaseException | None:
    """``err`` itself, or the error it wraps (Hydra's ``InstantiationException`` wraps what a constructor
    raised), when that is a user error; None for anything else."""
    while err is not None:
        if isinstance(err, (InputError, TrainingDiverged)):
            return err
        # Lightning's own refusal of a trainer setting (``limit_train_batches`` too small for the data, say):
        # its message names the setting and the fix, so it is one line like ours.
        if type(err).__name__ == "MisconfigurationException":
            return err
        if type(err).__name__ != "InstantiationException":
            return None
        err = err.__cause__


def typo_distance(a: str, b: str) -> int:
    """Edits (insert, delete, replace, swap two neighbours) from ``a`` to ``b``: ``sev`` is one from ``sve``
    and two from ``svf``, which difflib's ratio ranks the same."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


def did_you_mean(word: str, choices) -> str:
    """`` (did you mean X?)`` for the closest of ``choices`` that difflib finds close, or nothing."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=5, cutoff=0.6)
    if not close:
        return ""
    return f" (did you mean {min(close, key=lambda c: typo_distance(str(word), c))}?)"
