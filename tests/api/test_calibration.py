"""``Ensemble.calibrate``: the fitted temperature minimises the held-out NLL (against a dense grid computed with
numpy), ``predict`` and ``evaluate`` use it under the names a run's results.json gives them, and it travels
through the adapter files; a file written before calibration existed loads uncalibrated."""

import json

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import sve
from sve.errors import InputError
from sve.metrics.scores import UNITS

torch.set_num_threads(1)


def base() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))


def data(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()  # 3 classes, learnable from the inputs


def overconfident():
    """An ensemble trained hard on 24 examples: confident beyond its accuracy on new ones (a temperature > 1)."""
    x, y = data(24, 1)
    ensemble = sve.wrap(base(), "sve", ensemble_size=3, num_classes=3, example_input=x[:1], sigma_init=0.1)
    optimizer = torch.optim.AdamW(ensemble.trainable_parameters(), lr=0.05)
    for _ in range(60):
        loss = ensemble.loss(ensemble(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return ensemble


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def numpy_log_predictive(ensemble, x) -> np.ndarray:
    """log of the mean member softmax (Eq. 2), in numpy float64, from the member logits."""
    ensemble.eval()
    with torch.no_grad():
        z = ensemble(x).double().numpy()
    members = log_softmax(z)
    top = members.max(0)
    return top + np.log(np.exp(members - top).mean(0))


def numpy_nll(log_p: np.ndarray, labels: np.ndarray, t: float) -> float:
    return float(-log_softmax(log_p / t)[np.arange(len(labels)), labels].mean())


def test_the_fitted_temperature_minimises_the_held_out_nll_and_predict_and_evaluate_use_it():
    ensemble = overconfident()
    held_x, held_y = data(200, 2)
    record = ensemble.calibrate(DataLoader(TensorDataset(held_x, held_y), batch_size=64), progress=False)
    t = record["temperature"]
    assert record == {"method": "temperature", "temperature": t, "aggregate": "probs", "examples": 200}

    log_p, labels = numpy_log_predictive(ensemble, held_x), held_y.numpy()
    grid = np.exp(np.linspace(np.log(0.05), np.log(20), 4001))  # steps of 0.15% in T
    nlls = np.array([numpy_nll(log_p, labels, s) for s in grid])
    assert numpy_nll(log_p, labels, t) <= nlls.min() + 1e-9
    assert abs(np.log(t) - np.log(grid[nlls.argmin()])) < 2e-3
    assert t > 1.2  # the ensemble was overconfident: the fit softens it

    test_x, test_y = data(100, 3)
    test_log_p = numpy_log_predictive(ensemble, test_x)
    calibrated = np.exp(log_softmax(test_log_p / t))
    prediction = ensemble.predict(test_x)  # with gradients: the factored path, float32 logits that differ by 1e-7
    np.testing.assert_allclose(prediction.probs.detach().numpy(), calibrated, rtol=0, atol=1e-6)
    assert torch.equal(prediction.label, prediction.probs.argmax(-1))
    np.testing.assert_allclose(prediction.confidence.detach().numpy(), calibrated.max(-1), atol=1e-6)
    np.testing.assert_allclose(
        prediction.entropy.detach().numpy(), -(calibrated * np.log(calibrated)).sum(-1), atol=1e-6
    )
    raw = ensemble.predict(test_x, calibrated=False)
    np.testing.assert_allclose(raw.probs.detach().numpy(), np.exp(test_log_p), atol=1e-6)
    assert torch.equal(raw.mutual_information, prediction.mutual_information)  # the members are not rescaled
    loader = DataLoader(TensorDataset(test_x, test_y), batch_size=32)
    np.testing.assert_allclose(ensemble.predict_loader(loader, progress=False).probs.numpy(), calibrated, atol=1e-6)

    metrics = ensemble.evaluate(loader, progress=False)
    y = test_y.numpy()
    assert metrics["nll"] == pytest.approx(numpy_nll(test_log_p, y, 1.0), abs=1e-6)  # batches of 32, not 100
    assert metrics["ts_nll"] == pytest.approx(numpy_nll(test_log_p, y, t), abs=1e-6)
    assert metrics["ts_acc"] == pytest.approx(np.mean(calibrated.argmax(-1) == y))
    assert metrics["temperature"] == t
    # The names of a run's results.json (test/temperature, test/ts_*), whose units the tables read.
    assert {"temperature", "ts_acc", "ts_ece", "ts_nll"} <= set(metrics) and all(
        k in UNITS for k in metrics if k.startswith("ts_")
    )


def test_a_calibrated_ensemble_reloads_with_its_temperature_and_predicts_identically(tmp_path):
    ensemble = overconfident()
    held_x, held_y = data(200, 2)
    ensemble.calibrate([(held_x, held_y)], progress=False)
    ensemble.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "adapter_config.json").read_text())["calibration"] == ensemble.calibration
    loaded = sve.from_pretrained(base(), tmp_path)
    assert loaded.calibration == ensemble.calibration
    x = data(50, 4)[0]
    assert torch.equal(loaded.predict(x).probs, ensemble.predict(x).probs)
    assert torch.equal(loaded.predict(x, calibrated=False).probs, ensemble.predict(x, calibrated=False).probs)
    assert not torch.equal(loaded.predict(x).probs, loaded.predict(x, calibrated=False).probs)


def test_an_adapter_written_before_calibration_loads_uncalibrated(tmp_path):
    ensemble = overconfident()
    ensemble.save_pretrained(tmp_path)
    path = tmp_path / "adapter_config.json"
    config = json.loads(path.read_text())
    assert config.pop("calibration") is None
    path.write_text(json.dumps(config))  # as the files of an SVE before calibration: no such key
    loaded = sve.from_pretrained(base(), tmp_path)
    assert loaded.calibration is None
    x, y = data(50, 4)
    assert torch.equal(loaded.predict(x).probs, ensemble.predict(x, calibrated=False).probs)
    assert not any(k.startswith("ts_") or k == "temperature" for k in loaded.evaluate([(x, y)], progress=False))
    with pytest.raises(InputError, match="not calibrated"):
        loaded.predict(x, calibrated=True)

    config["calibration"] = {"method": "temperature", "temperature": -1.0, "aggregate": "probs"}
    path.write_text(json.dumps(config))
    with pytest.raises(InputError, match="calibration recorded .* is not valid"):
        sve.from_pretrained(base(), tmp_path)


def test_calibration_refuses_what_it_cannot_do():
    ensemble = overconfident()
    x, y = data(40, 2)
    with pytest.raises(InputError, match="vector.* is not offered"):
        ensemble.calibrate([(x, y)], method="vector", progress=False)
    with pytest.raises(InputError, match="calibrate needs labelled batches"):
        ensemble.calibrate([x], progress=False)
    ensemble.calibrate([(x, y)], progress=False)
    # Labels that are always the least likely class: the higher T, the likelier each (up to 1/3), so the fit ends
    # at the edge of the search, as for labels unrelated to the inputs.
    least_likely = ensemble.predict(x, calibrated=False).probs.argmin(-1)
    with pytest.warns(UserWarning, match="at the edge of the search"):
        assert ensemble.calibrate([(x, least_likely)], progress=False)["temperature"] > 99
    ensemble.calibrate([(x, y)], progress=False)
    with pytest.warns(UserWarning, match="fitted for aggregate='probs'"):  # another predictive: given raw
        raw = ensemble.predict(x, aggregate="logits")
    assert torch.equal(raw.probs, ensemble.predict(x, aggregate="logits", calibrated=False).probs)
    with pytest.raises(InputError, match="calibrate again with aggregate='logits'"):
        ensemble.predict(x, aggregate="logits", calibrated=True)
