"""scripts/diagnostics_table.py: the diagnostics README's table, read from the runs' results.json."""

import json
import math
import runpy

import pytest

from tests.conftest import ROOT

SCRIPT = runpy.run_path(str(ROOT / "scripts" / "diagnostics_table.py"))


def write_run(directory, members: int, sigma: float, spread: float | None) -> None:
    directory.mkdir(parents=True)
    report = {"svd_seconds": 1.0, "singular_values": {"member_spread": spread, "mean_shift": 0.0125}} if spread else {}
    results = {
        "num_members": members,
        "wall_time_s": 600.0,
        "metrics": {
            "test/acc": 0.6,
            "test/ece": 0.142,
            "test/nll": 1.0965,
            "val/nll": 1.106,
            "test/member_acc": [0.6, 0.5916666][:members],
        },
        "method_report": report,
        "config": {"method": {"lr": 0.03, "sigma_init": sigma}, "trainer": {"max_epochs": 15}},
    }
    (directory / "results.json").write_text(json.dumps(results))


def test_a_row_reads_its_numbers_and_the_spread_against_its_initial_value(tmp_path):
    write_run(tmp_path / "diagnostics" / "arc_lr0.03" / "seed0", members=2, sigma=0.05, spread=0.07)
    write_run(tmp_path / "runs" / "svf_m1" / "seed0", members=1, sigma=0.0, spread=None)
    lines = SCRIPT["table"](
        [tmp_path / "diagnostics" / "arc_lr0.03" / "seed0", tmp_path / "runs" / "svf_m1" / "seed0"], tmp_path
    ).splitlines()
    assert len(lines) == 4 and all(line.count("|") == lines[0].count("|") for line in lines)
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    ratio = 0.07 / (0.05 * math.sqrt(1 / 2))  # the initial spread of M = 2: sigma_init sqrt((M-1)/M)
    assert cells == [
        "`diagnostics/arc_lr0.03/seed0`",
        "0.03",
        "0.05",
        "15",
        "60.0",
        "14.2",
        "1.097",
        "60.0, 59.2",
        "1.106",
        f"{ratio:.2f}",
        "1.25",
        "10 min",
    ]
    assert [c.strip() for c in lines[3].strip("|").split("|")][9:11] == ["–", "–"]  # one member: no spread


def test_a_run_without_results_is_named(tmp_path):
    with pytest.raises(Exception, match="no results.json in .*unfinished"):
        SCRIPT["table"]([tmp_path / "unfinished"], tmp_path)


def test_a_difference_is_the_paired_mean_with_its_test_set_interval(tmp_path):
    # Two runs on the same 600 examples: the NLL difference is the mean of the per-example differences, and
    # the interval's half-width that of a paired mean, 1.96 sd(d) / sqrt(n) (the bootstrap's own estimate of
    # the same quantity: within 10%).
    import numpy as np
    import torch

    from sve.runs.prediction_files import write_predictive

    generator = torch.Generator().manual_seed(0)
    labels, index = torch.randint(0, 4, (600,), generator=generator), torch.arange(600)
    nll = {}
    for name, scale in (("a", 1.0), ("b", 2.0)):
        probs = (scale * torch.randn(600, 4, generator=generator, dtype=torch.float64)).softmax(-1)
        (tmp_path / name / "predictive").mkdir(parents=True)
        write_predictive(tmp_path / name / "predictive" / "test.npz", "test", probs, labels, index)
        nll[name] = -probs[torch.arange(600), labels].log().float().numpy()
    rows = SCRIPT["differences"]([tmp_path / "a", tmp_path / "b"], tmp_path / "b", tmp_path).splitlines()
    assert len(rows) == 3 and rows[2].startswith("| `a` |")  # the reference's own row is left out
    point, low, high = (
        float(x) for x in rows[2].split("|")[4].replace("[", " ").replace("]", " ").replace(",", " ").split()
    )
    d = nll["a"] - nll["b"]
    assert point == pytest.approx(d.mean(), abs=5e-4)
    assert (high - low) / 2 == pytest.approx(1.96 * d.std(ddof=1) / np.sqrt(600), rel=0.1)
