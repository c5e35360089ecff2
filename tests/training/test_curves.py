"""Every run's learning curve: validation metrics at planned optimiser steps, without changing training."""

from __future__ import annotations

import pytest

from sve.runs.run import run
from sve.training.curves import LearningCurve
from tests.conftest import compose_cfg

# 6 optimiser steps per epoch, 2 epochs, dropout on (the curve must not shift the random numbers training draws).
RUN = [
    "backbone=tiny_vit",
    "dataset=synthetic_image",
    "method=sve",
    "ensemble_size=2",
    "trainer=cpu",
    "trainer.max_epochs=2",
    "+backbone.model_kwargs.drop_rate=0.2",
    "dataset.num_train=48",
    "dataset.num_val=16",
    "dataset.num_test=16",
    "method.lr=3e-2",
    "+trainer.enable_progress_bar=false",
]
CURVE = ["+callbacks.curve._target_=sve.training.curves.LearningCurve", "+callbacks.curve.points=2"]


def test_the_schedule_holds_the_start_the_end_and_even_points_between():
    assert LearningCurve(points=3).planned_steps(100) == {0, 25, 50, 75, 100}
    assert LearningCurve(points=None, every_n_steps=40).planned_steps(100) == {0, 40, 80, 100}
    with pytest.raises(ValueError, match=r"callbacks.curve.points=0 is not valid; expected a positive integer"):
        LearningCurve(points=0)


def test_a_curve_records_its_steps_and_does_not_change_training(tmp_path):
    plain = run(compose_cfg(RUN, tmp_path / "plain"))
    curved = run(compose_cfg(RUN + CURVE, tmp_path / "curved"))
    assert plain["curve"] is None
    drop = {"test/seconds"}
    assert {k: v for k, v in curved["metrics"].items() if k not in drop} == {
        k: v for k, v in plain["metrics"].items() if k not in drop
    }
    points = curved["curve"]["points"]
    assert [p["step"] for p in points] == [0, 4, 8, 12] and curved["curve"]["total_steps"] == 12
    assert [p["epoch"] for p in points] == [0.0, pytest.approx(4 / 6, abs=1e-4), pytest.approx(8 / 6, abs=1e-4), 2.0]
    assert all(p["examples"] == 16 for p in points)
    # The last point is the trained model on the whole validation split: the final evaluation's numbers.
    for key in ("val/acc", "val/nll", "val/ece", "val/brier"):
        assert points[-1][key] == pytest.approx(curved["metrics"][key], abs=1e-6), key
    assert points[0]["val/nll"] != points[-1]["val/nll"]  # the model did change between the points


def test_val_batches_scores_a_fixed_prefix(tmp_path):
    results = run(compose_cfg(RUN + CURVE + ["++callbacks.curve.val_batches=1"], tmp_path))
    assert {p["examples"] for p in results["curve"]["points"]} == {8}


def test_debug_scores_two_batches_of_every_set_and_every_curve_point(tmp_path, caplog):
    # trainer=debug scored the whole validation split at every curve point (ARC-Easy: 15 minutes, no word).
    import logging

    import numpy as np

    overrides = [
        "backbone=tiny_vit",
        "dataset=synthetic_image",
        "method=sve",
        "ensemble_size=2",
        "callbacks=default",
        "dataset.num_val=80",
        "dataset.num_test=80",
        "dataset.corruptions=[contrast]",
        "dataset.severities=[2]",
    ]
    with caplog.at_level(logging.INFO, logger="sve.runs.evaluation"):
        results = run(compose_cfg(overrides, tmp_path))  # trainer=debug: limit_val_batches=limit_test_batches=2
    assert {p["examples"] for p in results["curve"]["points"]} == {16}  # 2 batches of 8, not 80
    for name in ("val", "test", "shift/contrast/2"):
        assert len(np.load(tmp_path / "predictions" / f"{name}.npz")["labels"]) == 16, name
    assert "scoring shift/contrast/2 (set 3 of 3): 2 batch(es)" in caplog.text  # progress without a bar
