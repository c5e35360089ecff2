"""Adds each test example's mutual information between the members to committed runs' ``predictive/test.npz``, by
evaluating their saved adapters again: ``python scripts/keep_disagreement.py RUN_DIR [RUN_DIR ...] [-- key=value]``
(``make mini-disagreement``).

Why: the committed predictive files of runs evaluated before the disagreement was kept hold the ensemble's
predictive only, and the member logits (``predictions/``) are not committed; the conformal claim's second half
needs the disagreement (``sve.paper.conformal_splits``: ``growth_``, ``mi_``). A run whose ``adapter/`` is
committed can be evaluated again without its checkpoint (``sve-eval <run>/adapter``, into a scratch copy): the
new file's arrays must equal the committed ones (the same model on the same examples: whole-number and boolean
arrays exactly, floating ones to ``ATOL``), and only then is ``mutual_information`` added, the committed arrays
left as they are. A run whose file already has it is skipped, so the target resumes. Overrides
after ``--`` go to every ``sve-eval``: where this machine keeps the data (``dataset.root=...``), and for image
runs ``dataset.corruptions=[] dataset.ood=null``, since only the test set is needed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from sve.errors import InputError, one_line_errors
from sve.runs.prediction_files import PREDICTIVE, TEST
from sve.runs.writable import atomic_write

# Floating values may differ in their last bits between two evaluations of the same model (another order of a
# reduction in a fused attention kernel); every decision (labels, index, correct) must be identical.
ATOL, RTOL = 1e-5, 1e-4


def same(a: np.ndarray, b: np.ndarray, atol: float) -> bool:
    """Whole-number and boolean arrays (labels, index, correct) equal; floating ones within ``atol`` plus ``RTOL``
    of their size (an NLL of a small probability moves by the probability's relative change)."""
    if a.shape != b.shape:
        return False
    if np.issubdtype(a.dtype, np.floating):
        return bool(np.allclose(a, b, rtol=RTOL, atol=atol))
    return bool(np.array_equal(a, b))


def merge(committed: Path, evaluated: Path, atol: float = ATOL) -> bool:
    """Writes ``committed`` with ``evaluated``'s mutual information when every array they share agrees (``same``),
    its own arrays untouched; returns whether it was added (False: already there)."""
    with np.load(committed) as old, np.load(evaluated) as new:
        arrays = {k: old[k] for k in old.files}
        if "mutual_information" in arrays:
            return False
        if "mutual_information" not in new.files:
            raise InputError(f"{evaluated} has no mutual_information (a one-member run has no disagreement)")
        differing = [k for k in arrays if k not in new.files or not same(arrays[k], new[k], atol)]
        if differing:
            raise InputError(
                f"{evaluated} differs from {committed} in {differing} (beyond {atol:g} for floating values): the "
                "adapter evaluated again is not the model that wrote the committed file (another data root, "
                "config or code); nothing was changed"
            )
        arrays["mutual_information"] = new["mutual_information"]
    atomic_write(committed, lambda f: np.savez_compressed(f, **arrays), needed=sum(a.nbytes for a in arrays.values()))
    return True


def keep(run_dir: Path, overrides: list[str]) -> str:
    committed = run_dir / PREDICTIVE / f"{TEST}.npz"
    if not committed.is_file() or not (run_dir / "adapter").is_dir():
        raise InputError(
            f"{run_dir} needs predictive/{TEST}.npz and adapter/ (has {sorted(p.name for p in run_dir.iterdir())})"
        )
    with np.load(committed) as found:
        if "mutual_information" in found.files:
            return "already kept"
    with tempfile.TemporaryDirectory(prefix="keep_disagreement_") as scratch:
        adapter = Path(scratch) / "adapter"
        shutil.copytree(run_dir / "adapter", adapter)
        command = ["sve-eval", str(adapter), "name=disagreement", *overrides]
        subprocess.run(command, check=True)
        added = merge(committed, adapter / "evaluations" / "disagreement" / PREDICTIVE / f"{TEST}.npz")
    return "added" if added else "already kept"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    runs, overrides = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+")
    args = parser.parse_args(runs)
    with one_line_errors():
        for run_dir in args.runs:
            print(f"{run_dir}: {keep(run_dir, overrides)}", flush=True)


if __name__ == "__main__":
    main()
