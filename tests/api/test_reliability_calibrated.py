"""``Ensemble.reliability_diagram`` draws the predictive ``predict`` gives: temperature scaled once ``calibrate``
has run (``calibrated=False``: the raw one), and its title says which, with T."""

import numpy as np
import pytest
import torch
from torch import nn

import sve
from sve.errors import InputError
from sve.metrics.plots import reliability_bins

torch.set_num_threads(1)


def drawn_bins(fig) -> tuple[np.ndarray, np.ndarray]:
    """The accuracy bars' left edges and heights of the diagram's top panel."""
    bars = fig.axes[0].containers[0]
    return np.array([b.get_x() for b in bars]), np.array([b.get_height() for b in bars])


def expected_bins(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    bins = reliability_bins(probs, labels)
    filled = bins["count"] > 0
    return np.flatnonzero(filled) / 15, bins["accuracy"][filled]


def test_the_diagram_of_a_calibrated_ensemble_is_of_its_calibrated_predictions():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))
    nn.init.normal_(model[2].weight, std=8.0)  # confident outputs on labels they do not predict: T far above 1
    x = torch.randn(300, 6)
    ensemble = sve.wrap(model, "sve", ensemble_size=2, example_input=x)
    # Labels the model gets right half the time, with confidence near 1: T well above 1, inside the search.
    y = torch.where(torch.rand(300) < 0.5, ensemble.predict(x).label, torch.randint(0, 3, (300,)))
    temperature = ensemble.calibrate([(x, y)], progress=False)["temperature"]
    assert temperature > 3
    calibrated = ensemble.predict(x).probs.numpy()
    raw = ensemble.predict(x, calibrated=False).probs.numpy()
    # The two predictives fill other bins: a diagram of the raw one cannot pass for the calibrated one's.
    assert not np.array_equal(expected_bins(calibrated, y.numpy())[0], expected_bins(raw, y.numpy())[0])

    for fig, probs in (
        (ensemble.reliability_diagram([(x, y)], progress=False), calibrated),
        (ensemble.reliability_diagram([(x, y)], progress=False, calibrated=True), calibrated),
        (ensemble.reliability_diagram([(x, y)], progress=False, calibrated=False), raw),
    ):
        edges, heights = expected_bins(probs, y.numpy())
        drawn_edges, drawn_heights = drawn_bins(fig)
        np.testing.assert_allclose(drawn_edges, edges, atol=1e-12)
        np.testing.assert_allclose(drawn_heights, heights, atol=1e-12)
    title = ensemble.reliability_diagram([(x, y)], title="mlp", progress=False)._suptitle.get_text()
    assert title == f"mlp: temperature-scaled predictive (T = {temperature:.3g})"
    raw_title = ensemble.reliability_diagram([(x, y)], calibrated=False, progress=False)._suptitle.get_text()
    assert raw_title == "raw predictive"


def test_an_uncalibrated_ensemble_draws_its_raw_predictive_and_refuses_calibrated_true():
    torch.manual_seed(0)
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    ensemble = sve.wrap(nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 3)), "sve", ensemble_size=2, example_input=x)
    assert ensemble.reliability_diagram([(x, y)], progress=False)._suptitle.get_text() == "raw predictive"
    with pytest.raises(InputError, match="not calibrated"):
        ensemble.reliability_diagram([(x, y)], calibrated=True, progress=False)
