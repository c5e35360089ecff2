"""Temperature scaling (sve.metrics.calibration) against numpy: it recovers a known temperature and minimises the
NLL."""

import numpy as np
import pytest
import torch

from sve.metrics.calibration import fit_temperature, temperature_scaled


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def numpy_nll(log_probs: np.ndarray, labels: np.ndarray, t: float) -> float:
    return float(-log_softmax(log_probs / t)[np.arange(len(labels)), labels].mean())


def sample(true_temperature: float, n: int = 40_000, seed: int = 0):
    """Labels drawn from softmax(z / T*): the model whose log-probabilities are log softmax(z) is calibrated
    by exactly T*."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 5)) * 3
    p = np.exp(log_softmax(z / true_temperature))
    labels = (rng.random((n, 1)) > p.cumsum(1)).sum(1)
    return log_softmax(z), labels


@pytest.mark.parametrize("true_temperature", [0.5, 1.0, 2.0])
def test_recovers_a_known_temperature(true_temperature):
    log_probs, labels = sample(true_temperature)
    fitted = fit_temperature(torch.from_numpy(log_probs), torch.from_numpy(labels))
    assert fitted == pytest.approx(true_temperature, rel=0.05)


def test_fitted_temperature_minimises_the_nll():
    log_probs, labels = sample(1.7, n=2000, seed=1)
    fitted = fit_temperature(torch.from_numpy(log_probs), torch.from_numpy(labels))
    best = numpy_nll(log_probs, labels, fitted)
    grid = np.exp(np.linspace(np.log(0.2), np.log(10), 2001))
    assert best <= min(numpy_nll(log_probs, labels, t) for t in grid) + 1e-9
    for t in (fitted * 0.999, fitted * 1.001):  # a minimum: both neighbours are worse
        assert numpy_nll(log_probs, labels, t) > best


def test_scaled_probabilities_and_unchanged_argmax():
    log_probs, labels = sample(2.0, n=500)
    scaled = temperature_scaled(torch.from_numpy(log_probs), 2.5).numpy()
    np.testing.assert_allclose(scaled, np.exp(log_softmax(log_probs / 2.5)), rtol=1e-12)
    assert (scaled.argmax(1) == log_probs.argmax(1)).all()
