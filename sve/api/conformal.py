"""An ensemble's conformal prediction sets: the threshold ``Ensemble.conformalize`` fits on held-out data, its record
in the adapter files, the sets ``predict`` gives and the conformal metrics of ``evaluate``. The scores, the
finite-sample threshold and the metrics are ``sve.metrics.conformal``'s, the ones every run reports (results.json's
``conformal``, calibrated on ``val``).

The sets are of the predictive the threshold was fitted on (the ``aggregate`` and the temperature in the record),
whatever ``predict`` is asked for: a threshold fitted on the raw predictive guarantees nothing on a temperature
scaled one, so calibrating after conformalizing leaves the sets as they were (conformalize again to use it).

The calibration examples are kept in memory (not in the files) so that ``evaluate`` reports every score at every
level, and so that it can tell a test set that holds calibration examples: an example is known by its member
logits rounded to 4 decimals (a deterministic method gives the same input the same logits; a method that samples
its members, MC dropout say, is not checked this way).
"""

from __future__ import annotations

import hashlib
import math
import warnings

from torch import Tensor

from sve.errors import InputError
from sve.metrics import conformal
from sve.metrics.scores import Prediction


def fit(prediction: Prediction, labels: Tensor, alpha: float, score: str, aggregate: str, temperature, options) -> dict:
    """The record of a threshold fitted on ``prediction`` (the calibration set's) and its ``labels``."""
    score, options = conformal.score_name(score), {**conformal.DEFAULTS, **options}
    unknown = sorted(set(options) - set(conformal.DEFAULTS))
    if unknown:
        raise InputError(f"conformalize got unknown option(s) {unknown}; options: {sorted(conformal.DEFAULTS)}")
    scores = conformal.label_scores(prediction.probs, labels, score, prediction.mutual_information, **options)
    q = conformal.threshold(scores, alpha)
    if math.isinf(q):
        warnings.warn(
            f"{len(labels)} calibration examples are too few for alpha={alpha}: ceil((n + 1)(1 - alpha)) > n, so "
            "every set holds every class; conformalize on at least 1 / alpha - 1 examples",
            stacklevel=3,
        )
    return {
        "score": score,
        "alpha": float(alpha),
        "threshold": conformal.json_threshold(q),
        "options": options,
        "aggregate": aggregate,
        "temperature": temperature,
        "examples": int(len(labels)),
    }


def read(record, directory) -> dict | None:
    """The conformal record of an adapter config, checked; None when there is none (files of an SVE without it)."""
    if record is None:
        return None
    try:
        conformal.score_name(record["score"])
        valid = (
            0 < record["alpha"] < 1
            and (record["threshold"] is None or math.isfinite(record["threshold"]))
            and record["aggregate"] in ("probs", "logits")
            and (record["temperature"] is None or record["temperature"] > 0)
            and set(record["options"]) == set(conformal.DEFAULTS)
        )
    except (KeyError, TypeError, ValueError):
        valid = False
    if not valid:
        raise InputError(
            f"the conformal record in {directory} is not valid ({record!r}); expected a score of "
            f"{list(conformal.SCORES)}, an alpha in (0, 1), a finite threshold or null, an aggregate and the "
            "temperature it was fitted with (null: none)"
        )
    return record


def threshold(record: dict) -> float:
    return math.inf if record["threshold"] is None else record["threshold"]


def sets(record: dict, prediction: Prediction) -> Tensor:
    """The sets (B, C) of ``prediction``, which must be of the record's predictive (module docstring)."""
    return conformal.prediction_sets(
        prediction.probs, threshold(record), record["score"], prediction.mutual_information, **record["options"]
    )


def example_keys(member_logits: Tensor) -> list[bytes]:
    """A key per example (module docstring): a hash of its member logits rounded to 4 decimals."""
    rounded = member_logits.detach().double().round(decimals=4).transpose(0, 1).contiguous().numpy()
    return [hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in rounded]


def evaluation(record: dict, held: dict | None, prediction: Prediction, labels: Tensor, keys: list[bytes]) -> dict:
    """``evaluate``'s ``conformal``: ``fitted``, the set metrics at the fitted threshold; with the calibration
    examples in memory (``held``: probs, labels, mutual information, keys) also every score at every level
    (``sve.metrics.conformal.record``) and ``calibration_overlap``: the test examples that are calibration ones
    (a warning names their count: the guarantee needs them apart)."""
    out = {"fitted": {**record, **conformal.set_metrics(sets(record, prediction), labels)}}
    if held is None:
        return out
    overlap = len(set(keys) & held["keys"])
    if overlap:
        warnings.warn(
            f"{overlap} of the {len(labels)} evaluated examples are calibration examples of conformalize: the "
            "coverage guarantee holds on examples apart from them; evaluate on a split that conformalize did not see",
            stacklevel=3,
        )
    alphas = sorted({*conformal.ALPHAS, record["alpha"]}, reverse=True)
    grid = conformal.record(
        (held["probs"], held["labels"], held["mutual_information"]),
        (prediction.probs, labels, prediction.mutual_information),
        "conformalize's loader",
        "evaluate's loader",
        alphas=alphas,
        **record["options"],
    )
    return {**out, **grid, "calibration_overlap": overlap}
