"""Tuning grows its log grid until the choice is interior, or says that it is left on an edge."""

import json
import math

import pytest
from omegaconf import OmegaConf

from sve.cli import sweep as sweep_cli
from sve.errors import InputError
from sve.paper import sweep, sweep_tuning
from sve.paper.store import load_spec, run_dir
from sve.paper.tuning import choice, ladder_position, ladder_value, next_value, settings


def tune(**kwargs):
    return OmegaConf.create({"key": "method.lr", "metric": "nll", "seed": 0, **kwargs})


def search(block, objective):
    """What the sweep does with a grid: score every value, grow while ``next_value`` says so."""
    values = settings(block)[0]
    scores = {}
    while True:
        scores.update({v: objective(v) for v in values if v not in scores})
        following = next_value(block, scores, higher_is_better=False)
        if following is None:
            return scores
        values = [*values, following]


def test_the_ladder_is_exact_decimal_values():
    assert [ladder_value(p, 2) for p in range(-8, -4)] == [1e-4, 3e-4, 1e-3, 3e-3]
    assert [ladder_value(p, 3) for p in range(-3, 1)] == [0.1, 0.2, 0.5, 1.0]
    assert str(ladder_value(-7, 2)) == "0.0003"  # the run directory name a YAML grid value gets
    assert ladder_position(3e-4, 2) == -7 and ladder_position(1e-3, 1) == -3
    with pytest.raises(
        InputError, match=r"0\.0004 is not on the log ladder with per_decade=2 \(values like 1e-4, 3e-4\)"
    ):
        ladder_position(4e-4, 2)
    with pytest.raises(InputError, match=r"per_decade=4 is not supported; choose one of \[1, 2, 3\]"):
        ladder_position(1e-3, 4)


def test_an_optimum_beyond_the_first_grid_is_found():
    # A smooth objective in log(lr) with its minimum at 1e-2, two half-decade steps above the grid's top.
    def objective(lr):
        return (math.log10(lr) + 2.0) ** 2

    block = tune(grid=[1e-4, 3e-4, 1e-3])
    scores = search(block, objective)
    record = choice(block, scores, False, str)
    assert record["value"] == "0.01" and record["edge"] is None
    assert record["grid"] == ["0.0001", "0.0003", "0.001", "0.003", "0.01", "0.03"]
    assert record["extended"] == ["0.003", "0.01", "0.03"] and record["initial_grid"] == ["0.0001", "0.0003", "0.001"]


def test_an_optimum_below_the_grid_grows_it_downwards():
    scores = search(tune(grid=[1e-3, 3e-3]), lambda lr: abs(math.log10(lr) + 3.5))  # minimum at 3e-4
    assert min(scores, key=scores.get) == 3e-4 and sorted(scores) == [1e-4, 3e-4, 1e-3, 3e-3]


def test_an_edge_that_the_bound_stops_is_reported():
    block = tune(grid=[1e-4, 3e-4], extend=2)
    scores = search(block, lambda lr: -lr)  # better and better upwards: never interior
    record = choice(block, scores, False, str)
    assert sorted(scores) == [1e-4, 3e-4, 1e-3, 3e-3] and record["value"] == "0.003"
    assert record["edge"] == "upper"
    assert "left on the upper edge of the searched grid after 2 of at most 2" in record["note"]


def test_a_fixed_grid_is_searched_as_given():
    block = tune(grid=["adamw", "sgd"], extend=0)
    scores = {"adamw": 0.3, "sgd": 0.5}
    assert next_value(block, scores, False) is None
    assert choice(block, scores, False, str)["value"] == "adamw"


def setting(job, key: str, default: float | None = None) -> float:
    """The value a sweep job gives ``key`` in its overrides (``default`` when it gives none)."""
    found = [o.split("=")[1] for o in job.overrides if o.startswith(f"{key}=")]
    assert len(found) <= 1, job.overrides  # a key given twice would be Hydra's error
    assert found or default is not None, (key, job.overrides)
    return float(found[0]) if found else default


def write_results(job, val_nll: float) -> dict:
    """A fake run's results.json (what the sweep reads back): its identity and the validation NLL to tune on."""
    results = {
        "method": job.method,
        "seed": job.seed,
        "num_members": job.members,
        "ensemble_size": job.members,
        "experiment": job.experiment,
        "metrics": {"test/acc": 0.5, "val/nll": val_nll},
    }
    job.dir.mkdir(parents=True, exist_ok=True)
    (job.dir / "results.json").write_text(json.dumps(results))
    return results


def test_the_sweep_grows_the_grid_and_records_the_search(tmp_path, monkeypatch):
    # Fake runs whose validation NLL falls with the learning rate up to 0.1: the smoke grid [1e-3, 1e-2] grows
    # to 3e-2, 0.1 and 0.3 (where NLL rises again); the seeds train at 0.1.
    trained = []

    def fake_run(job):
        lr = setting(job, "method.lr")
        trained.append((job.method, job.seed, lr, job.tuning is not None))
        return write_results(job, abs(math.log10(lr) + 1))

    monkeypatch.setattr(sweep, "run_in_process", fake_run)
    monkeypatch.setattr(sweep, "build", lambda *args, **kwargs: [])
    assert sweep_cli.main(["mini_table2", "--smoke", "--results", str(tmp_path)]) == 0
    row = run_dir(tmp_path / "smoke", "mini_sst2_minilm", "sve", 4, 0).parent
    record = json.loads((row / "tuned.json").read_text())
    assert record["value"] == "0.1" and record["edge"] is None
    assert record["grid"] == ["0.001", "0.01", "0.03", "0.1", "0.3"]
    assert [lr for m, _, lr, tuning in trained if m == "sve" and tuning] == [1e-3, 1e-2, 3e-2, 0.1, 0.3]
    assert [(s, lr) for m, s, lr, tuning in trained if m == "sve" and not tuning] == [(1, 0.1)]  # seed 0 is reused
    trained.clear()
    assert sweep_cli.main(["mini_table2", "--smoke", "--results", str(tmp_path)]) == 0
    assert trained == []  # a rerun finds every run, the grown grid included


def test_a_choice_over_another_grid_is_refused(tmp_path):
    spec = sweep.load_spec("mini_table2", smoke=True)
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"key": "method.lr", "value": "0.5", "grid": ["0.5", "1.0"]}))
    with pytest.raises(sweep.UnreadableFile, match=r"starting from \['0.001', '0.01'\]; delete it"):
        sweep_tuning.read_tuned(spec, path)


def test_a_row_can_take_the_choice_of_another_experiments_row(tmp_path, monkeypatch):
    # mini Table 2 at BERT-base size takes each row's learning rate from mini Table 2's MiniLM rows: it trains
    # no grid, fails clearly while the source row is untuned, and records where its choice came from.
    def fake_run(job):
        lr = setting(job, "method.lr")
        trained.append((job.experiment, job.method, lr, job.tuning is not None))
        return write_results(job, abs(math.log10(lr) + 2))

    trained = []
    spec = sweep.load_spec("mini_table2_mpnet", smoke=True)
    spec.tune = sweep.load_spec("mini_table2", smoke=True).tune  # tune in the smoke variant too
    spec.smoke.tune = spec.tune
    monkeypatch.setattr(
        sweep, "load_spec", lambda name, smoke: spec if name == "mini_table2_mpnet" else load_spec(name, smoke)
    )
    monkeypatch.setattr(sweep, "run_in_process", fake_run)
    monkeypatch.setattr(sweep, "build", lambda *args, **kwargs: [])
    failures = sweep.sweep("mini_table2_mpnet", smoke=True, root=tmp_path)
    assert any("sve_m4/tuned.json does not exist: its row has not been tuned yet" in f for f in failures), failures
    assert trained == []
    assert sweep.sweep("mini_table2", smoke=True, root=tmp_path) == []
    trained.clear()
    assert sweep.sweep("mini_table2_mpnet", smoke=True, root=tmp_path) == []
    assert trained == [("mini_sst2_mpnet", "sve", 0.01, False)]  # MiniLM's choice (val NLL lowest at 1e-2)
    record = json.loads((run_dir(tmp_path / "smoke", "mini_sst2_mpnet", "sve", 4, 0).parent / "tuned.json").read_text())
    assert record["value"] == "0.01" and record["from"] == "mini_sst2_minilm/sve_m4"


def test_a_row_tunes_its_own_key_with_another_rows_choice_fixed(tmp_path, monkeypatch):
    # The two-rate hybrid (mini_table2_rates): row sve_lora_rates keeps the adapter rate that sve_lora's own tuning
    # chose (fix_tuned) and tunes method.sv_lr on its row's grid; it fails clearly until sve_lora is tuned.
    def fake_run(job):
        lr = setting(job, "method.lr")
        sv_lr = setting(job, "method.sv_lr") if job.method == "sve_lora_rates" else 1.0
        trained.append((job.method, job.seed, lr, sv_lr, job.tuning))
        return write_results(job, abs(math.log10(lr) + 2) + abs(math.log10(sv_lr) + 1))  # best: 1e-2 and 0.1

    trained = []
    monkeypatch.setattr(sweep, "run_in_process", fake_run)
    monkeypatch.setattr(sweep, "build", lambda *args, **kwargs: [])
    spec = sweep.load_spec("mini_table2_rates", smoke=True)
    # The smoke's grids do not grow (extend: 0); this test follows a growth past the edge, so it allows one.
    next(r for r in spec.rows if r.method == "sve_lora_rates").tune.extend = 4
    monkeypatch.setattr(sweep, "load_spec", lambda name, smoke: spec)
    sve_lora = {"method": "sve_lora", "members": 4, "overrides": ["ensemble_size=4"]}
    spec.rows = [r for r in spec.rows if r.method != "sve_lora"]  # the hybrid alone: its source is not tuned
    failures = sweep.sweep("mini_table2_rates", smoke=True, root=tmp_path)
    assert failures and all("run the table that tunes that row first" in f for f in failures), failures
    assert trained == []
    spec.rows = [sve_lora, *spec.rows]
    assert sweep.sweep("mini_table2_rates", smoke=True, root=tmp_path) == []
    hybrid = [t for t in trained if t[0] == "sve_lora_rates"]
    assert {lr for _, _, lr, _, _ in hybrid} == {0.01}  # sve_lora's choice, kept fixed in every run
    assert [sv for _, _, _, sv, tuning in hybrid if tuning] == [1e-3, 1e-2, 3e-2, 0.1, 0.3]
    record = json.loads(
        (run_dir(tmp_path / "smoke", "mini_sst2_minilm", "sve_lora_rates", 4, 0).parent / "tuned.json").read_text()
    )
    assert (record["key"], record["value"]) == ("method.sv_lr", "0.1")
    plain = json.loads(
        (run_dir(tmp_path / "smoke", "mini_sst2_minilm", "sve_lora", 4, 0).parent / "tuned.json").read_text()
    )
    assert (plain["key"], plain["value"]) == ("method.lr", "0.01")  # the table's own tune for the other rows


def test_a_rows_own_tune_block_is_checked_when_loaded(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(
        "kind: metrics\nexperiments: {mini_sst2_minilm: x}\nseeds: [0]\nmetrics: [acc]\n"
        "rows:\n  - {method: sve, members: 4, tune: {key: method.sv_lr, grid: [0.1]}}\n"
    )
    with pytest.raises(InputError, match=r"rows\[0\].tune: missing \['metric', 'seed'\]"):
        load_spec(str(path), smoke=False)


def test_a_rows_diversity_knob_is_tuned_at_its_rate_and_its_runs_are_reused(tmp_path, monkeypatch):
    # mini_table3_sized: SVE takes SVF's rate and tunes sigma_init at it; LoRA-Ensemble tunes its own rate at the
    # knob's first value, then its init scale at the chosen rate. Fake runs: NLL best at lr 1e-2, SVE best at the
    # wider sigma_init, LoRA-Ensemble best at its default scale.
    def fake_run(job):
        lr, sigma, scale = (
            setting(job, "method.lr", 1.0),
            setting(job, "sigma_init", 0.01),
            setting(job, "method.init_scale", 1),
        )
        nll = abs(math.log10(lr) + 2) + (0.3 if sigma == 0.01 else 0.1) + abs(scale - 1)
        trained.append((job.method, job.seed, lr, sigma, scale, job.tuning))
        return write_results(job, nll)

    trained = []
    monkeypatch.setattr(sweep, "run_in_process", fake_run)
    monkeypatch.setattr(sweep, "build", lambda *args, **kwargs: [])
    assert sweep.sweep("mini_table3_sized", smoke=True, root=tmp_path) == []
    rows = run_dir(tmp_path / "smoke", "mini_arc_sized_smollm2", "sve", 2, 0).parent.parent
    sve = json.loads((rows / "sve_m2" / "tuned.json").read_text())
    assert (sve["value"], sve["from"]) == ("0.01", "svf_m1")
    assert (sve["knob"]["key"], sve["knob"]["value"], sve["knob"]["grid"]) == ("sigma_init", "0.03", ["0.01", "0.03"])
    assert sve["knob"]["rate"] == "method.lr=0.01"
    assert "knob" not in json.loads((rows / "svf_m1" / "tuned.json").read_text())  # SVF has none
    lora = json.loads((rows / "lora_ensemble_m2" / "tuned.json").read_text())
    assert (lora["value"], lora["knob"]["value"]) == ("0.01", "1.0")
    # SVE: both knob values trained at SVF's rate; its seed-0 run is the chosen knob run, copied.
    assert sorted((s, t) for m, _, _, s, _, t in trained if m == "sve") == [
        (0.01, "sigma_init=0.01"),
        (0.03, "sigma_init=0.03"),
    ]
    assert (rows / "sve_m2" / "seed0" / "REUSED.txt").exists()
    # LoRA-Ensemble: its rate grid at the knob's first value, then only the other knob value: the rate run at
    # the chosen rate is the knob's first run.
    assert [(lr, scale, t) for m, _, lr, _, scale, t in trained if m == "lora_ensemble"] == [
        (1e-3, 1.0, "method.lr=0.001"),
        (1e-2, 1.0, "method.lr=0.01"),
        (1e-2, 3.0, "method.init_scale=3.0"),
    ]
    knob_run = json.loads((rows / "lora_ensemble_m2" / "tune" / "method.init_scale_1.0" / "sweep.json").read_text())
    assert knob_run["overrides"][-3:] == ["method.init_scale=1.0", "method.lr=0.01", "seed=0"]
    trained.clear()
    assert sweep.sweep("mini_table3_sized", smoke=True, root=tmp_path) == []
    assert trained == []  # a rerun finds every run and both choices


def test_a_knob_needs_a_tuned_rate_and_two_values(tmp_path):
    path = tmp_path / "mine.yaml"
    head = "kind: metrics\nexperiments: {mini_sst2_minilm: x}\nseeds: [0]\nmetrics: [acc]\n"
    path.write_text(head + "rows:\n  - {method: sve, members: 4, knob: {key: sigma_init, grid: [0.01, 0.03]}}\n")
    with pytest.raises(InputError, match=r"rows\[0\].knob.*give the table a tune block"):
        load_spec(str(path), smoke=False)
    path.write_text(
        head
        + "tune: {key: method.lr, grid: [0.001], metric: nll, seed: 0}\n"
        + "rows:\n  - {method: sve, members: 4, knob: {key: sigma_init, grid: [0.01]}}\n"
    )
    with pytest.raises(InputError, match=r"rows\[0\].knob.*expected \{key: sigma_init, grid"):
        load_spec(str(path), smoke=False)
