"""``sve-train`` is one pass from the command line to the result: Hydra composes the run's config once, its values
are checked once (before torch is imported), and the entry point keeps no state between calls."""

from __future__ import annotations

import ast
import logging
import sys

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.types import RunMode

import sve.runs.run
import sve.runs.validate
from sve.cli import train
from tests.conftest import ROOT, compose_cfg
from tests.helpers import run_main


def count_calls(monkeypatch, function) -> list:
    """The calls of ``function`` from here on, wherever it is called from: every module that holds it by name
    gets a counting stand-in (a module imported later takes the stand-in from ``sve.runs.validate``)."""
    calls = []

    def counting(*args, **kwargs):
        calls.append(args)
        return function(*args, **kwargs)

    for module in list(sys.modules.values()):
        if getattr(module, function.__name__, None) is function:
            monkeypatch.setattr(module, function.__name__, counting)
    return calls


def test_one_run_of_sve_train_composes_its_config_once_and_checks_its_values_once(tmp_path, monkeypatch):
    checks = count_calls(monkeypatch, sve.runs.validate.check_values)
    compositions = []
    load = ConfigLoaderImpl.load_configuration

    def composing(self, config_name, overrides, run_mode, **kwargs):
        compositions.append((config_name, run_mode))
        return load(self, config_name, overrides, run_mode, **kwargs)

    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", composing)
    monkeypatch.setattr(
        sys, "argv", ["sve-train", "trainer=debug", "callbacks=none", f"hydra.run.dir={tmp_path}/run", "recipe=none"]
    )
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level  # Hydra configures the root logger for its job
    try:
        train.main()
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        root.setLevel(level)
    assert (tmp_path / "run" / "results.json").is_file()
    assert len(checks) == 1
    # Hydra also composes the run's config in multirun mode, to read whether it sets hydra.mode (its get_mode), as
    # for any application; the methods' registry composes the method's own option (sve.methods.registry).
    assert compositions.count(("train", RunMode.RUN)) == 1, compositions


def test_a_run_called_directly_checks_its_values_once(tmp_path, monkeypatch):
    checks = count_calls(monkeypatch, sve.runs.validate.check_values)
    sve.runs.run.run(compose_cfg(["recipe=none"], tmp_path))
    assert (tmp_path / "results.json").is_file()
    assert len(checks) == 1


def test_the_entry_point_keeps_no_state_between_calls():
    """No ``global`` statement in sve/cli/train.py, and its module-level names are constants, functions, the
    logger and the Hydra application: nothing that one call leaves for the next to read."""
    tree = ast.parse((ROOT / "sve" / "cli" / "train.py").read_text())
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.Global | ast.Nonlocal)]
    assigned = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            for name in ast.walk(target) if target is not None else ():
                if isinstance(name, ast.Name):
                    assigned.add(name.id)
    assert {name for name in assigned if not name.isupper()} == {"log", "hydra_main"}


def test_a_sweep_with_an_unknown_key_is_one_line_and_creates_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_main(monkeypatch, ["-m", "seed=0,1", "ensembel_size=2"], None) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ensembel_size: no such key (did you mean ensemble_size?)") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
