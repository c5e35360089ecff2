"""Where things are. Two kinds of place, never mixed:

- what ships with the package (read only): the Hydra configs (``sve/configs``, with the table and claim
  definitions and the paper's reference numbers under ``paper/``);
- what a user's runs write and read: the result store, the run directories, the smoke store. Those are
  resolved against the *current working directory* (``results/``) or an explicit option (``--results``,
  ``hydra.run.dir``, the ``SVE_RESULTS`` environment variable), never against the package's location: a
  sweep started in a clone writes into that clone, whichever checkout the package was installed from.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
CONFIGS = PACKAGE / "configs"  # the config groups (train.yaml, backbone/, method/, ...)
TABLES = CONFIGS / "tables"  # one definition per paper table or figure (sve.paper.report)
CLAIMS = CONFIGS / "claims"  # the paper's claims, checked against the miniature (sve.paper.claims)
PAPER = CONFIGS / "paper"  # the paper's numbers, transcribed, for side-by-side columns only
RESULTS_ENV = "SVE_RESULTS"


def results_root(option: str | Path | None = None) -> Path:
    """The result store: ``option``, else ``$SVE_RESULTS``, else ``./results`` of the current directory."""
    if option is not None:
        return Path(option).expanduser()
    if os.environ.get(RESULTS_ENV):
        return Path(os.environ[RESULTS_ENV]).expanduser()
    return Path.cwd() / "results"


def shown(path: Path) -> str:
    """A path as a reader finds it: inside the package as ``sve/configs/...``, under the current directory
    relative to it, else as it is."""
    path = Path(path).resolve()
    if path.is_relative_to(PACKAGE):
        return str(Path("sve") / path.relative_to(PACKAGE))
    cwd = Path.cwd().resolve()
    return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)
