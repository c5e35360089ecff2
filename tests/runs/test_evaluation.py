"""The evaluation store: every number in results.json recomputed from the saved predictions with numpy, the
shift record per corruption and severity, member counts of sampled methods, and float16 storage."""

import json

import numpy as np
import pytest
import torch

from sve.metrics.collapse import COLLAPSED_BELOW
from sve.runs.prediction_files import read_predictions, write_predictions
from sve.runs.run import run
from sve.training.module import Predictions
from tests.conftest import compose_cfg
from tests.metrics.test_metrics import reference, reference_mutual_information, softmax
from tests.metrics.test_selective import reference_curve

TINY = [
    "backbone=tiny_vit",
    "dataset=synthetic_image",
    "dataset.num_test=21",
    "dataset.num_val=13",
    "trainer.limit_test_batches=null",
    "trainer.limit_val_batches=null",
]
OOD = "++dataset.ood={_target_: sve.data.SyntheticImageData, seed: 1, num_test: 17}"
TOL = 1e-6


def load(run_dir, results, name):
    return read_predictions(run_dir / results["predictions"][name])


def ensemble_probs(logits: np.ndarray, aggregate: str) -> np.ndarray:
    return softmax(logits.astype(np.float64)).mean(0) if aggregate == "probs" else softmax(logits.mean(0))


def auroc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Mann-Whitney: the chance that an in-distribution score beats an OOD score (ties count half)."""
    return float(np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg]))


def fpr_at_95_tpr(pos: np.ndarray, neg: np.ndarray) -> float:
    """Accept scores >= t with t the largest threshold that keeps 95% of the in-distribution inputs."""
    t = max(s for s in pos if np.mean(pos >= s) >= 0.95)
    return float(np.mean(neg >= t))


@pytest.mark.parametrize("aggregate", ["probs", "logits"])
def test_saved_predictions_recompute_every_metric(aggregate, tmp_path):
    results = run(compose_cfg(["method=sve", "ensemble_size=3", f"aggregate={aggregate}", OOD, *TINY], tmp_path))
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["predictions"]) == {"val", "test", "ood"} and saved["num_members"] == 3
    test, val, ood = (load(tmp_path, saved, s) for s in ("test", "val", "ood"))
    assert test["member_logits"].dtype == np.float32 and test["member_logits"].shape == (3, 21, 4)
    assert test["labels"].tolist() == [i % 4 for i in range(21)]  # every example once, in dataset order
    assert test["index"].tolist() == list(range(21)) and str(test["aggregate"]) == aggregate
    m = saved["metrics"]

    probs = ensemble_probs(test["member_logits"], aggregate)
    ref = reference(probs, test["labels"])
    for key in ("acc", "ece", "nll", "brier"):
        assert m[f"test/{key}"] == pytest.approx(ref[key], abs=TOL), key
        members = [reference(softmax(z.astype(np.float64)), test["labels"])[key] for z in test["member_logits"]]
        assert m[f"test/member_{key}"] == pytest.approx(members, abs=TOL), key
    mutual_information = reference_mutual_information(test["member_logits"].astype(float))
    assert m["test/mutual_information"] == pytest.approx(mutual_information, abs=TOL)
    member_argmax = test["member_logits"].argmax(-1)
    assert m["test/disagreement"] == pytest.approx(np.mean(member_argmax != probs.argmax(-1)), abs=TOL)
    assert m["test/examples"] == 21
    z = test["member_logits"].astype(np.float64)
    spread = (z - z.mean(-1, keepdims=True)).std(axis=1).max(axis=-1)  # per member: its most input-dependent class
    assert m["test/collapsed_members"] == [i for i, s in enumerate(spread) if s < COLLAPSED_BELOW] == []

    # Temperature scaling: the recorded T minimises the validation NLL; the scaled test metrics follow from it.
    val_log_p = np.log(ensemble_probs(val["member_logits"], aggregate))
    nll = lambda t: -np.mean(np.log(softmax(val_log_p / t))[np.arange(13), val["labels"]])  # noqa: E731
    t = m["test/temperature"]
    assert nll(t) <= min(nll(s) for s in np.exp(np.linspace(-3, 3, 601))) + 1e-9
    scaled = reference(softmax(np.log(probs) / t), test["labels"])
    for key in ("acc", "ece", "nll"):
        assert m[f"test/ts_{key}"] == pytest.approx(scaled[key], abs=TOL), key

    # OOD detection from the two saved sets (maximum predictive probability).
    pos, neg = probs.max(1), ensemble_probs(ood["member_logits"], aggregate).max(1)
    assert m["test/ood_auroc"] == pytest.approx(auroc(pos, neg), abs=TOL)
    assert m["test/ood_fpr95"] == pytest.approx(fpr_at_95_tpr(pos, neg), abs=TOL)
    # Selective prediction: AURC, the mean risk of the most confident k of 21 (the 21 confidences are distinct),
    # and the recorded curve (every one of its 21 points).
    assert len(set(probs.max(1))) == 21
    risk = reference_curve(probs.max(1), probs.argmax(1) == test["labels"])
    assert m["test/aurc"] == pytest.approx(risk.mean(), abs=TOL)
    assert saved["risk_coverage"]["test"]["risk"] == pytest.approx(risk, abs=TOL)
    assert saved["risk_coverage"]["test"]["coverage"] == pytest.approx(np.arange(1, 22) / 21, abs=1e-15)
    val_ref = reference(ensemble_probs(val["member_logits"], aggregate), val["labels"])
    assert m["val/acc"] == pytest.approx(val_ref["acc"], abs=TOL)
    # Conformal sets calibrated on val (13 examples: k = ceil(14 * 0.9) = 13, the largest score; at alpha 0.05
    # k = 14 > 13, no finite threshold), measured on test: thr's threshold and coverage with numpy.
    sets = saved["conformal"]
    assert (sets["calibration_split"], sets["test_split"], sets["calibration_examples"]) == ("val", "test", 13)
    val_probs = ensemble_probs(val["member_logits"], aggregate)
    q = np.sort(1 - val_probs[np.arange(13), val["labels"]])[12]
    thr = sets["by_alpha"]["0.1"]["thr"]
    assert thr["threshold"] == pytest.approx(q, abs=TOL)
    assert thr["coverage"] == pytest.approx(np.mean(1 - probs[np.arange(21), test["labels"]] <= q), abs=1e-12)
    assert sets["by_alpha"]["0.05"]["aps"]["threshold"] is None and sets["by_alpha"]["0.05"]["aps"]["coverage"] == 1
    assert set(sets["by_alpha"]["0.1"]) == {"thr", "aps", "raps", "thr_mi"}
    assert m["test/augrc"] == pytest.approx(np.mean(risk * np.arange(1, 22) / 21), abs=TOL)

    # Reliability bins: the ECE's, as the figures module reads them back (null, an empty bin, becomes NaN).
    from sve.metrics.plots import reliability_bins
    from sve.paper.figures import run_reliability
    from sve.paper.store import Run

    bins = reliability_bins(probs, test["labels"])
    recorded = run_reliability(Run(tmp_path / "results.json", None, "sve", 3, 0, saved))
    for key in ("count", "confidence", "accuracy"):
        np.testing.assert_allclose(recorded[key], bins[key], rtol=0, atol=TOL, equal_nan=True)
    assert results["metrics"] == saved["metrics"]


def test_shift_per_corruption_and_severity_from_the_saved_sets(tmp_path):
    corruptions = ["gaussian_noise", "contrast"]
    cfg = compose_cfg(
        [
            "method=sve",
            "ensemble_size=2",
            f"dataset.corruptions=[{','.join(corruptions)}]",
            "dataset.severities=[1,3,5]",
            *TINY,
        ],
        tmp_path,
    )
    saved = run(cfg)
    shift = saved["shift"]
    assert sorted(shift["by_corruption"]) == sorted(corruptions) and list(shift["by_severity"]) == ["0", "1", "3", "5"]
    test = load(tmp_path, saved, "test")
    pooled_probs, pooled_labels = [], []
    for corruption in corruptions:
        for severity in ("1", "3", "5"):
            found = load(tmp_path, saved, f"shift/{corruption}/{severity}")
            assert found["labels"].tolist() == test["labels"].tolist()  # the test images, corrupted
            assert not np.allclose(found["member_logits"], test["member_logits"])
            probs = ensemble_probs(found["member_logits"], "probs")
            ref = reference(probs, found["labels"])
            for key in ("acc", "ece", "nll", "brier"):
                assert shift["by_corruption"][corruption][severity][key] == pytest.approx(ref[key], abs=TOL)
            pooled_probs.append(probs)
            pooled_labels.append(found["labels"])
    for severity in ("1", "3", "5"):  # the mean over corruptions of each metric, as Fig. 3 plots it
        for key in ("acc", "ece", "nll"):
            mean = np.mean([shift["by_corruption"][c][severity][key] for c in corruptions])
            assert shift["by_severity"][severity][key] == pytest.approx(mean, abs=1e-12)
    for key in ("acc", "ece", "nll"):  # severity 0 is the clean test set
        assert shift["by_severity"]["0"][key] == saved["metrics"][f"test/{key}"]
    pooled = reference(np.concatenate(pooled_probs), np.concatenate(pooled_labels))
    for key in ("acc", "ece", "nll", "brier"):
        assert shift["pooled"][key] == pytest.approx(pooled[key], abs=TOL)
    assert (tmp_path / "severity.png").stat().st_size and (tmp_path / "severity.pdf").is_file()  # beside results


@pytest.mark.parametrize(
    "method, extra, members",
    [
        ("mc_dropout", ["method.num_samples=3"], 3),
        ("blob", ["method.num_samples=5"], 5),
        ("bayes_lora_llla", ["method.num_samples=4", "method.marglik_steps=3"], 4),
        ("checkpoint_ensemble", ["ensemble_size=2", "trainer.max_epochs=3"], 2),
    ],
)
def test_sampled_methods_record_every_sample_as_a_member(method, extra, members, tmp_path):
    saved = run(compose_cfg([f"method={method}", *extra, *TINY], tmp_path))
    assert saved["num_members"] == members
    test = load(tmp_path, saved, "test")
    assert test["member_logits"].shape[0] == members
    for key in ("acc", "ece", "nll", "brier"):
        values = saved["metrics"][f"test/member_{key}"]
        assert len(values) == members
        expected = [reference(softmax(z.astype(np.float64)), test["labels"])[key] for z in test["member_logits"]]
        assert values == pytest.approx(expected, abs=TOL), key
    if method != "checkpoint_ensemble":  # samples differ from each other (they are not one pass repeated)
        assert not np.allclose(test["member_logits"][0], test["member_logits"][1])


def test_large_files_are_stored_as_float16(tmp_path):
    logits = torch.randn(2, 1000, 10) * 5
    found = Predictions(logits, torch.arange(1000) % 10, torch.arange(1000))
    write_predictions(tmp_path / "small.npz", found, "probs", float16_above_mb=1)  # 80 kB: float32
    write_predictions(tmp_path / "large.npz", found, "probs", float16_above_mb=0.01)  # > 10 kB: float16
    small, large = read_predictions(tmp_path / "small.npz"), read_predictions(tmp_path / "large.npz")
    assert small["member_logits"].dtype == np.float32 and large["member_logits"].dtype == np.float16
    np.testing.assert_array_equal(small["member_logits"], logits.numpy())
    np.testing.assert_allclose(large["member_logits"], logits.numpy(), rtol=1e-3, atol=1e-3)
    huge = Predictions(logits * 1e4, found.labels, found.index)  # beyond float16's range: kept in float32
    write_predictions(tmp_path / "huge.npz", huge, "probs", float16_above_mb=0)
    assert read_predictions(tmp_path / "huge.npz")["member_logits"].dtype == np.float32


def test_predictions_can_be_switched_off_and_the_threshold_is_checked(tmp_path):
    saved = run(compose_cfg(["method=sve", "ensemble_size=2", "predictions.save=false", *TINY], tmp_path))
    assert "predictions" not in saved and not (tmp_path / "predictions").exists()
    assert len(saved["metrics"]["test/member_acc"]) == 2  # the numbers are there all the same
    from sve.errors import InputError

    with pytest.raises(InputError, match="predictions.float16_above_mb=-1"):
        run(compose_cfg(["predictions.float16_above_mb=-1", *TINY], tmp_path / "bad"))
