"""The evaluator against an independent numpy reference (Appendix E), including edge cases."""

import numpy as np
import pytest
import torch

from sve.members import predictive
from sve.metrics import NLL_EPS, classification_metrics


def reference(probs: np.ndarray, labels: np.ndarray, n_bins: int = 15) -> dict:
    """Straight from Eq. 8-13 with explicit loops; bins ((m-1)/n, m/n], 0 in the first bin."""
    n = len(labels)
    pred = np.array([int(np.flatnonzero(p == p.max())[0]) for p in probs])  # first maximum
    conf = probs.max(1)
    correct = (pred == labels).astype(float)
    ece = 0.0
    for m in range(1, n_bins + 1):
        lo, hi = (m - 1) / n_bins, m / n_bins
        in_bin = [(lo < c <= hi) or (m == 1 and c == 0) for c in conf]
        if any(in_bin):
            idx = np.flatnonzero(in_bin)
            ece += len(idx) / n * abs(correct[idx].mean() - conf[idx].mean())
    onehot = np.eye(probs.shape[1])[labels]
    return {
        "acc": correct.mean(),
        "ece": ece,
        "nll": float(np.mean([-np.log(max(probs[i, labels[i]], NLL_EPS)) for i in range(n)])),
        "brier": float(np.mean(((probs - onehot) ** 2).sum(1))),
    }


def compute(probs, labels, chunks=1):
    metrics = classification_metrics()
    for p, y in zip(np.array_split(probs, chunks), np.array_split(labels, chunks)):
        metrics.update(torch.from_numpy(p), torch.from_numpy(y))
    return {k: float(v) for k, v in metrics.compute().items()}


def check(probs, labels, chunks=1):
    got, ref = compute(probs, labels, chunks), reference(probs, labels)
    for key in ("acc", "ece", "nll", "brier"):
        assert got[key] == pytest.approx(ref[key], abs=1e-12), key


@pytest.mark.parametrize("chunks", [1, 7])
def test_random_predictions(chunks):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(500, 10)) * 3
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    check(probs, rng.integers(0, 10, 500), chunks)


def test_confidence_exactly_one_and_all_correct():
    probs = np.eye(4)[[0, 1, 2, 3, 0]].astype(float)
    labels = np.array([0, 1, 2, 3, 0])
    check(probs, labels)
    got = compute(probs, labels)
    assert got["acc"] == 1 and got["ece"] == 0 and got["brier"] == 0 and got["nll"] == pytest.approx(0)


def test_all_wrong_with_certainty():
    probs = np.eye(3)[[1, 2, 0]].astype(float)
    labels = np.array([0, 1, 2])
    check(probs, labels)
    got = compute(probs, labels)
    assert got["acc"] == 0 and got["ece"] == pytest.approx(1) and got["brier"] == pytest.approx(2)
    assert got["nll"] == pytest.approx(-np.log(NLL_EPS))


def test_ties_predict_the_first_class():
    probs = np.array([[0.4, 0.4, 0.2], [0.25, 0.25, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    labels = np.array([0, 1, 1])
    check(probs, labels)
    assert compute(probs, labels)["acc"] == pytest.approx(1 / 3)


def test_hand_computed_ece():
    # Two bins used: conf 0.9 (right) and 0.9 (wrong) -> |0.5-0.9| weight 2/3; conf 0.6 right -> |1-0.6| 1/3
    probs = np.array([[0.9, 0.1], [0.1, 0.9], [0.6, 0.4]])
    labels = np.array([0, 0, 0])
    assert compute(probs, labels)["ece"] == pytest.approx(2 / 3 * 0.4 + 1 / 3 * 0.4)


def test_predictive_mean_of_probabilities_vs_logits():
    logits = torch.tensor([[[4.0, 0.0]], [[0.0, 2.0]]])  # (M=2, B=1, C=2)
    p = predictive(logits, "probs")
    expected = (torch.softmax(logits[0], -1) + torch.softmax(logits[1], -1)) / 2
    torch.testing.assert_close(p, expected.double())
    torch.testing.assert_close(predictive(logits, "logits"), torch.softmax(logits.mean(0), -1).double())
    assert p.dtype == torch.float64
    with pytest.raises(ValueError, match="probs"):
        predictive(logits, "median")
