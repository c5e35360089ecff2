"""Paired-bootstrap 95% intervals for the claims' differences (``sve.paper.claims``), from per-example files.

Why: the tables show mean ± std over three seeds, and a sign over three seeds cannot say whether the test set
tells two rows apart. Both rows of a comparison were evaluated on the same test examples, so the uncertainty
that the test set's finite size leaves is measured by resampling those examples, the same ones for both rows.

**Files.** Every evaluation writes, besides its predictions (``predictions/<set>.npz``: member logits, large and
git-ignored), a compact file per set that the claims need, ``predictive/<set>.npz`` next to it (committed):

- ``test``: ``probs`` (N, C) float32, the ensemble predictive; and the per-example statistics below;
- ``shift/<corruption>/<severity>``: the per-example statistics only (15 sets for CIFAR-10's three corruptions);
- ``ood``: ``confidence`` and ``index`` only (the OOD metrics rank maximum probabilities, nothing else);
- per-example statistics, each the project's own definition (``sve.metrics.scores``): ``confidence`` float64, the
  maximum probability (the ECE's confidence and the OOD score, kept exact so that bins and ranks are the
  table's); ``correct`` bool (``Accuracy``); ``nll``, ``brier`` float32 (``NegativeLogLikelihood``,
  ``BrierScore``); ``labels`` and ``index`` int64 (which examples these are: the pairing is checked on them).

From these, every metric of a resample is a weighted sum over the full set with the resample's counts as
weights (``statistic``): acc, nll and brier are weighted means; ECE sums weighted per-bin gaps over the same 15
right-closed bins (``ece_bins`` assigns them with ``sve.metrics.scores``' own torch code); AUROC, AUPRC and FPR95 follow
torchmetrics' curve (distinct thresholds, trapezoid, first threshold at 95% TPR) with weighted counts. With all
weights one each equals the table's number (``tests/test_bootstrap.py`` checks both facts).

**Procedure** (``interval``). A difference is a sum of terms ``coef * metric(run)`` (``Term``), e.g. for A
against B over seeds s = 1..S: (1/S) sum_s [metric(A_s) - metric(B_s)], the table's difference of means. Each
replicate draws, with replacement, a resample of every *stratum*: the examples of one seed and one example
set (``Examples.fingerprint``: the same index and labels). Terms of the same seed on the same examples share
the resample (paired: A_s and B_s; the corruption sets of one severity, which are the same seeded test images,
so a severity's mean over corruptions is resampled as one set); different seeds draw independently, as do the
in-distribution and OOD examples of the OOD metrics. The interval is the 2.5 and 97.5 percentiles of the
replicates (2000 by default) from ``numpy.random.default_rng(seed)``, a fixed seed, so the same files give the
same interval to the last digit (with the same numpy). What it covers: the test examples' sampling, given the
trained runs; not the seeds' training noise, which three seeds cannot measure.
"""

from __future__ import annotations

import functools
import hashlib
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from sve.errors import InputError
from sve.metrics.scores import Accuracy, BrierScore, NegativeLogLikelihood, ece_bin_index
from sve.runs.writable import atomic_write

PREDICTIVE = "predictive"  # <run dir>/predictive/<set>.npz, beside predictions/ (sve.runs.evaluation)
TEST, OOD = "test", "ood"
N_BINS = 15  # the ECE's bins (sve.metrics.scores.ExpectedCalibrationError's default, used by every run)
CLASSIFICATION = ("acc", "ece", "nll", "brier")
OOD_METRICS = ("ood_auroc", "ood_auprc", "ood_fpr95")
KEYS = CLASSIFICATION + OOD_METRICS
REPLICATES, LEVEL, SEED = 2000, 0.95, 0
KEPT_CURVES = 64  # OOD curves kept per pair of sets: more than the chunks of one interval (REPLICATES / CHUNK)
CHUNK = 250  # replicates drawn and evaluated at a time (memory: CHUNK x N float64 per stratum)
STATISTICS = ("confidence", "correct", "nll", "brier", "labels", "index")


# --- the per-example files --------------------------------------------------------------------------------


def predictive_arrays(name: str, probs: torch.Tensor, labels: torch.Tensor, index: torch.Tensor) -> dict:
    """The arrays of ``predictive/<name>.npz`` (layout in the module docstring) from the ensemble predictive
    (N, C) as ``sve.members.predictive`` returns it (float64), the labels and the examples' positions."""
    probs, labels = probs.detach().double().cpu(), labels.detach().long().cpu()
    arrays = {"index": index.detach().cpu().numpy().astype(np.int64),
              "confidence": probs.max(-1).values.numpy()}  # fmt: skip
    if name != OOD:  # an OOD set's labels belong to another label space: only its scores are read
        arrays.update(labels=labels.numpy(), correct=Accuracy().per_example(probs, labels).numpy().astype(bool),
                      nll=NegativeLogLikelihood().per_example(probs, labels).numpy().astype(np.float32),
                      brier=BrierScore().per_example(probs, labels).numpy().astype(np.float32))  # fmt: skip
    if name == TEST:
        arrays["probs"] = probs.numpy().astype(np.float32)
    return arrays


def write_predictive(path: Path, name: str, probs: torch.Tensor, labels: torch.Tensor, index: torch.Tensor) -> None:
    """``predictive_arrays`` written compressed and atomically (``sve.runs.writable.atomic_write``: a full disk is an
    ``InputError`` naming the file, and no partial file stays)."""
    arrays = predictive_arrays(name, probs, labels, index)
    atomic_write(Path(path), lambda f: np.savez_compressed(f, **arrays), needed=sum(a.nbytes for a in arrays.values()))


def ece_bins(confidence: np.ndarray, n_bins: int = N_BINS) -> np.ndarray:
    """Each confidence's ECE bin by the very function ``sve.metrics.scores.ExpectedCalibrationError`` uses
    (right-closed bins, 0 in the first), so resampled ECEs use the table's bins to the last digit."""
    return ece_bin_index(torch.from_numpy(np.ascontiguousarray(confidence, dtype=np.float64)), n_bins).numpy()


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
            raise InputError(f"{self.where} lacks {absent} (has {sorted(self.arrays)}); evaluate the run again to "
                             "rewrite it (python evaluate.py run_dir=<its run directory> update_results=true)")
        lengths = {k: len(self.arrays[k]) for k in need}
        if len(set(lengths.values())) != 1:
            raise InputError(f"{self.where}: arrays of different lengths {lengths}; evaluate the run again")
        digest = hashlib.sha1(np.ascontiguousarray(self.arrays["index"], dtype=np.int64).tobytes())
        if self.labels is not None:
            digest.update(np.ascontiguousarray(self.labels, dtype=np.int64).tobytes())
        self.fingerprint = f"{self.n}:{digest.hexdigest()[:16]}"

    @property
    def where(self) -> str:
        return str(self.path) if self.path is not None else f"the {self.name} set"

    @property
    def n(self) -> int:
        return len(self.arrays["index"])

    @property
    def labels(self) -> np.ndarray | None:
        return self.arrays.get("labels")

    @property
    def group(self) -> str:
        """In-distribution and OOD examples are resampled separately even when their positions coincide."""
        return OOD if self.name == OOD else "in"

    @classmethod
    def of(cls, name: str, probs: torch.Tensor, labels: torch.Tensor, index: torch.Tensor | None = None) -> Examples:
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
        raise InputError(f"{path} ({path.stat().st_size} bytes) is not a readable predictive file (.npz of arrays: "
                         f"{reason}); evaluate the run again to rewrite it (python evaluate.py run_dir=<its run "
                         "directory> update_results=true)") from None  # fmt: skip
    return Examples(name, arrays, path)


# --- metrics of weighted (resampled) sets ------------------------------------------------------------------

Weights = np.ndarray  # (R, n): how often each example is drawn in each of R resamples; all ones = the full set


def _classification(key: str, ex: Examples) -> Callable[[Weights], np.ndarray]:
    if ex.labels is None:
        raise ValueError(f"{key} needs labels; {ex.where} has none (an OOD set is scored by the OOD metrics only)")
    n = ex.n
    if key == "ece":  # sum over bins of |sum_i w_i (correct_i - conf_i)| / n: the metric's per-bin sums
        bins = ece_bins(ex.arrays["confidence"])
        order = np.argsort(bins, kind="stable")
        starts = np.flatnonzero(np.r_[True, np.diff(bins[order]) != 0])  # the first example of each non-empty bin
        gap = (ex.arrays["correct"].astype(np.float64) - ex.arrays["confidence"].astype(np.float64))[order]
        return lambda w: np.abs(np.add.reduceat(w[:, order] * gap, starts, axis=1)).sum(-1) / n
    values = ex.arrays["correct" if key == "acc" else key].astype(np.float64)
    return lambda w: w @ values / n


def ood_curve(inside: Examples, outside: Examples) -> Callable[[Weights, Weights], dict[str, np.ndarray]]:
    """AUROC, AUPRC and FPR at 95% TPR of in-distribution (positive) against OOD maximum probabilities, with
    weighted counts: torchmetrics' binary curve (``sve.metrics.scores.OODDetection``) with tps/fps as weighted
    cumulative sums at the distinct scores. Examples of weight zero add points that repeat their neighbours,
    which change neither area nor the 95% threshold."""
    scores = np.concatenate([inside.arrays["confidence"], outside.arrays["confidence"]]).astype(np.float64)
    positive = np.concatenate([np.ones(inside.n), np.zeros(outside.n)])
    order = np.argsort(-scores, kind="stable")
    ranked, positive = scores[order], positive[order]
    thresholds = np.r_[np.flatnonzero(np.diff(ranked)), len(ranked) - 1]

    # A claim compares AUROC, AUPRC and FPR95 in three intervals that draw the same counts (one rng seed each),
    # so the curves of the latest weights are kept (every chunk of an interval) and reused for equal weights.
    kept: dict[bytes, dict[str, np.ndarray]] = {}

    def curve(w_in: Weights, w_out: Weights) -> dict[str, np.ndarray]:
        key = hashlib.blake2b(w_in.tobytes() + w_out.tobytes() + repr((w_in.shape, w_out.shape)).encode()).digest()
        if key not in kept:
            if len(kept) >= KEPT_CURVES:
                del kept[next(iter(kept))]
            kept[key] = _curve(w_in, w_out)
        return kept[key]

    def _curve(w_in: Weights, w_out: Weights) -> dict[str, np.ndarray]:
        w = np.concatenate([w_in, w_out], axis=1)[:, order]
        tps = np.cumsum(w * positive, axis=1)[:, thresholds]
        fps = np.cumsum(w, axis=1)[:, thresholds] - tps  # exact: the weights are whole counts
        zero = np.zeros((len(w), 1))
        tpr = np.hstack([zero, tps]) / tps[:, -1:]
        fpr = np.hstack([zero, fps]) / fps[:, -1:]
        auroc = (np.diff(fpr, axis=1) * (tpr[:, 1:] + tpr[:, :-1]) / 2).sum(1)
        fpr95 = fpr[np.arange(len(w)), np.argmax(tpr >= 0.95, axis=1)]
        with np.errstate(invalid="ignore", divide="ignore"):
            precision = np.where(tps + fps > 0, tps / (tps + fps), 0.0)  # 0/0 only before any drawn example
        recall = tps / tps[:, -1:]
        auprc = (np.diff(recall, axis=1, prepend=0.0) * precision).sum(1)
        return {"ood_auroc": auroc, "ood_auprc": auprc, "ood_fpr95": fpr95}

    return curve


@functools.lru_cache(maxsize=64)
def shared_ood_curve(inside: Examples, outside: Examples) -> Callable[[Weights, Weights], dict[str, np.ndarray]]:
    """One ``ood_curve`` per pair of sets (``Examples`` hash by identity), shared by the three OOD statistics."""
    return ood_curve(inside, outside)


@dataclass(eq=False)
class Statistic:
    """One metric of one run, as a function of per-set resampling weights (one matrix per set of ``sets``)."""

    key: str
    sets: tuple[Examples, ...]
    evaluate: Callable[[Sequence[Weights]], np.ndarray]  # weights per set -> (R,) metric values
    _value: float | None = None

    def value(self) -> float:
        """The metric on the full sets (all weights one): the table's number."""
        if self._value is None:
            self._value = float(self.evaluate([np.ones((1, s.n)) for s in self.sets])[0])
        return self._value


def statistic(key: str, sets: Sequence[Examples]) -> Statistic:
    """``key`` (a results.json test metric without ``test/``) on ``sets``: for acc, ece, nll and brier the mean
    over the sets (one set: the metric; a severity's corruption sets: Fig. 3's mean over corruptions); for the
    OOD metrics ``sets`` is (in-distribution test set, OOD set)."""
    sets = tuple(sets)
    if key in CLASSIFICATION:
        if not sets:
            raise ValueError(f"{key}: no evaluation set given")
        parts = [_classification(key, s) for s in sets]
        return Statistic(key, sets, lambda ws: sum(f(w) for f, w in zip(parts, ws)) / len(parts))
    if key in OOD_METRICS:
        if len(sets) != 2 or sets[0].group == OOD or sets[1].group != OOD:
            raise ValueError(f"{key} needs (in-distribution set, OOD set); got {[s.name for s in sets]}")
        curve = shared_ood_curve(*sets)
        return Statistic(key, sets, lambda ws: curve(*ws)[key])
    raise ValueError(f"no per-example statistic for metric {key!r}; choose one of {list(KEYS)}")


def check_paired(a: Statistic, b: Statistic) -> None:
    """Refuses (``InputError``) two runs' statistics whose sets are not the same examples (index and labels)."""
    names = [[s.name for s in stat.sets] for stat in (a, b)]
    if names[0] != names[1]:
        raise InputError(f"a paired bootstrap needs both runs' {a.key} on the same evaluation sets; one has "
                         f"{names[0]}, the other {names[1]} (evaluate both with the same corruptions and severities)")
    for x, y in zip(a.sets, b.sets):
        if x.fingerprint != y.fingerprint:
            raise InputError(f"a paired bootstrap needs both runs evaluated on the same examples, but {x.where} "
                             f"({x.n} examples) and {y.where} ({y.n} examples) differ in their index or labels; "
                             "evaluate both on the same set (the same dataset.test_size, shift_size and "
                             "subset_seed)")  # fmt: skip


# --- intervals -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Term:
    """``coef * statistic`` in a difference; ``seed`` (the run's) keys its resample with the examples."""

    coef: float
    seed: int
    statistic: Statistic


@dataclass(frozen=True)
class Interval:
    point: float  # the difference on the full sets
    low: float
    high: float


def resample_counts(rng: np.random.Generator, n: int, replicates: int) -> Weights:
    """(replicates, n) counts of each example in ``replicates`` draws of n examples with replacement."""
    drawn = rng.integers(0, n, size=(replicates, n)) + n * np.arange(replicates)[:, None]
    return np.bincount(drawn.ravel(), minlength=replicates * n).reshape(replicates, n).astype(np.float64)


def stratum(term: Term, examples: Examples) -> tuple:
    return term.seed, examples.group, examples.fingerprint


def interval(terms: Sequence[Term], replicates: int = REPLICATES, level: float = LEVEL, seed: int = SEED) -> Interval:
    """The percentile interval of sum(coef * statistic) over ``replicates`` paired resamples (module docstring)."""
    if not terms:
        raise ValueError("a difference needs at least one term")
    if isinstance(replicates, bool) or not isinstance(replicates, int) or replicates < 1:
        raise ValueError(f"replicates={replicates!r} is not valid; give a positive integer (e.g. {REPLICATES})")
    if not 0 < level < 1:
        raise ValueError(f"level={level!r} is not valid; give a coverage in (0, 1), e.g. {LEVEL}")
    sizes = {stratum(t, s): s.n for t in terms for s in t.statistic.sets}
    point = float(sum(t.coef * t.statistic.value() for t in terms))
    rng = np.random.default_rng(seed)
    draws = np.empty(replicates)
    for start in range(0, replicates, CHUNK):
        r = min(CHUNK, replicates - start)
        weights = {k: resample_counts(rng, sizes[k], r) for k in sorted(sizes)}
        total = np.zeros(r)
        for t in terms:
            total += t.coef * t.statistic.evaluate([weights[stratum(t, s)] for s in t.statistic.sets])
        draws[start:start + r] = total
    low, high = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return Interval(point, float(low), float(high))


# --- runs evaluated before these files existed -------------------------------------------------------------------


def backfill(run_dir: Path) -> list[Path]:
    """Writes the missing ``predictive/<set>.npz`` of a run directory from its saved predictions
    (``predictions/<set>.npz``, where they are still on disk: they are not committed); returns the files written."""
    from sve.members import predictive
    from sve.runs.evaluation import PREDICTIONS, read_predictions

    run_dir, written = Path(run_dir), []
    for source in sorted((run_dir / PREDICTIONS).rglob("*.npz")):
        name = source.relative_to(run_dir / PREDICTIONS).with_suffix("").as_posix()
        target = run_dir / PREDICTIVE / f"{name}.npz"
        if name == "val" or target.exists():
            continue
        saved = read_predictions(source)
        probs = predictive(torch.from_numpy(saved["member_logits"]), str(saved["aggregate"]))
        write_predictive(target, name, probs, torch.from_numpy(saved["labels"]), torch.from_numpy(saved["index"]))
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Write the missing predictive/<set>.npz of every run under a "
                                                 "results root from its saved predictions/<set>.npz.")  # fmt: skip
    parser.add_argument("root", type=Path)
    args = parser.parse_args(argv)
    written = [p for results in sorted(args.root.rglob("results.json")) for p in backfill(results.parent)]
    print(f"wrote {len(written)} predictive files under {args.root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["PREDICTIVE", "KEYS", "Examples", "Statistic", "Term", "Interval", "predictive_arrays", "write_predictive",
           "read_predictive", "ece_bins", "statistic", "check_paired", "interval", "backfill"]
