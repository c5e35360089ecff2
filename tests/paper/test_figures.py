"""Figures render from stored files only: fixture results.json, singular_values.npz and predictions."""

import numpy as np
import pytest
import torch

from sve.layers.singular_values import FILENAME, load_singular_values, save_singular_values
from sve.metrics.plots import reliability_bins
from sve.paper.build import build
from sve.paper.figures import relative_change
from tests.conftest import compose_cfg
from tests.paper.test_report import write_run

PNG = b"\x89PNG"


def assert_figure(path):
    assert path.exists() and path.stat().st_size > 1000 and path.read_bytes()[:4] == PNG, path
    assert path.with_suffix(".pdf").read_bytes()[:4] == b"%PDF"


def test_figure2_one_line_per_method_over_pretraining(tmp_path):
    for i, experiment in enumerate(["cifar100_random", "cifar100_dino", "cifar100_dinov2"]):
        for seed in (0, 1):
            write_run(tmp_path, experiment, "sve", 4, seed, {"acc": 0.5 + 0.1 * i, "ece": 0.1, "nll": 1.0 - 0.1 * i})
            write_run(tmp_path, experiment, "single", 1, seed, {"acc": 0.6, "ece": 0.2, "nll": 0.9})
    build("figure2", root=tmp_path)
    assert_figure(tmp_path / "figures" / "figure2.png")
    assert "| SV-Ensemble | 4 | **70.0 ± 0.0†** |" in (tmp_path / "tables" / "figure2.md").read_text()


def test_figure2_keeps_every_shifted_marker_inside_its_axes(tmp_path, monkeypatch):
    """With one pretraining of three filled in (a sweep part way), the sideways-shifted markers of the outer
    lines must not fall past the axes' edge."""
    from sve.paper import figures

    for method, members in (("single", 1), ("lora_ensemble", 4), ("sve", 4)):
        write_run(tmp_path, "cifar100_dinov2", method, members, 0, {"acc": 0.6, "ece": 0.1, "nll": 0.9})
    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, out_dir, name: drawn.append(fig) or [])
    build("figure2", root=tmp_path)
    (fig,) = drawn
    for ax in fig.axes:
        low, high = ax.get_xlim()
        xs = [x for line in ax.get_lines() for x in line.get_xdata()]
        assert xs and all(low < x < high for x in xs), (low, high, xs)


def test_figure3_series_per_severity(tmp_path):
    def shift(offset):
        return {
            "by_severity": {
                str(s): {"acc": 0.9 - 0.1 * s - offset, "ece": 0.02 * s, "nll": 0.3 + 0.2 * s} for s in range(6)
            }
        }

    for seed in (0, 1, 2):
        write_run(tmp_path, "cifar100_c_dino", "sve", 4, seed, {"acc": 0.5}, shift=shift(0.01 * seed))
    write_run(tmp_path, "cifar100_c_dino", "single", 1, 0, {"acc": 0.5})  # no per-severity record
    build("figure3", root=tmp_path)
    assert_figure(tmp_path / "figures" / "figure3.png")
    md = (tmp_path / "tables" / "figure3.md").read_text()
    assert "| SV-Ensemble | 4 | 89.0 ± 1.0 | 79.0 ± 1.0 | 69.0 ± 1.0 | 59.0 ± 1.0 | 49.0 ± 1.0 | 39.0 ± 1.0 |" in md
    assert "cifar100_c_dino · Single (M=1): seeds 0, 1, 2 without a per-severity record" in md
    csv_rows = (tmp_path / "tables" / "figure3.csv").read_text().splitlines()
    assert csv_rows[0] == "method,members,metric,severity,mean,std,seeds" and len(csv_rows) == 1 + 7 * 3 * 6


def test_singular_values_file_holds_each_sv_layer(tmp_path):
    from sve.runs.run import build as build_run

    _, _, method, _ = build_run(compose_cfg(["method=sve", "backbone=tiny_vit", "ensemble_size=3"]))
    with torch.no_grad():
        layer = next(m for m in method.modules() if hasattr(m, "pretrained_singular_values"))
        layer.singular_values.mul_(1.5)  # as if trained
    save_singular_values(method, tmp_path)
    layers = load_singular_values(tmp_path / FILENAME)
    assert len(layers) == sum(hasattr(m, "pretrained_singular_values") for m in method.modules()) > 0
    name = next(n for n, m in method.named_modules() if m is layer)
    pretrained, members = layers[name]
    assert members.shape == (3, pretrained.shape[0])
    np.testing.assert_allclose(members, layer.singular_values.detach().numpy())
    np.testing.assert_allclose(
        relative_change(pretrained, members, 2), 100 * (members[:, :2] / pretrained[:2] - 1), rtol=1e-5
    )
    assert save_singular_values(torch.nn.Linear(2, 2), tmp_path / "none") is None  # no SV layers, no file


def test_figures_4_to_6_from_a_run_directory(tmp_path, monkeypatch):
    from sve.paper import figures

    run = write_run(tmp_path, "oxford_pets_dinov2", "sve", 4, 0, {"acc": 0.9}).parent
    rng = np.random.default_rng(0)
    arrays = {}
    for block in range(3):
        for layer in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"):
            s = np.sort(rng.uniform(1, 5, 12))[::-1]
            arrays[f"backbone.blocks.{block}.{layer}.pretrained"] = s
            arrays[f"backbone.blocks.{block}.{layer}.members"] = s * (1 + 0.02 * rng.standard_normal((4, 12)))
    np.savez(run / FILENAME, **arrays)
    drawn = {}
    save = figures.save_figure
    monkeypatch.setattr(
        figures, "save_figure", lambda fig, out, name: drawn.setdefault(name, fig) and save(fig, out, name)
    )
    build("figureB", root=tmp_path)
    for name, layer in (("figure4_qkv", "attn.qkv"), ("figure5_attn_out", "attn.proj"), ("figure6_fc1", "mlp.fc1")):
        assert_figure(tmp_path / "figures" / f"{name}.png")
        panels = [ax for ax in drawn[name].axes if ax.get_title()]
        assert [ax.get_title() for ax in panels] == [f"backbone.blocks.{b}.{layer}" for b in range(3)]
        for b, ax in enumerate(panels):  # one line per member: its top singular values' change in percent
            key = f"backbone.blocks.{b}.{layer}"
            expected = 100 * (arrays[f"{key}.members"] / arrays[f"{key}.pretrained"] - 1)
            lines = [line for line in ax.get_lines() if len(line.get_xdata()) > 2]
            top = len(lines[0].get_ydata())
            assert len(lines) == 4 and 0 < top <= 12
            np.testing.assert_allclose([line.get_ydata() for line in lines], expected[:, :top], rtol=1e-9)


def test_reliability_bins_match_the_ece_binning():
    probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.5, 0.5]])
    labels = np.array([0, 1, 1, 0])
    bins = reliability_bins(probs, labels, n_bins=10)
    # confidences 0.9, 0.6, 0.8, 0.5: right-closed bins (0.8, 0.9], (0.5, 0.6], (0.7, 0.8], (0.4, 0.5]
    assert bins["count"].tolist() == [0, 0, 0, 0, 1, 1, 0, 1, 1, 0]
    assert bins["accuracy"][[4, 5, 7, 8]].tolist() == [1, 0, 1, 1]
    ece = np.nansum(bins["count"] * np.abs(bins["accuracy"] - bins["confidence"])) / 4
    from sve.metrics.scores import ExpectedCalibrationError

    metric = ExpectedCalibrationError(n_bins=10)
    metric.update(torch.tensor(probs), torch.tensor(labels))
    assert ece == pytest.approx(float(metric.compute()))


def test_reliability_diagrams_from_saved_predictions(tmp_path, monkeypatch):
    from sve.paper import figures

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((8, 50, 5))
    labels = rng.integers(0, 5, 50)
    for method, members in (("sve", 8), ("single", 1)):  # table2's rows: SVE has 8 members
        run = write_run(
            tmp_path, "sst2_bert", method, members, 0, {"acc": 0.5}, predictions={"test": "predictions/test.npz"}
        ).parent
        (run / "predictions").mkdir()
        np.savez(run / "predictions" / "test.npz", member_logits=logits[:members], labels=labels)
    drawn = {}
    save = figures.save_figure
    monkeypatch.setattr(
        figures, "save_figure", lambda fig, out, name: drawn.setdefault(name, fig) and save(fig, out, name)
    )
    build("table2", root=tmp_path)
    assert_figure(tmp_path / "figures" / "table2_reliability_sst2_bert.png")
    # One panel per row that has predictions, its bars the reliability bins of the saved predictive.
    fig = drawn["table2_reliability_sst2_bert"]
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert sorted(titles) == ["SV-Ensemble (M=8)", "Single"]
    for title, members in (("Single", 1), ("SV-Ensemble (M=8)", 8)):
        ax = next(ax for ax in fig.axes if ax.get_title() == title)
        z = logits[:members] - logits[:members].max(-1, keepdims=True)
        probs = (np.exp(z) / np.exp(z).sum(-1, keepdims=True)).mean(0)
        bins = reliability_bins(probs, labels)
        heights = [bar.get_height() for bar in ax.containers[0]]
        np.testing.assert_allclose(heights, bins["accuracy"][bins["count"] > 0], atol=1e-12)


def test_learning_curves_average_the_seeds_at_shared_steps(tmp_path):
    # Two seeds' curves; the second lacks step 5, which is therefore left out of the mean.
    def points(steps, nll):
        return {"points": [{"step": s, "val/nll": v, "val/ece": 0.1, "val/acc": 0.5} for s, v in zip(steps, nll)]}

    write_run(tmp_path, "mini_sst2_minilm", "sve", 4, 0, {"acc": 0.8}, curve=points([0, 5, 10], [0.7, 0.5, 0.3]))
    write_run(tmp_path, "mini_sst2_minilm", "sve", 4, 1, {"acc": 0.8}, curve=points([0, 10], [0.7, 0.5]))
    write_run(tmp_path, "mini_sst2_minilm", "single", 1, 0, {"acc": 0.8})  # no curve recorded: no line
    from sve.paper.figures import mean_curve
    from sve.paper.store import load_runs, select

    found = select(load_runs(tmp_path), "mini_sst2_minilm", "sve", 4)
    steps, mean, std = mean_curve(found, "val/nll")
    assert steps.tolist() == [0, 10] and mean.tolist() == pytest.approx([0.7, 0.4])
    assert std.tolist() == pytest.approx([0.0, np.std([0.3, 0.5], ddof=1)])
    assert mean_curve(select(load_runs(tmp_path), "mini_sst2_minilm", "single", 1), "val/nll") is None
    build("mini_table2", root=tmp_path)
    assert_figure(tmp_path / "figures" / "mini_table2_curves_mini_sst2_minilm.png")


def test_a_run_reliability_figure_draws_its_bins_and_their_counts(tmp_path):
    """The per-run figure (every run writes one) shows the recorded accuracy per bin and each bin's count."""
    from sve.metrics.plots import N_BINS, reliability_grid
    from sve.runs.run import run_reliability_figure

    count = [0.0] * N_BINS
    count[9], count[14] = 3.0, 5.0
    accuracy = [None] * N_BINS
    accuracy[9], accuracy[14] = 1 / 3, 0.8
    confidence = [None] * N_BINS
    confidence[9], confidence[14] = 0.64, 0.97
    results = {
        "method": "sve",
        "num_members": 4,
        "dataset": "d",
        "backbone": "b",
        "seed": 0,
        "metrics": {"test/ece": 0.1},
        "reliability": {"test": {"count": count, "accuracy": accuracy, "confidence": confidence}},
    }
    assert [p.name for p in run_reliability_figure(results, tmp_path)] == ["reliability.png", "reliability.pdf"]
    bins = {
        k: np.asarray([np.nan if v is None else v for v in results["reliability"]["test"][k]], dtype=float)
        for k in ("count", "confidence", "accuracy")
    }
    fig = reliability_grid([("SVE", bins)], "t")
    top, bottom = fig.axes
    heights = sorted(round(p.get_height(), 6) for p in top.patches[:2])
    assert heights == [round(1 / 3, 6), 0.8]  # the accuracy bars, one per filled bin
    assert sorted(t.get_text() for t in bottom.texts) == ["3", "5"]
    assert run_reliability_figure({"method": "sve"}, tmp_path / "none") == []


@pytest.mark.parametrize("n_bins", [10, 15, 20])
def test_reliability_bins_on_and_beside_every_edge(n_bins):
    # ceil(conf * n) - 1 put nextafter(11/15, 1) (and 17/20, 19/20 likewise) into the lower bin: the product rounds
    # down to k. Reference: the bin (m-1)/n < conf <= m/n, compared directly.
    edges = np.arange(1, n_bins + 1) / n_bins
    conf = np.unique(np.r_[edges, np.nextafter(edges, 0), np.nextafter(edges, 2)].clip(0, 1))
    probs = np.column_stack([conf] + [(1 - conf) / n_bins] * n_bins)  # the other classes stay below conf
    expected = [sum((m / n_bins < c <= (m + 1) / n_bins) or (m == 0 and c == 0) for c in conf) for m in range(n_bins)]
    assert reliability_bins(probs, np.zeros(len(conf), int), n_bins)["count"].tolist() == expected
