"""scripts/collect_runs.py: a clone's finished runs come back into the committed store, and nothing else."""

import json
import runpy
import sys

import pytest

from tests.conftest import ROOT


def collect_module():
    return runpy.run_path(str(ROOT / "scripts" / "collect_runs.py"))


def write(path, text="x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_finished_runs_are_copied_without_what_the_repository_does_not_keep(tmp_path):
    source, target = tmp_path / "clone" / "results" / "mini", tmp_path / "main" / "results" / "mini"
    done = source / "runs" / "exp" / "sve_m4" / "seed0"
    for name in (
        "results.json",
        "run_config.yaml",
        "train.log",
        "predictive/test.npz",
        "checkpoints/final.ckpt",
        "csv/metrics.csv",
        "predictions/test.npz",
        ".hydra/config.yaml",
        ".lock",
        "failed.json",
        "adapter/adapter_config.json",
    ):
        write(done / name)
    write(done / "results.json", json.dumps({"metrics": {"test/acc": 0.5}}))
    tuning = source / "runs" / "exp" / "sve_m4" / "tune" / "method.lr_0.01"
    write(tuning / "results.json", "{}")
    write(tuning / "predictive" / "val.npz")
    write(source / "runs" / "exp" / "sve_m4" / "tuned.json", "{}")
    write(source / "runs" / "exp" / "sve_m4" / "seed1" / "train.log")  # still training: no results.json
    full = source / "runs" / "exp" / "single_m1" / "seed0"  # a full fine-tune: its adapter is the whole model
    write(full / "results.json", "{}")
    write(full / "adapter" / "adapter_config.json")
    with open(full / "adapter" / "adapter_model.safetensors", "wb") as big:
        big.truncate(2 * 2**20)  # over the 1 MiB limit (the repository takes no larger file)
    sittings = [{"run": "runs/exp/sve_m4/seed0", "started": 1}, {"run": "runs/exp/sve_m4/seed1", "started": 2}]
    write(source / "sittings.jsonl", "".join(json.dumps(s) + "\n" for s in sittings))
    target.mkdir(parents=True)

    collect = collect_module()["collect"]
    assert collect(source, target, dry_run=True) and not (target / "runs").exists()  # lists, copies nothing
    changes = collect(source, target)
    assert "added runs/exp/sve_m4/seed0" in changes and "tuned runs/exp/sve_m4" in changes
    copied = target / "runs" / "exp" / "sve_m4"
    assert sorted(p.name for p in (copied / "seed0").iterdir()) == [
        "adapter",
        "predictive",
        "results.json",
        "run_config.yaml",
        "train.log",
    ]
    assert not (copied / "tune" / "method.lr_0.01" / "predictive").exists()  # tuning runs' statistics stay
    assert not (copied / "seed1").exists()
    assert (target / "runs" / "exp" / "single_m1" / "seed0" / "results.json").exists()
    assert not (target / "runs" / "exp" / "single_m1" / "seed0" / "adapter").exists()  # over 1 MiB: left behind
    lines = (target / "sittings.jsonl").read_text().splitlines()
    assert [json.loads(line)["run"] for line in lines] == ["runs/exp/sve_m4/seed0"]  # only what was copied
    assert collect(source, target) == []  # a second pass finds nothing new, and adds no sitting twice
    teacher = source / "teachers" / "exp" / "sve_m4" / "seed0"  # trained again by mini_distill.py
    for name in ("results.json", "reproduced.json", "checkpoints/final.ckpt", "train.log"):
        write(teacher / name)
    assert collect(source, target) == [
        "teacher teachers/exp/sve_m4/seed0: reproduced.json",
        "teacher teachers/exp/sve_m4/seed0: results.json",
    ]
    kept = target / "teachers" / "exp" / "sve_m4" / "seed0"
    assert sorted(p.name for p in kept.iterdir()) == ["reproduced.json", "results.json"]  # no checkpoint
    assert (target / "sittings.jsonl").read_text().splitlines() == lines
    diagnostic = source / "diagnostics" / "exp_sve_lr" / "seed0"  # make mini-diagnostics: copied as a run is
    for name in ("results.json", "train.log", "predictive/test.npz", "checkpoints/final.ckpt"):
        write(diagnostic / name)
    assert collect(source, target) == ["added diagnostics/exp_sve_lr/seed0"]
    assert sorted(p.name for p in (target / "diagnostics" / "exp_sve_lr" / "seed0").iterdir()) == [
        "predictive",
        "results.json",
        "train.log",
    ]


def test_a_source_that_is_not_a_store_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["collect_runs.py", str(tmp_path / "nope"), str(tmp_path)])
    with pytest.raises(SystemExit) as ended:
        runpy.run_path(str(ROOT / "scripts" / "collect_runs.py"), run_name="__main__")
    assert ended.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path / 'nope' / 'runs'} does not exist")


def test_a_sharded_adapter_is_kept_while_each_file_and_the_whole_fit(tmp_path):
    source, target = tmp_path / "source" / "results" / "mini", tmp_path / "target"
    for run, shards, size in (("sve_m4", 3, 2**19), ("lora_ensemble_m4", 12, 2**20)):  # 1.5 MiB; 12 MiB in all
        seed0 = source / "runs" / "exp" / run / "seed0"
        write(seed0 / "results.json", "{}")
        (seed0 / "adapter").mkdir()
        for i in range(1, shards + 1):
            with open(seed0 / "adapter" / f"adapter_model-{i:05d}-of-{shards:05d}.safetensors", "wb") as shard:
                shard.truncate(size)
    target.mkdir(parents=True)
    collect_module()["collect"](source, target)
    assert len(list((target / "runs" / "exp" / "sve_m4" / "seed0" / "adapter").iterdir())) == 3
    assert not (target / "runs" / "exp" / "lora_ensemble_m4" / "seed0" / "adapter").exists()  # over 8 MiB
