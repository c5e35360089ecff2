"""The severity figure: each panel's curve is a metric of the shift record against the severity, in the units
the tables print; a second call adds another method's curve to the same panels."""

import numpy as np
import pytest

from sve.metrics.plots import severity_figure, write_figure

BY_SEVERITY = {  # as results.json's shift.by_severity: "0" the clean test set; severities as strings
    "0": {"acc": 0.91, "ece": 0.02, "nll": 0.31, "brier": 0.14},
    "1": {"acc": 0.85, "ece": 0.04, "nll": 0.49, "brier": 0.21},
    "3": {"acc": 0.62, "ece": 0.11, "nll": 1.25, "brier": 0.52},
    "10": {"acc": 0.30, "ece": 0.25, "nll": 2.90, "brier": 0.95},  # "10" after "3": ordered as numbers
}


def test_each_panel_draws_its_metric_against_the_severity(tmp_path):
    fig = severity_figure(BY_SEVERITY, title="tiny")
    assert [ax.get_ylabel() for ax in fig.axes] == ["accuracy (%)", "ECE (%)", "NLL"]
    for ax, key, scale in zip(fig.axes, ("acc", "ece", "nll"), (100, 100, 1)):
        (line,) = ax.get_lines()
        np.testing.assert_array_equal(line.get_xdata(), [0, 1, 3, 10])
        expected = [scale * BY_SEVERITY[s][key] for s in ("0", "1", "3", "10")]
        np.testing.assert_allclose(line.get_ydata(), expected, rtol=0, atol=1e-12)
    paths = write_figure(fig, tmp_path / "severity")
    assert [p.name for p in paths] == ["severity.png", "severity.pdf"] and all(p.stat().st_size for p in paths)


def test_a_second_method_is_drawn_into_the_same_panels():
    other = {s: {k: v / 2 for k, v in m.items()} for s, m in BY_SEVERITY.items()}
    fig = severity_figure(BY_SEVERITY, label="SV-Ensemble", metrics=("acc", "brier"))
    assert severity_figure(other, label="Deep Ensemble", metrics=("acc", "brier"), fig=fig) is fig
    assert len(fig.axes) == 2
    assert [ax.get_ylabel() for ax in fig.axes] == ["accuracy (%)", "Brier"]
    for ax in fig.axes:
        first, second = ax.get_lines()
        assert second.get_ydata()[2] == pytest.approx(first.get_ydata()[2] / 2)
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["SV-Ensemble", "Deep Ensemble"]
