"""Selective prediction: the risk-coverage curve of a predictive and its area (AURC).

A selective classifier answers only the examples it is most confident of. Keeping the k most confident of N
examples (coverage c = k/N), its risk is the error rate of the kept examples. The curve holds the risk at every
coverage 1/N, 2/N, ..., N/N; at N/N it is the error rate of the whole set (1 - accuracy).

Ties: examples of equal confidence cannot be ordered by it, and a sort would order them by their position in the
set, so the curve would depend on the order of the data. Here a coverage that keeps part of a tie group keeps
each of its examples with the same share: the group's errors are spread evenly over its members (each counts
the group's error rate), so the risk is the expected risk over every order of the tied examples; it is exact
(and the same) wherever a coverage keeps whole groups, and it does not depend on the data's order.

AURC (Geifman et al., 2019, "Bias-reduced uncertainty estimation for deep neural classifiers") is the mean of
the risks at the N coverages k/N, k = 1..N: lower is better, in [0, 1]. torch-uncertainty's ``AURC`` integrates
the same points with the trapezoid rule over [1/N, 1] and rescales by 1 / (1 - 1/N), which weighs the two end
points by half: it is this AURC + (mean r - (r_1 + r_N) / 2) / (N - 1), the same to O(1/N); it orders ties as
its sort happens to.

PRR, the prediction-rejection ratio (Malinin et al., 2017; LM-Polygraph's "prr"), reads the same curve from the
other side: with an uncertainty u (higher: less likely right), its area A = 1 - AURC(-u) (the kept accuracy
averaged over the N coverages) is placed between random rejection, whose expected area is the accuracy a, and the
oracle that keeps every right prediction first: PRR = (A - a) / (A_oracle - a), 1 for a perfect ranking, 0 for
one no better than chance, negative for a worse one (undefined, NaN, when every prediction is right or every one
wrong).

AUGRC (Traub et al., 2024, "Overcoming common flaws in the evaluation of selective classification systems"): the
mean over k = 1..N of the generalized risk at coverage k/N, the errors among the k kept examples divided by N (not
by k): the share of all examples that are accepted and wrong. It weighs the low coverages, where AURC's risk rests
on few examples, by their coverage. torch-uncertainty's ``AUGRC`` relates to it as its AURC to ours (above).
"""

from __future__ import annotations

import torch
from torch import Tensor

CURVE_POINTS = 100  # points of the curve recorded in results.json (``curve_record``)


def risk_coverage(confidence: Tensor, correct: Tensor) -> tuple[Tensor, Tensor]:
    """(coverage, risk), both (N,) in float64: ``coverage[k-1] = k/N``, ``risk[k-1]`` the error rate of the k
    most confident examples, ties shared evenly (module docstring). ``confidence`` (N,) is any score, higher
    meaning more confident (the maximum predictive probability); ``correct`` (N,) whether each prediction is
    right."""
    confidence = confidence.detach().double().flatten()
    errors = (~correct.detach().bool().flatten()).double()
    if confidence.numel() == 0 or confidence.shape != errors.shape:
        raise ValueError(
            f"risk_coverage needs one confidence per prediction and at least one: got {tuple(confidence.shape)} "
            f"confidences and {tuple(errors.shape)} correctness flags"
        )
    if torch.isnan(confidence).any():  # a NaN has no place in the order: it would be kept first or last by chance
        raise FloatingPointError(f"risk_coverage got {int(torch.isnan(confidence).sum())} NaN confidence(s)")
    order = torch.argsort(confidence, descending=True, stable=True)
    _, group, size = torch.unique_consecutive(confidence[order], return_inverse=True, return_counts=True)
    group_errors = torch.zeros(len(size), dtype=torch.float64).index_add_(0, group, errors[order])
    kept_errors = (group_errors / size)[group].cumsum(0)  # each example counts its tie group's error rate
    kept = torch.arange(1, len(errors) + 1, dtype=torch.float64)
    return kept / len(errors), kept_errors / kept


def aurc(confidence: Tensor, correct: Tensor) -> float:
    """The area under the risk-coverage curve: the mean of its N risks (module docstring)."""
    return float(risk_coverage(confidence, correct)[1].mean())


def prediction_rejection_ratio(uncertainty: Tensor, correct: Tensor) -> float:
    """PRR (module docstring) of ``uncertainty`` (N,) for ``correct`` (N,): ties shared as in ``risk_coverage``."""
    correct = correct.detach().bool().flatten()
    area = 1 - aurc(-uncertainty, correct)
    oracle = 1 - aurc(correct.double(), correct)
    chance = float(correct.double().mean())
    return (area - chance) / (oracle - chance) if oracle - chance > 1e-12 else float("nan")


def curve_record(coverage: Tensor, risk: Tensor, points: int = CURVE_POINTS) -> dict[str, list[float]]:
    """At most ``points`` points of the curve, as results.json keeps it: the coverages ceil(j N / points) / N
    for j = 1..points (every coverage where N <= points), each with its exact risk; the last is coverage 1."""
    n = len(coverage)
    index = torch.unique(torch.ceil(torch.arange(1, points + 1, dtype=torch.float64) * n / points).long() - 1)
    return {"coverage": coverage[index].tolist(), "risk": risk[index].tolist()}


def selective_scores(probs: Tensor, labels: Tensor) -> dict:
    """``aurc``, ``augrc`` and the ``risk_coverage`` record (``curve_record``) of a predictive (N, C) on its labels, by
    the maximum probability; the predicted class is the first maximum, as the accuracy's."""
    confidence, predicted = probs.double().max(-1)
    coverage, risk = risk_coverage(confidence, predicted == labels.long())
    return {
        "aurc": float(risk.mean()),
        "augrc": float((risk * coverage).mean()),  # errors among the k kept / N (module docstring)
        "risk_coverage": curve_record(coverage, risk),
    }
