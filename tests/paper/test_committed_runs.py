"""The committed runs still stand with this code: every saved config names keys its targets take and builds its
model, and the one committed checkpoint evaluates again to the digits in its results.json."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sve.runs.validate import check_known_keys
from tests.conftest import ROOT

COMMITTED = sorted(p for p in (ROOT / "results").rglob("results.json") if "smoke" not in p.parts)
IDS = [str(p.parent.relative_to(ROOT / "results")) for p in COMMITTED]
# The run whose final checkpoint is committed (.gitignore): SVE (M = 4) on SST-2 with MiniLM-L6, a tuning run of
# the miniature, trained by a sweep worker with one thread (make mini: OMP_NUM_THREADS=1).
CHECKPOINTED = ROOT / "results/mini/runs/mini_sst2_minilm/sve_m4/tune/method.lr_0.0001"


def saved_config(path: Path):
    return OmegaConf.create(json.loads(path.read_text())["config"])


def test_the_committed_runs_are_found():
    assert len(COMMITTED) > 40 and (CHECKPOINTED / "checkpoints" / "final.ckpt").exists()


@pytest.mark.parametrize("path", COMMITTED, ids=IDS)
def test_every_committed_config_names_keys_its_targets_take(path):
    check_known_keys(saved_config(path))  # an InputError names the key, its value and the valid keys


def local_paths(node) -> list[str]:
    """The absolute paths a resolved config points at (weights installed where the run was trained)."""
    if isinstance(node, dict):
        return [p for v in node.values() for p in local_paths(v)]
    if isinstance(node, list):
        return [p for v in node for p in local_paths(v)]
    return [node] if isinstance(node, str) and node.startswith("/") else []


def data_roots(cfg) -> list[str]:
    roots = [cfg.dataset.get("root"), (cfg.dataset.get("ood") or {}).get("root")]
    return [str(Path(r).expanduser()) for r in roots if r]


@pytest.mark.slow
@pytest.mark.parametrize("path", COMMITTED, ids=IDS)
def test_every_committed_config_builds_its_model(path, monkeypatch):
    from sve.runs.run import build

    monkeypatch.chdir(ROOT)  # the saved data roots are relative to the repository (../shared/...)
    cfg = saved_config(path)
    missing = [p for p in local_paths(OmegaConf.to_container(cfg.backbone)) + data_roots(cfg) if not Path(p).exists()]
    if missing:
        pytest.skip(f"needs {missing} (the run's weights or data, absent here: see docs/datasets-and-backbones.md)")
    _, _, method, _ = build(cfg)
    recorded = json.loads(path.read_text())["parameters"]
    counts = method.parameter_counts()  # trainable and stored: the same model as the one trained
    assert counts["total"] == recorded["total"]
    # Runs recorded before the method base froze what no gradient reaches (sst2_minilm_cpu at 736f8da: BERT's
    # pooler, which mean pooling never reads) counted those as trainable; they never changed in training.
    unused = getattr(method, "unused_parameter_count", 0)
    assert recorded["trainable"] in (counts["trainable"], counts["trainable"] + unused), (recorded, counts, unused)


@pytest.mark.slow
def test_the_committed_checkpoint_evaluates_to_its_results(tmp_path):
    cfg = saved_config(CHECKPOINTED / "results.json")
    missing = [
        p for p in local_paths(OmegaConf.to_container(cfg.backbone)) + data_roots(cfg) if not (ROOT / p).exists()
    ]
    if missing:
        pytest.skip(f"needs {missing} (MiniLM-L6: make install; SST-2: ../shared)")
    run_dir = tmp_path / "run"  # a copy: evaluate.py writes evaluations/ into the run directory
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copy(CHECKPOINTED / "results.json", run_dir)
    shutil.copy(CHECKPOINTED / "checkpoints" / "final.ckpt", run_dir / "checkpoints")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}  # as the sweep worker trained it
    done = subprocess.run(
        [sys.executable, "-m", "sve.cli.evaluate", f"run_dir={run_dir}", "name=again"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    trained = json.loads((CHECKPOINTED / "results.json").read_text())
    again = json.loads((run_dir / "evaluations" / "again.json").read_text())
    # Metrics added since the run was trained (test/augrc, test/adaptive_ece) are new keys; none is lost.
    assert set(trained["metrics"]) <= set(again["metrics"])
    # Exactly where the kernels are the run's (its numerics record: CPU, instruction set, threads), else to
    # float32 rounding: another instruction set takes other MKL and ATen code paths (docs/results-format.md).
    # The committed run predates the record, so on any machine it is compared to the rounding.
    exact = trained.get("numerics") == again["numerics"]
    for key, value in trained["metrics"].items():
        if key != "test/seconds":
            assert again["metrics"][key] == (value if exact else pytest.approx(value, rel=1e-5, abs=1e-7)), key


def test_the_committed_miniature_is_what_its_runs_build(tmp_path, monkeypatch):
    """``make mini-report`` (tables, budget, README) on the committed runs, in a copy of the store at the same
    relative path, writes every committed table file, ``budget.md``, ``budget.json`` and ``README.md`` byte for
    byte: a run committed without ``make mini-collect``, or a builder or template changed without rebuilding,
    fails here. Figures are checked by their names; their pixels by other tests."""
    from sve.cli import tables
    from sve.paper import figures

    mini = ROOT / "results" / "mini"
    copy = tmp_path / "results" / "mini"
    copy.mkdir(parents=True)
    for part in ("runs", "teachers", "diagnostics"):  # diagnostics: the coverage grid and bootstrap seeds it cites
        if (mini / part).is_dir():
            shutil.copytree(mini / part, copy / part)
    shutil.copy(mini / "sittings.jsonl", copy / "sittings.jsonl")

    # Drawing the figures (PNG and PDF) is two thirds of a rebuild's time, and only their names are compared
    # here: each is plotted and named as by make mini-tables, then written as an empty file.
    monkeypatch.setattr(figures.plt.Figure, "savefig", lambda fig, path, **kwargs: Path(path).touch())
    monkeypatch.chdir(tmp_path)
    assert tables.main(["--results", "results/mini"]) == 0
    for script in ("mini_budget", "mini_report"):  # in this process: each would import torch again otherwise
        spec = importlib.util.spec_from_file_location(script, ROOT / "scripts" / f"{script}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.main(["--results", "results/mini"]) == 0, script
    committed = sorted(p.name for p in (mini / "tables").iterdir())
    assert committed == sorted(p.name for p in (copy / "tables").iterdir())
    for name in committed:
        assert (copy / "tables" / name).read_bytes() == (mini / "tables" / name).read_bytes(), name
    for name in ("budget.md", "budget.json", "README.md"):
        assert (copy / name).read_bytes() == (mini / name).read_bytes(), f"{name}: run make mini-report"
    assert {p.name for p in (mini / "figures").iterdir()} == {p.name for p in (copy / "figures").iterdir()}


DONE = re.compile(
    r"^\[\s*\d+/\d+\] \S+ (?P<experiment>\S+) (?P<method>\S+) M=(?P<members>\d+) "
    r"seed (?P<seed>\d+): done$"
)


def test_make_mini_in_a_fresh_clone_trains_no_committed_run(tmp_path):
    """The sweep's dry run over every mini table, on a copy of the committed store, calls every committed seed run
    done: its recorded overrides are those its table asks for, so ``make mini`` from a fresh clone skips it (a
    table whose overrides changed after its runs were committed fails here). Distilled students are written by
    scripts/mini_distill.py, which skips them on its own."""
    mini = ROOT / "results" / "mini"
    copy = tmp_path / "results" / "mini"
    copy.mkdir(parents=True)
    shutil.copytree(mini / "runs", copy / "runs")
    tables = sorted(p.stem for p in (ROOT / "configs" / "tables").glob("mini_*.yaml"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "sve.cli.sweep", *tables, "--results", "results/mini", "--dry-run"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    skipped = {
        f"{m['experiment']}/{m['method']}_m{m['members']}/seed{m['seed']}"
        for m in map(DONE.match, done.stdout.splitlines())
        if m
    }
    committed = {
        str(p.parent.relative_to(mini / "runs"))
        for p in (mini / "runs").glob("*/*/seed*/results.json")
        if not p.parent.parent.name.startswith("distilled_")
    }
    assert committed and committed <= skipped, sorted(committed - skipped)
