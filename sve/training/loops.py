"""What the loops a run drives itself (the learning curve, the passes over the evaluation sets) share with
Lightning's own: its batch limits, its stop on SIGTERM, and a progress bar.

Lightning's SIGTERM handler, installed for each ``trainer.fit``/``trainer.test`` call, only records the signal
(``trainer.received_sigterm``); its loops check it after each batch (but not after the last batch of an
evaluation pass), and a loop of our own inside a callback never would: a learning-curve point over a large
validation split ran to its end first. ``stop_if_asked`` raises Lightning's ``SIGTERMException`` there, which
``sve.runs.run`` turns into ``RunInterrupted`` (exit 143; the last checkpoint resumes the run).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from pytorch_lightning.utilities.exceptions import SIGTERMException

from sve.errors import RunInterrupted


def stop_if_asked(trainer) -> None:
    """Raises ``SIGTERMException`` when the process received SIGTERM during the trainer's current or last call."""
    if getattr(trainer, "received_sigterm", False):
        raise SIGTERMException


@contextmanager
def stopped_by_sigterm(what: str) -> Iterator[None]:
    """Lightning's ``SIGTERMException`` (a ``SystemExit`` without a code: the process would exit 0, as if it had
    finished) as ``RunInterrupted`` (exit 143, one line) for commands other than ``sve-train``."""
    try:
        yield
    except SIGTERMException:
        raise RunInterrupted(
            f"{what} stopped by SIGTERM before it finished; its record was not written. Run the same "
            "command again to do it"
        ) from None


def limited_batches(available: int, limit: int | float | None) -> int:
    """How many of ``available`` batches a Lightning limit (``limit_val_batches``, ``limit_test_batches``: a
    count, or a fraction of the batches) lets run."""
    if limit is None or (isinstance(limit, float) and limit >= 1.0):
        return available
    if isinstance(limit, float):
        return min(available, max(1, int(available * limit)) if limit > 0 else 0)
    return min(available, int(limit))


def progress(total: int, description: str, enabled: bool):
    """A progress bar with counts on stderr (tqdm, as ``sve.api.wrap`` shows them), cleared when it ends."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=description, disable=not enabled, leave=False, file=sys.stderr, dynamic_ncols=True)
