"""A trained model on every evaluation set of its data module: saved predictions, then every number from them.

``evaluate(trainer, module, datamodule, out_dir, ...)`` runs one ``trainer.test`` per set of
``datamodule.evaluation_sets()`` (``val``, ``test``, ``ood``, ``shift/<corruption>/<severity>``). Each pass is
seeded from the run's seed and the set's name, so a method whose members are samples (MC dropout, BLoB,
Laplace) draws the same samples whenever the set is evaluated again (``evaluate.py``). Under DDP every rank
holds the whole set after the module's gather and computes the same numbers; rank 0 writes.

The files of each set, ``<out_dir>/predictions/<set>.npz`` (member logits) and ``<out_dir>/predictive/<set>.npz``
(the predictive's per-example statistics, for the claims' intervals): ``sve.runs.prediction_files``.

What ``evaluate`` returns (the results.json keys of the module docstring of ``sve.runs.run``):

- ``num_members``; ``predictions``: {set: path relative to the run directory};
- ``temperature_from``: where the T of ``test/ts_*`` came from (``evaluate``'s docstring);
- ``metrics``: the test set's ``test/acc``, ``ece``, ``nll``, ``brier``; per member ``test/member_acc`` etc.
  (lists of length M); ``test/disagreement``, ``test/mutual_information``, ``test/aurc`` (``sve.metrics.scores``,
  ``sve.metrics.selective``); temperature scaling fitted on ``val`` (``test/temperature``, ``test/ts_acc``,
  ``ts_ece``, ``ts_nll``; ``sve.metrics.calibration``); ``val/acc`` etc.; with an OOD set ``test/ood_auroc``,
  ``ood_auprc``, ``ood_fpr95`` and, with more than one member, the same by mutual information
  ``test/ood_auroc_mi`` etc. (``sve.metrics.scores.ood_scores``);
  ``test/examples``, ``test/seconds``; ``test/collapsed_members``: the members whose output hardly depends on
  the input (``sve.metrics.collapse``; a warning names them);
- ``reliability``: {"test": {"count", "confidence", "accuracy"}}, 15 bins as the ECE's (None: empty bin);
- ``conformal``: split conformal sets calibrated on ``val`` (disjoint from ``test`` by the data module's split) and
  measured on ``test``, of the raw predictive, for every score at alpha 0.1 and 0.05: ``calibration_split``,
  ``test_split``, their example counts, the scores' ``options`` and ``by_alpha`` {alpha: {score: {threshold,
  coverage, mean_size, median_size, size_stratified, class_conditional}}} (``sve.metrics.conformal.record``);
- ``risk_coverage``: {"test": {"coverage", "risk"}}, at most 100 points of the test set's risk-coverage curve
  (``sve.metrics.selective.curve_record``), whose mean over all N coverages is ``test/aurc``;
- ``shift`` (sets ``shift/...`` only): ``by_corruption`` {corruption: {severity: {acc, ece, nll, brier}}};
  ``by_severity`` {"0": the clean test set, "1".."5": the mean over corruptions of each metric at that
  severity, as Fig. 3 plots it (Ovadia et al., 2019)}; ``pooled``: the metrics of all corrupted sets taken
  as one (CIFAR-100-C as a single number; its ECE is not the mean of the per-set ECEs).
- ``shifted`` (sets ``shifted/<name>`` only, ``sve.data.base``): the test set and each shifted set side by side,
  ``sets`` {"test" and each name: {``acc``, ``ece``, ``nll``, ``brier``, ``disagreement``, ``mutual_information``,
  ``aurc``, ``member_acc``, ``examples`` and ``ts_acc``, ``ts_ece``, ``ts_nll``}}, the ``ts_*`` with the run's own
  temperature (``temperature``, fitted on the in-distribution ``val`` set: a deployed model has no labels of the
  shifted data to fit one on).
"""

from __future__ import annotations

import logging
import math
import random
import statistics
import time
import zlib
from pathlib import Path

import numpy as np
import torch

from sve.data.base import SHIFT, SHIFTED
from sve.members import log_predictive, predictive
from sve.metrics import conformal
from sve.metrics.calibration import fit_temperature, temperature_metrics
from sve.metrics.collapse import collapse_warning, collapsed_members
from sve.metrics.scores import classification_metrics, ood_scores, predictive_metrics, score, uncertainty
from sve.runs.prediction_files import (
    PREDICTIONS,
    PREDICTIVE,
    members_information,
    write_predictions,
    write_predictive,
)
from sve.training.loops import limited_batches, stop_if_asked

log = logging.getLogger(__name__)

SHIFT_METRICS = ("acc", "ece", "nll", "brier")
# What the shifted record keeps of each set's scores (sve.metrics.scores.score), beside the temperature-scaled ones.
SHIFTED_METRICS = ("acc", "ece", "nll", "brier", "disagreement", "mutual_information", "aurc", "member_acc")
IN_DISTRIBUTION = "run (in-distribution validation)"  # where test/temperature comes from unless told otherwise


def seed_pass(seed: int, name: str) -> None:
    """Seeds every generator from the run's seed and the set's name (the same on every rank)."""
    value = (seed * 1_000_003 + zlib.crc32(name.encode())) % 2**32
    torch.manual_seed(value)
    np.random.seed(value)
    random.seed(value)


def shift_record(by_corruption: dict[str, dict[str, dict]], clean: dict, pooled: dict) -> dict:
    """Fig. 3's record from the per-set metrics (see the module docstring)."""
    severities = sorted({s for per in by_corruption.values() for s in per}, key=int)
    by_severity = {"0": {k: clean[k] for k in SHIFT_METRICS}}
    for s in severities:
        sets = [per[s] for per in by_corruption.values() if s in per]
        by_severity[s] = {k: statistics.fmean(m[k] for m in sets) for k in SHIFT_METRICS}
    return {"by_corruption": by_corruption, "by_severity": by_severity, "pooled": pooled}


def evaluate(
    trainer,
    module,
    datamodule,
    out_dir: Path,
    seed: int,
    save_to: str = PREDICTIONS,
    save: bool = True,
    float16_above_mb: float = 256.0,
    temperature: float | None = None,
    temperature_from: str | None = IN_DISTRIBUTION,
    refit_on: str | None = None,
) -> dict:
    """Evaluates ``module`` on every set of ``datamodule``; returns the record of the module docstring.
    Predictions go to ``out_dir/save_to/<set>.npz`` (rank 0).

    ``temperature``: the T of ``test/ts_*``, and ``temperature_from`` where it came from (``record
    ["temperature_from"]``). By default T is fitted on ``val``, the run's in-distribution validation split. A shift
    evaluation (``sve-eval`` on other data) passes the run's own T: fitting it on the shifted set's labels would
    repair the shift with labels a deployed model never has; with no T to pass (``temperature_from=None``) it
    reports no ``ts_*``. ``refit_on`` (the evaluated set's name, asked for with ``refit_temperature=true``) adds
    T refitted on the evaluated data's ``val``, as ``test/refit_temperature`` and ``test/refit_ts_*``."""
    aggregate = module.aggregate
    kept, kept_probs, paths, by_corruption, seconds, members = {}, {}, {}, {}, {}, set()
    pooled = classification_metrics(sync_on_compute=False)
    sets = list(datamodule.evaluation_sets())
    for i, name in enumerate(sets, 1):
        seed_pass(seed, name)
        loader = datamodule.evaluation_loader(name)
        if trainer.is_global_zero:  # the set whose batches Lightning's progress bar counts (without one: how many)
            log.info(
                "scoring %s (set %d of %d): %d batch(es)",
                name,
                i,
                len(sets),
                limited_batches(len(loader), trainer.limit_test_batches),
            )
        start = time.perf_counter()
        trainer.test(module, dataloaders=loader, verbose=False)
        # Lightning stops a pass at SIGTERM after any batch but its last, and forgets the signal at its next call:
        # a signal in a pass's last batch would leave the run going through every set after it.
        stop_if_asked(trainer)
        seconds[name] = time.perf_counter() - start
        found = module.predictions
        members.add(found.member_logits.shape[0])
        # The set's predictive, computed once and handed to every consumer below (files, metrics, OOD scores).
        probs = predictive(found.member_logits, aggregate)
        if save:
            paths[name] = f"{save_to}/{name}.npz"
            if trainer.is_global_zero:
                write_predictions(Path(out_dir) / paths[name], found, aggregate, float16_above_mb)
        if name != "val" and trainer.is_global_zero:  # beside save_to: predictive/ or evaluations/<name>/predictive/
            write_predictive(
                Path(out_dir) / Path(save_to).parent / PREDICTIVE / f"{name}.npz",
                name,
                probs,
                found.labels,
                found.index,
                members_information(found.member_logits) if name == "test" else None,
            )
        if name.startswith(f"{SHIFT}/"):  # scored now and let go: 95 sets of CIFAR-100-C need not fit at once
            _, corruption, severity = name.split("/")
            metrics = predictive_metrics(probs, found.labels)
            by_corruption.setdefault(corruption, {})[severity] = {k: metrics[k] for k in SHIFT_METRICS}
            pooled.update(probs, found.labels)
        else:
            kept[name] = found
            kept_probs[name] = probs
    if len(members) != 1:
        raise RuntimeError(f"the evaluation sets were predicted by different numbers of members: {sorted(members)}")

    test = score(kept["test"].member_logits, kept["test"].labels, aggregate, probs=kept_probs["test"])
    reliability, risk_coverage = test.pop("reliability"), test.pop("risk_coverage")
    metrics = {f"test/{k}": v for k, v in test.items()}
    val = kept["val"]
    metrics.update({f"val/{k}": v for k, v in predictive_metrics(kept_probs["val"], val.labels).items()})
    # The temperature is fitted on log-probabilities computed as such (not the log of the probabilities, which
    # loses the digits of confident predictions).
    test_log_probs = log_predictive(kept["test"].member_logits, aggregate)
    fitted = lambda: fit_temperature(log_predictive(val.member_logits, aggregate), val.labels)  # noqa: E731
    if temperature is None and temperature_from == IN_DISTRIBUTION:
        temperature = fitted()  # this is the run's own data: its val split is the in-distribution one
    if temperature is not None:
        scaled = temperature_metrics(test_log_probs, kept["test"].labels, temperature)
        metrics.update({f"test/{k}": v for k, v in scaled.items()})
    if refit_on is not None:  # asked for: labels of the shifted set that a deployed model would not have
        scaled = temperature_metrics(test_log_probs, kept["test"].labels, fitted())
        metrics.update({f"test/refit_{k}": v for k, v in scaled.items()})
    calibration_set, test_set = (
        (kept_probs[name], kept[name].labels, uncertainty(kept[name].member_logits).mutual_information)
        for name in ("val", "test")
    )
    sets = conformal.record(calibration_set, test_set, "val")
    if "ood" in kept:
        detection = ood_scores(
            kept["test"].member_logits, kept["ood"].member_logits, aggregate, kept_probs["test"], kept_probs["ood"]
        )
        metrics.update({f"test/{k}": v for k, v in detection.items()})
    collapsed = collapsed_members(kept["test"].member_logits)
    metrics["test/collapsed_members"] = collapsed
    if collapsed and trainer.is_global_zero:
        log.warning(collapse_warning(collapsed, kept["test"].member_logits.shape[0], "test example", "method.lr"))
    metrics["test/examples"] = len(kept["test"].labels)
    metrics["test/seconds"] = seconds["test"]
    check_finite(metrics)

    record = {
        "num_members": members.pop(),
        "metrics": metrics,
        "temperature_from": temperature_from if temperature is not None else None,
        "reliability": {"test": reliability},
        "risk_coverage": {"test": risk_coverage},
        "conformal": sets,
    }
    if refit_on is not None:
        record["refit_temperature_from"] = f"refit on {refit_on} (validation labels of the evaluated data)"
    if save:
        record["predictions"] = paths
    if by_corruption:
        pooled = {k: float(v) for k, v in pooled.compute().items()}
        record["shift"] = shift_record(by_corruption, test, pooled)
    shifted = [name for name in kept if name.startswith(f"{SHIFTED}/")]
    if shifted:
        record["shifted"] = shifted_record(
            {"test": kept["test"], **{n: kept[n] for n in shifted}}, aggregate, temperature, temperature_from
        )
    for logger in trainer.loggers:
        logger.log_metrics({k: v for k, v in metrics.items() if isinstance(v, float)}, step=trainer.global_step)
        logger.save()
    return record


def shifted_record(sets: dict, aggregate: str, temperature: float | None, temperature_from: str | None) -> dict:
    """The ``shifted`` record (module docstring) of ``sets`` {"test" or ``shifted/<name>``: predictions}; no
    ``ts_*`` without a temperature."""
    out = {}
    for name, found in sets.items():
        scores = score(found.member_logits, found.labels, aggregate)
        out[name.removeprefix(f"{SHIFTED}/")] = {k: scores[k] for k in SHIFTED_METRICS}
        if temperature is not None:
            log_probs = log_predictive(found.member_logits, aggregate)
            scaled = temperature_metrics(log_probs, found.labels, temperature)
            out[name.removeprefix(f"{SHIFTED}/")].update({k: v for k, v in scaled.items() if k != "temperature"})
        out[name.removeprefix(f"{SHIFTED}/")]["examples"] = len(found.labels)
    fitted_on = temperature_from if temperature is not None else None
    return {"temperature": temperature, "temperature_fitted_on": fitted_on, "sets": out}


def check_finite(metrics: dict) -> None:
    bad = [k for k, v in metrics.items() if not all(map(math.isfinite, v if isinstance(v, list) else [v]))]
    if bad:
        raise FloatingPointError(
            f"non-finite test metrics {bad}: { ({k: metrics[k] for k in bad}) }; results.json is not written"
        )
