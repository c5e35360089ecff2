"""Notices of the libraries that a user cannot act on, hidden by default; ``SVE_VERBOSE=1`` keeps them.

Each filter matches one notice by its text (and its logger or warning class), never a whole library, so a
warning that says something about the run still shows:

- torch: "`torch.jit.script` is deprecated" (a FutureWarning raised by libraries that script at import);
- Lightning on torch 2.14: "`isinstance(treespec, LeafSpec)` is deprecated" (Lightning's own call, at every fit);
- laplace-torch: "... backend not available ..." (optional backends it logs at import, with a pip command);
- Lightning: its "💡 Tip: ..." advertisements, and "Found N module(s) in eval mode at the start of training"
  (the frozen backbone is in eval mode on purpose: dropout off in the pretrained part); "GPU available: ...,
  used: ..." and "TPU available: ..." at every fit (the device a run used is in its results.json; "GPU available
  but not used", which says something, stays); "The number of training batches (N) is smaller than the logging
  interval" (small runs log at each epoch's end all the same);
- transformers: the "<Model> LOAD REPORT" of every pretrained backbone, listing the head and pooler weights a
  backbone without its head does not load (the method logs what it trains and freezes).
"""

from __future__ import annotations

import logging
import os
import re
import warnings

WARNINGS = (
    (r"`torch\.jit\.script` is deprecated", FutureWarning),
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    (r"Found \d+ module\(s\) in eval mode at the start of training", Warning),
    (r"The number of training batches \(\d+\) is smaller than the logging interval", Warning),
)
LIGHTNING = re.compile(r"^💡 Tip: |^GPU available: |^TPU available: ")
# logger name -> what its records say, for records that are only noise
LOG_RECORDS = {
    "root": re.compile(r"\w+ backend not available"),
    "laplace": re.compile(r"\w+ backend not available"),
    "pytorch_lightning.utilities.rank_zero": LIGHTNING,
    "lightning.pytorch.utilities.rank_zero": LIGHTNING,
    "transformers.modeling_utils": re.compile(r"\bLOAD REPORT\b"),
}


def verbose() -> bool:
    return os.environ.get("SVE_VERBOSE", "").strip() not in ("", "0")


class Noise(logging.Filter):
    """Drops the records of ``LOG_RECORDS`` (by logger name and text)."""

    def filter(self, record: logging.LogRecord) -> bool:
        pattern = LOG_RECORDS.get(record.name)
        if pattern is None and record.name.startswith("laplace"):
            pattern = LOG_RECORDS["laplace"]
        return pattern is None or not pattern.search(record.getMessage())


def hide_noise() -> None:
    """Installs the filters (once per process; again after Hydra has configured logging is harmless). Verbose,
    it removes the log filters an earlier call in this process installed (a notebook, a test run)."""
    if verbose():
        for name in LOG_RECORDS:
            logger = logging.getLogger(None if name == "root" else name)
            for noise in [f for f in logger.filters if isinstance(f, Noise)]:
                logger.removeFilter(noise)
        return
    for message, category in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name in LOG_RECORDS:  # a logger's own filters see the records it creates (the root's: logging.info)
        logger = logging.getLogger(None if name == "root" else name)
        if not any(isinstance(f, Noise) for f in logger.filters):
            logger.addFilter(Noise())
