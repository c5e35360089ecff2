"""Extending the framework from one's own project directory, never writing into the installed package: a table
definition of one's own named by its file (sve-sweep, sve-tables), overrides anywhere among the options."""

import pytest

from sve.cli import sweep as sweep_cli
from sve.cli import tables
from sve.data.base import TextClassificationData
from sve.methods import LoRAEnsemble

DEFINITION = """kind: metrics
title: "Mine"
experiments:
  mini_sst2_random: mine
rows:
  - {method: single, members: 1, overrides: [ensemble_size=1]}
  - {method: sve, members: 2, overrides: [ensemble_size=2]}
metrics: [acc, nll]
seeds: [0, 1]
tune: {key: method.lr, grid: [1.0e-3, 1.0e-2], metric: nll, seed: 0}
overrides: [trainer=cpu]
"""


def project(tmp_path, monkeypatch):
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "mine.yaml").write_text(DEFINITION)
    monkeypatch.chdir(tmp_path)  # the definition's path is relative to the project, as a user types it


def test_a_table_definition_of_ones_own_is_swept_from_its_file_with_overrides_after_the_options(
    tmp_path, monkeypatch, capsys
):
    project(tmp_path, monkeypatch)
    assert sweep_cli.main(["tables/mine.yaml", "--results", "store", "--dry-run", "dataset.root=/my/data"]) == 0
    out = capsys.readouterr().out
    commands = [line for line in out.splitlines() if "sve-train experiment=mini_sst2_random" in line]
    # 2 rows x 2 seeds, and each row's 2 tuning runs; every one gets the override given after --dry-run
    assert len(commands) == 8
    assert all("dataset.root=/my/data" in line for line in commands)
    assert sum("sve_m2" in line or "method=sve " in line for line in commands) == 4


def test_sve_tables_builds_ones_own_definition_into_the_store_named_by_its_stem(tmp_path, monkeypatch, capsys):
    project(tmp_path, monkeypatch)
    (tmp_path / "store").mkdir()
    assert tables.main(["--results", "store", "tables/mine.yaml"]) == 0
    table = (tmp_path / "store" / "tables" / "mine.md").read_text()
    assert "Mine" in table and "Missing runs" in table  # nothing trained: every cell "–", listed under it


def test_a_definition_file_that_is_not_there_is_named_with_the_shipped_choices(tmp_path, monkeypatch, capsys):
    project(tmp_path, monkeypatch)
    (tmp_path / "store").mkdir()
    try:
        tables.main(["--results", "store", "tables/typo.yaml"])
    except Exception as err:  # noqa: BLE001 - the one-line InputError is the fact checked
        message = str(err)
    assert "tables/typo.yaml" in message and str(tmp_path) in message and "mini_table2" in message


def test_overrides_after_an_option_reach_every_run_of_a_shipped_table(tmp_path, capsys):
    assert sweep_cli.main(["table2", "--results", str(tmp_path), "--dry-run", "dataset.root=/my/sst2"]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if "sve-train" in line]
    assert commands and all("dataset.root=/my/sst2" in line for line in commands)


def test_overrides_written_after_the_rows_are_overrides_not_rows(tmp_path, capsys):
    # --rows takes every value after it, so an override there could be read as a row (and refused as one).
    assert (
        sweep_cli.main(["table2", "--results", str(tmp_path), "--dry-run", "--rows", "sve:8", "dataset.root=/my/sst2"])
        == 0
    )
    commands = [line for line in capsys.readouterr().out.splitlines() if "sve-train" in line]
    assert commands and all("method=sve " in line and "dataset.root=/my/sst2" in line for line in commands)


def test_a_method_class_whose_package_is_not_on_the_path_says_how_to_put_it_there():
    from omegaconf import OmegaConf

    from sve.errors import InputError
    from sve.runs.validate import check_known_keys

    cfg = OmegaConf.create({"method": {"_target_": "my_own_project_pkg.MyMethod", "name": "mine"}})
    try:
        check_known_keys(cfg)
    except InputError as err:
        message = str(err)
    # the key, the bad value and the two ways to make a project's own module importable by the console scripts
    assert "method._target_='my_own_project_pkg.MyMethod'" in message
    assert "no module named 'my_own_project_pkg'" in message
    assert "PYTHONPATH" in message and "pip install -e ." in message


def test_sve_eval_finds_a_dataset_option_of_ones_own_config_folder_as_sve_train_does(tmp_path):
    from omegaconf import OmegaConf

    from sve.errors import InputError
    from sve.runs.eval_config import apply_overrides, check_same_model

    (tmp_path / "conf" / "dataset").mkdir(parents=True)
    (tmp_path / "conf" / "dataset" / "mine.yaml").write_text(
        "_target_: sve.data.SyntheticTextData\nname: mine\nnum_classes: 2\nnum_train: 8\nnum_val: 4\nnum_test: 4\n"
        "batch_size: 4\nmax_length: 16\n"
    )
    trained = OmegaConf.create({"method": {"name": "sve"}, "dataset": {"name": "synthetic_text", "num_test": 32}})
    for flags in (
        ["--config-dir", str(tmp_path / "conf")],
        [f"--config-dir={tmp_path / 'conf'}"],
        [f"hydra.searchpath=[file://{tmp_path / 'conf'}]"],
    ):
        overrides = [*flags, "dataset=mine"]
        check_same_model(trained, overrides)  # it parsed --config-dir as an override: a Hydra traceback
        cfg = apply_overrides(trained, overrides)
        assert cfg.dataset.name == "mine" and cfg.dataset.num_test == 4
        assert "hydra" not in cfg  # where options are found is not a key of the evaluated config
    try:
        apply_overrides(trained, ["--config-dir", str(tmp_path / "nope"), "dataset=mine"])
    except InputError as err:
        assert "--config-dir" in str(err) and "nope" in str(err)
    else:
        raise AssertionError("a config folder that is not there was taken")


def test_a_table_of_ones_own_experiment_trains_from_ones_own_config_folder_into_the_store(tmp_path, monkeypatch):
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "my_exp.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /backbone: tiny_bert\n  - override /dataset: synthetic_text\n"
        "experiment_name: my_exp\n"
    )
    (tmp_path / "mine.yaml").write_text(
        "kind: metrics\ntitle: Mine\nexperiments: {my_exp: mine}\n"
        "rows:\n  - {method: single, members: 1, overrides: [ensemble_size=1]}\n"
        "metrics: [acc]\nseeds: [0]\noverrides: [trainer.max_epochs=1]\n"
    )
    monkeypatch.chdir(tmp_path)
    assert sweep_cli.main(["mine.yaml", "--smoke", "--results", "store", "--config-dir", "conf"]) == 0
    run = tmp_path / "store" / "smoke" / "runs" / "my_exp" / "single_m1" / "seed0"
    assert (run / "results.json").is_file()
    assert (tmp_path / "store" / "smoke" / "tables" / "mine.md").is_file()
    assert not (tmp_path / "outputs").exists()  # nothing beside the store


class OwnTextData(TextClassificationData):
    """A data module of one's own, written as docs/extending.md says: its settings, the rest to super()."""

    name = "own_text"
    num_classes = 2

    def __init__(self, per_split: int = 8, **kwargs):
        super().__init__(**kwargs)
        self.per_split = per_split

    def read_splits(self):
        return {split: [("yes no", 0), ("no yes", 1)] * (self.per_split // 2) for split in ("train", "val", "test")}


def test_a_subclass_of_ones_own_has_its_keys_checked_through_the_framework_classes_it_extends():
    from omegaconf import OmegaConf

    from sve.errors import InputError
    from sve.runs.validate import accepted_keys, check_known_keys

    # its own argument, and the framework's that **kwargs passes on
    assert {"per_split", "max_length", "batch_size"} <= accepted_keys(OwnTextData)
    target = f"{__name__}.OwnTextData"
    check_known_keys(
        OmegaConf.create({"dataset": {"_target_": target, "name": "own", "per_split": 4, "batch_size": 2}})
    )
    # a key nothing reads (`root`, which only the shipped file-reading modules take) is refused here: passed on to
    # Hydra's instantiation, it would fail after the data checks with "Error in call to target"
    try:
        check_known_keys(OmegaConf.create({"dataset": {"_target_": target, "name": "own", "root": None}}))
    except InputError as err:
        message = str(err)
    else:
        raise AssertionError("dataset.root was taken by a class that reads no root")
    assert message.startswith("dataset.root: no such option") and "per_split" in message


class OwnLoRA(LoRAEnsemble):
    """One's own method, put on a shipped option by overriding only its target."""


@pytest.mark.parametrize(
    "extra, warned",
    [
        ([], True),  # the shipped name kept: the runs and tables would call it lora_ensemble
        (["method.name=own_lora"], False),
    ],
)
def test_a_shipped_method_option_given_another_class_warns_that_it_keeps_the_shipped_name(extra, warned, tmp_path):
    import warnings

    from sve.runs.validate import check_config
    from tests.conftest import compose_cfg

    cfg = compose_cfg(["method=lora_ensemble", f"method._target_={__name__}.OwnLoRA", *extra], tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_config(cfg)
    messages = [str(w.message) for w in caught if "method._target_" in str(w.message)]
    assert bool(messages) == warned
    if warned:
        assert "OwnLoRA" in messages[0] and "method.name=lora_ensemble" in messages[0]
        assert "set method.name=" in messages[0]
    # the shipped option itself, and its class under another import path, are no other method
    for target in ("sve.methods.LoRAEnsemble", "sve.methods.lora.LoRAEnsemble"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_config(compose_cfg(["method=lora_ensemble", f"method._target_={target}"], tmp_path))
        assert not [w for w in caught if "method._target_" in str(w.message)]


def test_a_paper_file_of_ones_own_definition_is_read_beside_it_and_a_missing_one_is_named(tmp_path, monkeypatch):
    project(tmp_path, monkeypatch)
    (tmp_path / "store").mkdir()
    (tmp_path / "tables" / "mine_paper.csv").write_text(
        "experiment,method,members,acc,acc_std,nll,nll_std\nmini_sst2_random,sve,2,87.65,,0.4321,\n"
    )
    (tmp_path / "tables" / "mine.yaml").write_text(DEFINITION + "paper: mine_paper.csv\n")
    assert tables.main(["--results", "store", "tables/mine.yaml"]) == 0
    table = (tmp_path / "store" / "tables" / "mine.md").read_text()
    assert "87.65" in table or "87.7" in table  # the paper column, from the CSV beside the definition
    (tmp_path / "tables" / "mine.yaml").write_text(DEFINITION + "paper: mine_papr.csv\n")
    try:  # it was skipped in silence: the table came out without its paper column
        tables.main(["--results", "store", "tables/mine.yaml"])
    except Exception as err:  # noqa: BLE001 - the one-line InputError is the fact checked
        message = str(err)
    else:
        raise AssertionError("a paper file that is not there was skipped")
    assert "mine_papr.csv" in message and "--no-paper" in message


@pytest.mark.parametrize(
    "old, new, named",
    [
        ("metrics: [acc, nll]", "metrics: [acc, nlll]", ["metrics: 'nlll'", "brier"]),  # was KeyError: 'nlll'
        ("kind: metrics\n", "", ["kind: None", "figure2"]),  # was omegaconf's missing-key traceback
        ("seeds: [0, 1]", "seeds: 2", ["seeds: 2", "list of integers"]),  # was TypeError: 'int' object is not iterable
        ("grid: [1.0e-3", "gird: [1.0e-3", ["unknown ['gird']", "missing ['grid']"]),
    ],
)
def test_a_wrong_key_of_ones_own_table_definition_is_one_line_naming_it(old, new, named, tmp_path, monkeypatch):
    from sve.errors import InputError

    project(tmp_path, monkeypatch)
    (tmp_path / "store").mkdir()
    assert old in DEFINITION
    (tmp_path / "tables" / "mine.yaml").write_text(DEFINITION.replace(old, new))
    with pytest.raises(InputError) as caught:
        tables.main(["--results", "store", "tables/mine.yaml"])
    assert str(caught.value).startswith("tables/mine.yaml: ")
    for part in named:
        assert part in str(caught.value)


def test_every_shipped_definition_passes_the_definition_check():
    from sve.paper.store import load_spec, table_names

    for name in table_names():
        load_spec(name)
        load_spec(name, smoke=True)
