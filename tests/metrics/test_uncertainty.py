"""Per-example uncertainty (``sve.uncertainty``) against a numpy reference, its invariants, and
``EnsembleMethod.predict``."""

import math

import numpy as np
import pytest
import torch

import sve
from sve.metrics import disagreement, mutual_information
from sve.runs.run import build
from tests.conftest import compose_cfg


def reference(logits: np.ndarray) -> dict:
    """Written from the definitions with numpy, in float64 (members m, examples b, classes c)."""
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    mean = p.mean(0)
    h = lambda q: -(q * np.log(np.where(q > 0, q, 1))).sum(-1)  # noqa: E731
    label = mean.argmax(-1)
    return {
        "probs": mean,
        "label": label,
        "confidence": mean.max(-1),
        "entropy": h(mean),
        "expected_entropy": h(p).mean(0),
        "mutual_information": h(mean) - h(p).mean(0),
        "disagreement": (logits.argmax(-1) != label).mean(0),
    }


def test_every_field_matches_the_definitions():
    logits = np.random.default_rng(0).normal(size=(5, 7, 3)) * 2
    got = sve.uncertainty(torch.tensor(logits, dtype=torch.float32))
    for name, expected in reference(logits.astype(np.float32).astype(np.float64)).items():
        np.testing.assert_allclose(getattr(got, name).numpy(), expected, rtol=1e-9, atol=1e-12, err_msg=name)
    # With the paper's aggregate the total uncertainty is the aleatoric part plus the epistemic one.
    torch.testing.assert_close(got.entropy, got.expected_entropy + got.mutual_information)


def test_the_bounds_hold_and_agreeing_members_carry_no_epistemic_uncertainty():
    logits = torch.randn(4, 50, 6) * 5
    got = sve.uncertainty(logits)
    assert (got.mutual_information >= -1e-12).all() and (got.mutual_information <= math.log(4) + 1e-12).all()
    assert (got.disagreement >= 0).all() and (got.disagreement <= 1).all()
    same = sve.uncertainty(logits[:1].expand(4, -1, -1))
    assert same.mutual_information.abs().max() < 1e-12 and (same.disagreement == 0).all()
    # Two members certain of different classes: the epistemic part is the whole log 2 nats.
    split = torch.tensor([[[50.0, 0.0]], [[0.0, 50.0]]])
    assert float(sve.uncertainty(split).mutual_information) == pytest.approx(math.log(2), rel=1e-9)


def test_the_set_metrics_are_the_means_of_the_per_example_values():
    logits = torch.randn(3, 40, 5)
    got = sve.uncertainty(logits)
    assert mutual_information(logits) == pytest.approx(float(got.mutual_information.mean()), rel=1e-12)
    assert disagreement(logits, got.probs) == pytest.approx(float(got.disagreement.mean()), rel=1e-12)


def test_logit_averaging_changes_the_predictive_not_the_mutual_information():
    logits = torch.randn(3, 10, 4) * 3
    by_probs, by_logits = sve.uncertainty(logits), sve.uncertainty(logits, aggregate="logits")
    torch.testing.assert_close(by_logits.probs, logits.double().mean(0).softmax(-1))
    torch.testing.assert_close(by_logits.mutual_information, by_probs.mutual_information)


def test_predict_gives_the_evaluation_prediction_and_keeps_the_training_mode():
    cfg = compose_cfg(["method=sve", "ensemble_size=3", "backbone=tiny_vit", "dataset=synthetic_image"])
    _, datamodule, method, _ = build(cfg)
    datamodule.setup()
    batch = next(iter(datamodule.train_dataloader()))
    method.train()
    got = method.predict(batch)
    assert method.training  # left as it was
    assert got.probs.shape == (batch["labels"].shape[0], datamodule.num_classes)
    assert got.member_probs.shape[0] == 3
    torch.testing.assert_close(got.probs.sum(-1), torch.ones(got.probs.shape[0], dtype=torch.float64))
    method.eval()
    with torch.no_grad():
        expected = sve.uncertainty(method(batch))
    for name in ("probs", "entropy", "mutual_information", "disagreement"):
        torch.testing.assert_close(getattr(got, name), getattr(expected, name))
