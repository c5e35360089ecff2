"""``sve-tables <sweep dir>`` gives that sweep's own table (mean ± sample std over seeds per group of overrides),
and a results store still gets the paper's tables."""

import csv
import json
import shutil
import statistics

import pytest

from sve.cli.tables import main
from sve.runs.multirun import is_sweep
from sve.runs.results import write_json

ACC = {("sve", 0): 0.81, ("sve", 1): 0.84, ("sve", 2): 0.80, ("single", 0): 0.75, ("single", 1): 0.79}
NLL = {("sve", 0): 0.52, ("sve", 1): 0.47, ("sve", 2): 0.55, ("single", 0): 0.71, ("single", 1): 0.64}


def sweep_dir(root):
    """A sweep as ``sve-train -m method=sve,single seed=0,1,2 ensemble_size=2`` leaves it, one seed of single failed:
    Hydra's multirun.yaml, and per job its overrides and results.json (or failed.json)."""
    root.mkdir()
    (root / "multirun.yaml").write_text("hydra:\n  mode: MULTIRUN\n")
    for method, seed in [*ACC, ("single", 2)]:
        run = root / f"{method}_m2_seed{seed}"
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(f"- method={method}\n- seed={seed}\n- ensemble_size=2\n")
        if (method, seed) in ACC:
            metrics = {"test/acc": ACC[method, seed], "test/nll": NLL[method, seed], "val/acc": 0.5}
            write_json(run / "results.json", {"method": method, "seed": seed, "metrics": metrics})
        else:
            write_json(run / "failed.json", {"error": "RuntimeError: out of memory", "traceback": ""})
    return root


@pytest.mark.parametrize("how", ["name", "results"])
def test_a_sweep_directory_gives_its_mean_and_std_table(how, tmp_path, capsys):
    sweep = sweep_dir(tmp_path / "sweep")
    assert main([str(sweep)] if how == "name" else ["--results", str(sweep)]) == 0
    out = capsys.readouterr().out
    for method in ("sve", "single"):
        cells = []
        for metrics in (ACC, NLL):
            values = [v for (m, _), v in metrics.items() if m == method]
            cells.append(f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}")
        seeds = "0 1 2" if method == "sve" else "0 1"
        assert f"| method={method} | {len(seeds.split())} | {seeds} | {cells[0]} | {cells[1]} |" in out
    assert "1 run(s) did not finish and are not in the table: single_m2_seed2" in out
    assert not (sweep / "tables").exists()  # none of the paper's tables
    # The files say the same: summary.csv's numbers, summary.json's groups.
    rows = {r["overrides"]: r for r in csv.DictReader((sweep / "summary.csv").open())}
    sve = rows["ensemble_size=2 method=sve"]
    assert float(sve["test/acc_mean"]) == pytest.approx(statistics.mean([0.81, 0.84, 0.80]))
    assert float(sve["test/acc_std"]) == pytest.approx(statistics.stdev([0.81, 0.84, 0.80]))
    summary = json.loads((sweep / "summary.json").read_text())
    assert summary["finished"] == 5 and summary["not_finished"] == ["single_m2_seed2"]
    assert (sweep / "summary.md").read_text() in out


def test_a_results_store_still_gets_the_papers_tables(tmp_path, capsys):
    store = tmp_path / "results"
    (store / "runs").mkdir(parents=True)
    assert not is_sweep(store)
    assert main(["table1", "--results", str(store)]) == 0
    assert f"wrote {store / 'tables' / 'table1.md'}" in capsys.readouterr().out
    assert not (store / "summary.md").exists()


def test_a_directory_that_is_neither_is_named(tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    with pytest.raises(SystemExit) as stop:
        main([str(tmp_path / "notes")])
    assert stop.value.code == 2
    assert "is a directory but not a sweep of sve-train -m" in capsys.readouterr().err


def test_a_sweep_of_seeds_only_lists_its_overrides_once(tmp_path, capsys):
    # One group (only seeds swept): the table said "Overrides of every run: (none)" and repeated them in each row.
    sweep = sweep_dir(tmp_path / "sweep")
    for run in sweep.glob("single_*"):
        shutil.rmtree(run)
    assert main([str(sweep)]) == 0
    table = (sweep / "summary.md").read_text()
    assert "Overrides of every run: ensemble_size=2 method=sve;" in table
    assert table.count("method=sve") == 1 and "| (no others) | 3 | 0 1 2 |" in table
