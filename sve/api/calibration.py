"""An ensemble's calibration on held-out data: the fitted temperature, its record in the adapter files, and the
calibrated predictions and metrics it gives. The fit is ``sve.metrics.calibration``'s, the one every run of
``train.py`` reports (``test/temperature``, ``test/ts_*``).

Temperature scaling only. Vector scaling (a scale and a bias per class, Guo et al., 2017) was left out: it has
2C parameters to fit on a split that is often small, it can change the predicted class (so the accuracy), and
Guo et al. found it no better than one temperature on most of their data sets; the runs report temperature
scaling alone, and the library keeps the same numbers.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import replace

from torch import Tensor

from sve.errors import InputError
from sve.members import log_predictive
from sve.metrics.calibration import LOG_T_BOUNDS, fit_temperature, temperature_metrics, temperature_scaled
from sve.metrics.scores import Prediction, entropy, uncertainty

METHODS = ("temperature",)


def fit(member_logits: Tensor, labels: Tensor, aggregate: str, method: str = "temperature") -> dict:
    """The calibration record of member logits (M, N, C) and their labels: ``method``, ``temperature`` (T of
    softmax(log p / T), p the ``aggregate`` predictive), ``aggregate`` and the ``examples`` it was fitted on."""
    if method not in METHODS:
        raise InputError(
            f"calibrate(method={method!r}) is not offered; methods: {list(METHODS)} (why not vector scaling: "
            "docs/datasets-and-backbones.md, 'Calibration')"
        )
    temperature = fit_temperature(log_predictive(member_logits, aggregate), labels)
    if abs(math.log(temperature)) > max(abs(b) for b in LOG_T_BOUNDS) - 1e-3:
        warnings.warn(
            f"the fitted temperature {temperature:.3g} is at the edge of the search ({math.exp(LOG_T_BOUNDS[0]):g} "
            f"to {math.exp(LOG_T_BOUNDS[1]):g}): the held-out labels look unrelated to the predictions (T "
            "high: every prediction flattened to uniform) or every example is right with confidence 1 (T low); "
            "calibrate on a held-out split of the task's own data",
            stacklevel=3,
        )
    return {"method": method, "temperature": temperature, "aggregate": aggregate, "examples": int(len(labels))}


def read(record, directory) -> dict | None:
    """The calibration recorded in an adapter config (``record``), checked; None for an ensemble saved before
    it was calibrated, or by an SVE without calibration (the files have no record: it loads uncalibrated)."""
    if record is None:
        return None
    record = record if isinstance(record, dict) else {"record": record}
    temperature = record.get("temperature")
    if (
        record.get("method") not in METHODS
        or isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not (math.isfinite(temperature) and temperature > 0)
        or record.get("aggregate") not in ("probs", "logits")
    ):
        raise InputError(
            f"the calibration recorded in {directory} is not valid ({record!r}); expected a method of "
            f"{list(METHODS)}, a positive finite temperature and the aggregate it was fitted for"
        )
    return {**record, "temperature": float(temperature)}


def temperature_for(calibration: dict | None, aggregate: str, calibrated: bool | None) -> float | None:
    """The temperature to apply to the ``aggregate`` predictive, or None: ``calibrated=False`` asks for the raw
    predictive, True for the calibrated one (an error without a calibration for this aggregate), None for the
    calibrated one where there is one."""
    if calibrated is False:
        return None
    if calibration is None:
        if calibrated:
            raise InputError(
                "calibrated=True, but the ensemble is not calibrated: call ensemble.calibrate(loader) on "
                "held-out data first"
            )
        return None
    if calibration["aggregate"] != aggregate:
        message = (
            f"the ensemble's temperature was fitted for aggregate={calibration['aggregate']!r}, not "
            f"{aggregate!r}: calibrate again with aggregate={aggregate!r}"
        )
        if calibrated:
            raise InputError(message)
        warnings.warn(f"{message}; the {aggregate!r} predictive is given uncalibrated", stacklevel=3)
        return None
    return calibration["temperature"]


def prediction(member_logits: Tensor, aggregate: str, temperature: float | None) -> Prediction:
    """``uncertainty``'s prediction, its predictive (``probs``, ``label``, ``confidence``, ``entropy``)
    temperature scaled when ``temperature`` is given. The members are not rescaled (the temperature is the
    predictive's), so ``member_probs``, ``expected_entropy``, ``mutual_information`` and ``disagreement`` stay
    theirs, and entropy = expected entropy + mutual information holds for the raw predictive only."""
    raw = uncertainty(member_logits, aggregate)
    if temperature is None:
        return raw
    probs = temperature_scaled(log_predictive(member_logits, aggregate), temperature)
    confidence, label = probs.max(-1)
    return replace(raw, probs=probs, label=label, confidence=confidence, entropy=entropy(probs))


def metrics(member_logits: Tensor, labels: Tensor, aggregate: str, temperature: float, n_bins: int = 15) -> dict:
    """``temperature``, ``ts_acc``, ``ts_ece``, ``ts_nll``, named as in a run's results.json (``test/ts_*``)."""
    return temperature_metrics(log_predictive(member_logits, aggregate), labels.long(), temperature, n_bins)
