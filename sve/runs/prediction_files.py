"""The two files of one evaluated set, written by every evaluation (``sve.runs.evaluation``): its predictions and
its predictive.

Predictions, ``<run dir>/predictions/<set>.npz`` (``numpy.load``, no pickle; large and git-ignored):

- ``member_logits`` (M, N, C): float32, or float16 when the float32 array would exceed ``float16_above_mb``
  (half the disk; the metrics recomputed from it then agree to about 1e-3 instead of 1e-6). M is the members
  or samples that produced the predictive.
- ``labels`` (N,) int64; ``index`` (N,) int64, each example's position in the evaluated set (rows are in
  that order; fewer than the set when ``trainer.limit_test_batches`` cut it);
- ``aggregate``: the run's rule for the predictive (``sve.members.predictive``), also in results.json.

The predictive, ``<run dir>/predictive/<set>.npz``, for the test, OOD and shift sets (not ``val``), written whether
or not predictions are saved: the ensemble predictive's per-example statistics from which the claims' intervals
are computed (``sve.paper.bootstrap``; small enough to commit):

- ``test``: ``probs`` (N, C) float32, the ensemble predictive; ``mutual_information`` (N,) float32, the members'
  disagreement (``sve.metrics.scores.uncertainty``; only with more than one member, in files written since it
  was added); and the per-example statistics below;
- ``shift/<corruption>/<severity>``: the per-example statistics only (15 sets for CIFAR-10's three corruptions);
- ``ood``: ``confidence`` and ``index`` only (the OOD metrics rank maximum probabilities, nothing else);
- per-example statistics, each the project's own definition (``sve.metrics.scores``): ``confidence`` float64, the
  maximum probability (the ECE's confidence and the OOD score, kept exact so that bins and ranks are the
  table's); ``correct`` bool (``Accuracy``); ``nll``, ``brier`` float32 (``NegativeLogLikelihood``,
  ``BrierScore``); ``labels`` and ``index`` int64 (which examples these are: the pairing is checked on them).
"""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from sve.errors import InputError
from sve.members import predictive
from sve.metrics.scores import Accuracy, BrierScore, NegativeLogLikelihood
from sve.runs.writable import atomic_write

PREDICTIONS = "predictions"  # <run dir>/predictions/<set>.npz
PREDICTIVE = "predictive"  # <run dir>/predictive/<set>.npz, beside predictions/
TEST, OOD = "test", "ood"


def write_predictions(path: Path, predictions, aggregate: str, float16_above_mb: float) -> None:
    """One set's ``.npz`` (layout in the module docstring), written atomically (``sve.runs.writable.atomic_write``:
    a full disk is an ``InputError`` naming the file and the space needed and left, and no partial file stays)."""
    logits = predictions.member_logits.numpy()
    finite = logits[np.isfinite(logits)]
    fits_float16 = not finite.size or float(np.abs(finite).max()) <= float(np.finfo(np.float16).max)
    if logits.nbytes > float16_above_mb * 2**20 and fits_float16:
        logits = logits.astype(np.float16)
    arrays = {
        "member_logits": logits,
        "labels": predictions.labels.numpy().astype(np.int64),
        "index": predictions.index.numpy().astype(np.int64),
        "aggregate": np.array(aggregate),
    }
    atomic_write(Path(path), lambda f: np.savez(f, **arrays), needed=sum(a.nbytes for a in arrays.values()))


def read_predictions(path: Path) -> dict[str, np.ndarray]:
    """A saved ``.npz`` as arrays; an ``InputError`` naming the file when it is missing, truncated or not an
    ``.npz`` of arrays (no pickles are loaded)."""
    path = Path(path)
    try:
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    except (OSError, EOFError, ValueError, TypeError, zipfile.BadZipFile) as err:  # TypeError: a bare .npy array
        size = f"{path.stat().st_size} bytes" if path.is_file() else "absent"
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise InputError(
            f"{path} ({size}) is not a readable predictions file (.npz of arrays: {reason}); it may "
            "be truncated or another kind of file. Evaluate the run again to rewrite it "
            "(python evaluate.py run_dir=<its run directory> update_results=true)"
        ) from None


def predictive_arrays(
    name: str,
    probs: torch.Tensor,
    labels: torch.Tensor,
    index: torch.Tensor,
    mutual_information: torch.Tensor | None = None,
) -> dict:
    """The arrays of ``predictive/<name>.npz`` (layout in the module docstring) from the ensemble predictive
    (N, C) as ``sve.members.predictive`` returns it (float64), the labels and the examples' positions; the test
    set's file also keeps the members' ``mutual_information`` (N,) when given (more than one member)."""
    probs, labels = probs.detach().double().cpu(), labels.detach().long().cpu()
    arrays = {"index": index.detach().cpu().numpy().astype(np.int64), "confidence": probs.max(-1).values.numpy()}
    if name != OOD:  # an OOD set's labels belong to another label space: only its scores are read
        arrays.update(
            labels=labels.numpy(),
            correct=Accuracy().per_example(probs, labels).numpy().astype(bool),
            nll=NegativeLogLikelihood().per_example(probs, labels).numpy().astype(np.float32),
            brier=BrierScore().per_example(probs, labels).numpy().astype(np.float32),
        )
    if name == TEST:
        arrays["probs"] = probs.numpy().astype(np.float32)
        if mutual_information is not None:
            arrays["mutual_information"] = mutual_information.detach().double().cpu().numpy().astype(np.float32)
    return arrays


def write_predictive(
    path: Path,
    name: str,
    probs: torch.Tensor,
    labels: torch.Tensor,
    index: torch.Tensor,
    mutual_information: torch.Tensor | None = None,
) -> None:
    """``predictive_arrays`` compressed, by ``atomic_write`` (a full disk: one ``InputError``, no partial file)."""
    arrays = predictive_arrays(name, probs, labels, index, mutual_information)
    atomic_write(Path(path), lambda f: np.savez_compressed(f, **arrays), needed=sum(a.nbytes for a in arrays.values()))


@dataclass(eq=False)
class Examples:
    """One run's per-example statistics of one evaluation set."""

    name: str  # "test", "ood", "shift/<corruption>/<severity>"
    arrays: dict[str, np.ndarray]
    path: Path | None = None
    fingerprint: str = field(init=False)

    def __post_init__(self):
        need = ["index", "confidence"] + (["labels", "correct", "nll", "brier"] if self.name != OOD else [])
        absent = [k for k in need if k not in self.arrays]
        if absent:
            raise InputError(
                f"{self.where} lacks {absent} (has {sorted(self.arrays)}); evaluate the run again to "
                "rewrite it (python evaluate.py run_dir=<its run directory> update_results=true)"
            )
        lengths = {k: len(self.arrays[k]) for k in need}
        if len(set(lengths.values())) != 1:
            raise InputError(f"{self.where}: arrays of different lengths {lengths}; evaluate the run again")
        digest = hashlib.sha1(np.ascontiguousarray(self.arrays["index"], dtype=np.int64).tobytes())
        if self.labels is not None:
            digest.update(np.ascontiguousarray(self.labels, dtype=np.int64).tobytes())
        self.fingerprint = f"{self.size}:{digest.hexdigest()[:16]}"

    @property
    def where(self) -> str:
        return str(self.path) if self.path is not None else f"the {self.name} set"

    @property
    def size(self) -> int:
        """The number of examples."""
        return len(self.arrays["index"])

    @property
    def labels(self) -> np.ndarray | None:
        return self.arrays.get("labels")

    @property
    def group(self) -> str:
        """In-distribution and OOD examples are resampled separately even when their positions coincide."""
        return OOD if self.name == OOD else "in"

    @classmethod
    def from_predictive(
        cls, name: str, probs: torch.Tensor, labels: torch.Tensor, index: torch.Tensor | None = None
    ) -> Examples:
        """The set as the file written from these predictions would hold it (no file: tests, ``backfill``)."""
        index = torch.arange(len(probs)) if index is None else index
        return cls(name, predictive_arrays(name, probs, labels, index))


def read_predictive(path: Path, name: str) -> Examples | None:
    """``path`` (a ``predictive/<name>.npz``) as ``Examples``; None when it does not exist (a run evaluated before
    these files were written); an ``InputError`` naming it when it is unreadable (no pickles are loaded)."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, EOFError, ValueError, TypeError, zipfile.BadZipFile) as err:
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise InputError(
            f"{path} ({path.stat().st_size} bytes) is not a readable predictive file (.npz of arrays: "
            f"{reason}); evaluate the run again to rewrite it (python evaluate.py run_dir=<its run "
            "directory> update_results=true)"
        ) from None
    return Examples(name, arrays, path)


def members_information(member_logits: torch.Tensor) -> torch.Tensor | None:
    """Each example's mutual information between the prediction and the member, (N,); None for one member."""
    from sve.metrics.scores import uncertainty

    return uncertainty(member_logits).mutual_information if member_logits.shape[0] > 1 else None


def backfill(run_dir: Path) -> list[Path]:
    """Writes the missing ``predictive/<set>.npz`` of a run directory from its saved predictions
    (``predictions/<set>.npz``, where they are still on disk: they are not committed); returns the files written."""
    run_dir, written = Path(run_dir), []
    for source in sorted((run_dir / PREDICTIONS).rglob("*.npz")):
        name = source.relative_to(run_dir / PREDICTIONS).with_suffix("").as_posix()
        target = run_dir / PREDICTIVE / f"{name}.npz"
        if name == "val" or target.exists():
            continue
        saved = read_predictions(source)
        logits = torch.from_numpy(saved["member_logits"])
        probs = predictive(logits, str(saved["aggregate"]))
        labels, index = torch.from_numpy(saved["labels"]), torch.from_numpy(saved["index"])
        write_predictive(target, name, probs, labels, index, members_information(logits))
        written.append(target)
    return written


__all__ = [
    "PREDICTIONS",
    "write_predictions",
    "read_predictions",
    "PREDICTIVE",
    "TEST",
    "OOD",
    "Examples",
    "predictive_arrays",
    "write_predictive",
    "members_information",
    "read_predictive",
    "backfill",
]
