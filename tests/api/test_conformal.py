"""``Ensemble.conformalize``: the threshold is the finite-sample quantile of the held-out scores (recomputed here
with numpy from the member logits), ``predict`` gives the sets it defines, ``evaluate`` reports their metrics and
refuses silence on a test set that holds calibration examples, and the threshold travels through the adapter files."""

import json
import math

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import sve
from sve.errors import InputError
from tests.api.test_calibration import base, data, overconfident

torch.set_num_threads(1)


def loader(x, y):
    return DataLoader(TensorDataset(x, y), batch_size=16)


def numpy_probs(ensemble, x) -> np.ndarray:
    ensemble.eval()
    with torch.no_grad():
        z = ensemble(x).double().numpy()
    e = np.exp(z - z.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).mean(0)  # Eq. 2: the mean member softmax


def test_the_threshold_and_sets_are_the_finite_sample_quantile_of_one_minus_p():
    ensemble = overconfident()
    x, y = data(59, 2)
    record = ensemble.conformalize(loader(x, y), alpha=0.1, progress=False)
    p = numpy_probs(ensemble, x)
    k = math.ceil(60 * 0.9)  # (n + 1)(1 - alpha) = 54 for n = 59
    expected = np.sort(1 - p[np.arange(59), y.numpy()])[k - 1]
    assert record["threshold"] == pytest.approx(expected, abs=1e-6)  # float32 logits, in other batches
    assert record | {"threshold": 0} == {
        "score": "thr",
        "alpha": 0.1,
        "threshold": 0,
        "options": {"k_reg": 1, "lam": 0.01, "beta": 0.1},
        "aggregate": "probs",
        "temperature": None,
        "examples": 59,
    }
    xt, _ = data(40, 3)
    sets = ensemble.predict(xt).sets
    np.testing.assert_array_equal(sets.numpy(), 1 - numpy_probs(ensemble, xt) <= record["threshold"])
    assert torch.equal(ensemble.predict_loader(loader(xt, torch.zeros(40)), progress=False).sets, sets)


def test_an_uncalibrated_ensemble_has_no_sets_and_unknown_options_are_refused():
    ensemble = overconfident()
    x, y = data(30, 2)
    assert ensemble.predict(x).sets is None and "conformal" not in ensemble.evaluate(loader(x, y), progress=False)
    with pytest.raises(InputError, match="unknown option"):
        ensemble.conformalize(loader(x, y), score="raps", k=2, progress=False)
    with pytest.raises(ValueError, match="not offered"):
        ensemble.conformalize(loader(x, y), score="naive", progress=False)


def test_evaluate_reports_every_score_and_names_calibration_examples_in_the_test_set():
    ensemble = overconfident()
    (x, y), (xt, yt) = data(80, 2), data(60, 3)
    ensemble.conformalize(loader(x, y), alpha=0.2, score="aps", progress=False)
    report = ensemble.evaluate(loader(xt, yt), progress=False)["conformal"]
    fitted = report["fitted"]
    covered = ensemble.predict(xt).sets[torch.arange(60), yt]
    assert fitted["coverage"] == pytest.approx(float(covered.double().mean()), abs=1e-12)
    assert set(report["by_alpha"]) == {"0.2", "0.1", "0.05"}
    assert set(report["by_alpha"]["0.1"]) == {"thr", "aps", "raps", "thr_mi"}
    assert report["by_alpha"]["0.2"]["aps"]["threshold"] == fitted["threshold"]
    assert report["calibration_overlap"] == 0
    with pytest.warns(UserWarning, match="20 of the 60 evaluated examples are calibration examples"):
        mixed = ensemble.evaluate(loader(torch.cat([x[:20], xt[20:]]), torch.cat([y[:20], yt[20:]])), progress=False)
    assert mixed["conformal"]["calibration_overlap"] == 20


def test_the_sets_keep_the_predictive_they_were_fitted_on_when_calibrated_later():
    ensemble = overconfident()
    (x, y), (xv, yv) = data(50, 2), data(50, 4)
    ensemble.conformalize(loader(x, y), progress=False)
    before = ensemble.predict(x).sets
    ensemble.calibrate(loader(xv, yv), progress=False)
    assert ensemble.predict(x).probs.ne(torch.from_numpy(numpy_probs(ensemble, x))).any()  # now scaled
    assert torch.equal(ensemble.predict(x).sets, before)


def test_the_threshold_travels_through_the_adapter_files(tmp_path):
    ensemble = overconfident()
    x, y = data(50, 2)
    ensemble.calibrate(loader(x, y), progress=False)
    record = ensemble.conformalize(loader(x, y), alpha=0.05, score="raps", k_reg=2, lam=0.1, progress=False)
    ensemble.save_pretrained(tmp_path / "a")
    loaded = sve.Ensemble.from_pretrained(base(), tmp_path / "a")
    assert loaded.conformal == record and record["temperature"] == ensemble.calibration["temperature"]
    assert torch.equal(loaded.predict(x).sets, ensemble.predict(x).sets)
    # After loading, evaluate knows the fitted threshold only (the calibration examples are not in the files).
    assert set(loaded.evaluate(loader(x, y), progress=False)["conformal"]) == {"fitted"}
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    config["conformal"]["alpha"] = 1.5
    (tmp_path / "a" / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="conformal record .* is not valid"):
        sve.Ensemble.from_pretrained(base(), tmp_path / "a")


def test_too_few_calibration_examples_give_every_class_and_a_null_threshold(tmp_path):
    ensemble = sve.wrap(base(), "sve", ensemble_size=2, num_classes=3, example_input=data(1, 0)[0])
    x, y = data(8, 2)
    with pytest.warns(UserWarning, match="too few for alpha=0.05"):
        record = ensemble.conformalize(loader(x, y), alpha=0.05, progress=False)
    assert record["threshold"] is None and bool(ensemble.predict(x).sets.all())
    ensemble.save_pretrained(tmp_path / "a")
    assert bool(sve.Ensemble.from_pretrained(base(), tmp_path / "a").predict(x).sets.all())
