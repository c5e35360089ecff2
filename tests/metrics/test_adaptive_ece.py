"""The equal-mass (adaptive) ECE and the equal-width ECE against torch-uncertainty's, and the adaptive ECE's
tie rule (the same number in every order of the examples)."""

import itertools

import numpy as np
import pytest
import torch

from sve.metrics.scores import adaptive_ece, predictive_metrics


def random_predictions(seed: int, n: int = 301):
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.dirichlet(np.full(5, 0.7), n)), torch.from_numpy(rng.integers(0, 5, n))


@pytest.mark.parametrize("n_bins", [15, 7])
def test_adaptive_ece_matches_torch_uncertainty(n_bins):
    from torch_uncertainty.metrics import AdaptiveCalibrationError

    probs, labels = random_predictions(n_bins)  # distinct confidences: its sort is ours; 301 is no multiple of a bin
    theirs = AdaptiveCalibrationError(task="multiclass", num_classes=5, num_bins=n_bins)
    theirs.update(probs, labels)
    assert adaptive_ece(probs, labels, n_bins) == pytest.approx(float(theirs.compute()), abs=1e-6)


def test_equal_width_ece_matches_torch_uncertainty():
    from torch_uncertainty.metrics import CalibrationError

    probs, labels = random_predictions(3)
    theirs = CalibrationError(task="multiclass", num_classes=5, num_bins=15)
    theirs.update(probs, labels)
    assert predictive_metrics(probs, labels)["ece"] == pytest.approx(float(theirs.compute()), abs=1e-6)


def test_a_tie_cut_by_a_bin_edge_counts_its_groups_accuracy_whatever_the_order():
    confidence = [0.9, 0.7, 0.7, 0.7, 0.6]  # two bins of 3 and 2 cut the tie of three at 0.7
    correct = [1, 1, 0, 0, 1]
    probs = torch.tensor([[c, 1 - c] for c in confidence], dtype=torch.float64)
    labels = torch.tensor([0 if ok else 1 for ok in correct])
    # Sorted ascending: 0.6 right, the tie at its rate 1/3 each, 0.9 right.
    expected, conf = [1, 1 / 3, 1 / 3, 1 / 3, 1], [0.6, 0.7, 0.7, 0.7, 0.9]
    by_hand = (abs(sum(expected[:3]) - sum(conf[:3])) + abs(sum(expected[3:]) - sum(conf[3:]))) / 5
    for order in itertools.permutations(range(5)):
        order = list(order)
        assert adaptive_ece(probs[order], labels[order], 2) == pytest.approx(by_hand, abs=1e-12)
