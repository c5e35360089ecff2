"""Temperature scaling (Guo et al., 2017, https://arxiv.org/abs/1706.04599), an extra column beyond the paper.

One temperature T > 0 for the whole model, fitted on the validation split by minimising the NLL of

    p_T = softmax(log p / T),

where ``log p`` is the log of the ensemble predictive (``sve.members.log_predictive``), so the scaled model is
the run's own predictive with its confidence sharpened (T < 1) or softened (T > 1). Argmax is unchanged, so
accuracy is too (up to ties). The NLL is convex in 1/T (a log-sum-exp of a linear function of 1/T minus a
linear term), hence unimodal in log T, and a bounded Brent search over log T finds its minimum.
"""

from __future__ import annotations

import math

import torch
from scipy.optimize import minimize_scalar
from torch import Tensor

from sve.metrics.scores import predictive_metrics

# T is searched in [1/100, 100]: wider than any model needs (Guo et al. report 1 to 3); a value on an edge
# means the validation set is degenerate (e.g. all correct with confidence 1).
LOG_T_BOUNDS = (-math.log(100), math.log(100))
TEMPERATURE_METRICS = ("acc", "ece", "nll")  # ts_brier would be one more column nobody asked for


def scaled_log_probs(log_probs: Tensor, temperature: float) -> Tensor:
    """log softmax(log p / T), (N, C), float64."""
    return (log_probs.double() / temperature).log_softmax(-1)


def nll(log_probs: Tensor, labels: Tensor, temperature: float) -> float:
    """Mean negative log-likelihood (nats) of the labels under softmax(log p / T)."""
    return float(-scaled_log_probs(log_probs, temperature).gather(-1, labels.long()[:, None]).mean())


def fit_temperature(log_probs: Tensor, labels: Tensor) -> float:
    """The T in ``LOG_T_BOUNDS`` that minimises the NLL of ``labels`` under softmax(log_probs / T)."""
    log_probs, labels = log_probs.double(), labels.long()
    if not len(labels):
        raise ValueError("temperature scaling needs at least one validation example")
    found = minimize_scalar(
        lambda log_t: nll(log_probs, labels, math.exp(log_t)),
        bounds=LOG_T_BOUNDS,
        method="bounded",
        options={"xatol": 1e-7},
    )
    return math.exp(found.x)


def temperature_scaled(log_probs: Tensor, temperature: float) -> Tensor:
    """Calibrated probabilities (N, C)."""
    return torch.exp(scaled_log_probs(log_probs, temperature))


def temperature_metrics(log_probs: Tensor, labels: Tensor, temperature: float, n_bins: int = 15) -> dict[str, float]:
    """``temperature`` and ``ts_acc``, ``ts_ece``, ``ts_nll`` of ``log_probs`` (N, C) scaled by it (results.json's)."""
    scaled = predictive_metrics(temperature_scaled(log_probs, temperature), labels, n_bins)
    return {"temperature": temperature, **{f"ts_{k}": scaled[k] for k in TEMPERATURE_METRICS}}
