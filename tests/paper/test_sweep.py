"""Every table and figure target end to end in its smoke variant (tiny models, synthetic data, CPU)."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sve.cli import sweep as sweep_cli
from sve.paper import sittings, sweep, sweep_jobs, sweep_runs, sweep_tuning
from sve.paper.store import load_spec, run_dir, table_names
from sve.runs.rundir import holder
from tests.conftest import ROOT as REPO
from tests.conftest import compose_cfg, skip_unless_installed


def run_dirs(name: str, smoke: bool) -> dict:
    """Each run directory a table's sweep writes, with the overrides it trains it with and the tuning that
    adds the tuned value to them (None where the smoke variant does not tune)."""
    spec = load_spec(name, smoke)
    if spec.kind == "cost":
        return {}
    tuned = spec.get("tune") and not sweep_tuning.smoke_skips_tuning(spec, smoke)
    tune = OmegaConf.to_container(spec.tune) if tuned else None
    return {job.dir: (job.overrides, tune) for job in sweep_jobs.jobs(spec, Path("/store"), smoke)}


@pytest.mark.parametrize("smoke", [False, True], ids=["real", "smoke"])
def test_tables_that_share_a_run_directory_train_it_with_the_same_overrides(smoke):
    # A sweep refuses a finished run recorded with other overrides (sweep.json): tables sharing a run directory
    # must train it alike, with the same tuning (the tuned value is one of the overrides).
    seen: dict = {}
    for name in table_names():
        for directory, overrides in run_dirs(name, smoke).items():
            first, theirs = seen.setdefault(directory, (name, overrides))
            assert theirs == overrides, f"{directory}: {first} trains it with {theirs}, {name} with {overrides}"
    assert len(seen) > 50


def trained_tables() -> list[str]:
    """Every table but those whose runs another entry point writes (``written_by``)."""
    return [name for name in table_names() if not load_spec(name).get("written_by")]


def groups_sharing_runs() -> list[tuple[str, ...]]:
    """The tables in groups that share at least one smoke run directory (mini Table 1 with mini Table 4 and
    mini Fig. 3, say): one sweep per group trains their shared runs once, as the real stores do."""
    groups: list[tuple[set, list]] = []
    for name in trained_tables():
        dirs = set(run_dirs(name, smoke=True))
        joined = [g for g in groups if g[0] & dirs]
        for g in joined:
            groups.remove(g)
        groups.append((dirs.union(*(g[0] for g in joined)), [n for g in joined for n in g[1]] + [name]))
    return [tuple(names) for _, names in groups]


GROUPS = groups_sharing_runs()


def test_the_smoke_groups_hold_every_table_once():
    names = [name for group in GROUPS for name in group]
    assert sorted(names) == sorted(trained_tables()) and "mini_distill" not in names
    assert ("mini_figure2_vision", "mini_figure3", "mini_table1", "mini_table4") in {tuple(sorted(g)) for g in GROUPS}


@pytest.mark.parametrize("names", GROUPS, ids=["+".join(g) for g in GROUPS])
def test_smoke_target_end_to_end(names, tmp_path, capsys):
    if sweep_cli.main([*names, "--smoke", "--results", str(tmp_path)]) != 0:
        # Weights or data that only a make target installs are a skip naming the target; looked for only when
        # the sweep failed (composing a job's config costs half a second, and the sweep composed each one already).
        for name in names:
            spec = load_spec(name, smoke=True)
            for job in sweep_jobs.jobs(spec, tmp_path / "check", smoke=True) if spec.kind != "cost" else []:
                skip_unless_installed(compose_cfg(job.overrides, tmp_path))
        pytest.fail(f"the smoke sweep of {names} failed:\n{capsys.readouterr().out[-3000:]}")
    shown = capsys.readouterr().out
    for name in names:
        check_smoke_outputs(name, tmp_path / "smoke")
        table = tmp_path / "smoke" / "tables" / f"{name}.md"
        if table.exists():  # every table written is printed too
            assert f"wrote {table}" in shown and table.read_text() in shown, name


def test_a_table_written_by_another_entry_point_is_built_not_trained(tmp_path, capsys, monkeypatch):
    # mini_distill's rows share run directories with mini Tables 2 and 1 (its teachers) under other overrides:
    # were they jobs, the sweep would train them unlike those tables, and try to train its students.
    for runner in ("run_in_process", "run_subprocess"):
        monkeypatch.setattr(sweep, runner, lambda job: pytest.fail(f"trained {job}"))
    assert sweep_jobs.jobs(load_spec("mini_distill"), tmp_path, smoke=False) == []
    assert sweep_cli.main(["mini_distill", "--results", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "mini_distill: its runs are written by scripts/mini_distill.py, not by the sweep" in shown
    assert f"wrote {tmp_path / 'tables' / 'mini_distill.md'}" in shown


def check_smoke_outputs(name: str, root: Path) -> None:
    spec = load_spec(name, smoke=True)
    for job in sweep_jobs.jobs(spec, root, smoke=True) if spec.kind != "cost" else []:
        results = json.loads((job.dir / "results.json").read_text())
        assert results["config"]["experiment_name"] == job.experiment and results["seed"] == job.seed
    if spec.kind in ("metrics", "figure2"):
        table = (root / "tables" / f"{name}.md").read_text()
        assert "Missing runs: none." in table and "| – |" not in table
    if spec.kind == "figure2":
        assert (root / "figures" / f"{name}.png").stat().st_size > 0
    if spec.kind == "figureB":  # the SVE run wrote singular_values.npz through the sweep's callback
        assert (root / "figures" / "figure4_qkv.png").stat().st_size > 0
    if spec.kind in ("figure3", "cost"):
        assert (root / "tables" / f"{name}.md").exists()
    if spec.kind == "figure3":  # the smoke runs evaluate every severity of two corruptions: nothing missing
        assert (root / "figures" / f"{name}.png").stat().st_size > 0
        assert "Missing runs: none." in (root / "tables" / f"{name}.md").read_text()


def test_make_smoke_target_from_the_command_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's sve, whichever is installed
    done = subprocess.run(
        ["make", "figureB", "SMOKE=1", f"RESULTS={tmp_path}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[1/1] oxford_pets_dinov2 sve M=4 seed 0: trained in" in done.stdout
    for figure in ("figure4_qkv", "figure5_attn_out", "figure6_fc1"):
        assert f"wrote {tmp_path / 'smoke' / 'figures' / figure}.png" in done.stdout
        assert (tmp_path / "smoke" / "figures" / f"{figure}.pdf").stat().st_size > 0


def finished(job, results: dict) -> dict:
    """What a fake run leaves behind: its results.json in the job's directory."""
    job.dir.mkdir(parents=True, exist_ok=True)
    (job.dir / "results.json").write_text(json.dumps(results))
    return results


def test_failures_do_not_stop_the_sweep_and_reruns_skip_finished_runs(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_run(job):
        calls.append(job.method)
        if job.method == "svf":
            raise RuntimeError("boom")
        return finished(
            job,
            {
                "method": job.method,
                "num_members": job.members,
                "seed": job.seed,
                "metrics": {"test/acc": 0.5},
                "config": {"experiment_name": job.experiment},
            },
        )

    monkeypatch.setattr(sweep, "run_in_process", fake_run)
    monkeypatch.setattr(sweep, "build", lambda *args, **kwargs: [])
    assert sweep_cli.main(["table4", "--smoke", "--results", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "cifar100_dino svf M=1 seed 0: FAILED: boom" in out and "1 run(s) failed" in out
    assert len(calls) == 7  # every row was tried after the failure
    failed = run_dir(tmp_path / "smoke", "cifar100_dino", "svf", 1, 0)
    assert json.loads((failed / "failed.json").read_text())["error"] == "RuntimeError: boom"

    calls.clear()
    assert sweep_cli.main(["table4", "--smoke", "--results", str(tmp_path)]) == 1
    assert calls == ["svf"]  # only the run without results.json is tried again
    assert "cifar100_dino sve M=4 seed 0: done earlier" in capsys.readouterr().out


def test_a_run_started_by_the_sweep_logs_each_line_once(tmp_path, monkeypatch):
    # The real runs go through a subprocess whose output is train.log; Hydra's file handler wrote the same file,
    # so every log line appeared twice.
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # this checkout's sve, whichever is installed
    overrides = ["trainer=debug", "callbacks=none", "backbone=tiny_vit", "method=sve", "ensemble_size=2", "seed=3"]
    job = sweep_jobs.Job("exp", "sve", 2, 3, overrides, tmp_path / "run")
    results = sweep_runs.run_subprocess(job)
    assert results["seed"] == 3 and results["num_members"] == 2
    log = (job.dir / "train.log").read_text()
    assert log.count("Seed set to 3") == 1 and log.count("sweep attempt") == 1


def test_a_run_with_a_collapsed_member_says_so_in_the_sweep_log(tmp_path, monkeypatch, capsys):
    def fake_run(job):  # SVE's member 1 answers the same for every input; the other rows are healthy
        collapsed = [1] if job.method == "sve" else []
        return finished(
            job,
            {
                "method": job.method,
                "num_members": job.members,
                "seed": job.seed,
                "metrics": {"test/acc": 0.5, "test/collapsed_members": collapsed},
                "config": {"experiment_name": job.experiment},
            },
        )

    monkeypatch.setattr(sweep, "run_in_process", fake_run)
    monkeypatch.setattr(sweep, "build", lambda *args, **kwargs: [])
    assert sweep_cli.main(["table4", "--smoke", "--results", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    flagged = [line for line in lines if "collapsed" in line]
    assert flagged and all(" sve M=4 " in line and "member(s) [1] answer the same" in line for line in flagged)
    assert any(" svf M=1 " in line and line.endswith("acc 0.500") for line in lines)


def test_a_finished_run_trained_with_other_overrides_is_not_reported_as_done(tmp_path, monkeypatch, capsys):
    def fake_run(job):
        return finished(
            job,
            {
                "method": job.method,
                "num_members": job.members,
                "seed": job.seed,
                "metrics": {"test/acc": 0.5},
                "config": {"experiment_name": job.experiment},
            },
        )

    monkeypatch.setattr(sweep, "run_in_process", fake_run)
    monkeypatch.setattr(sweep, "build", lambda *args, **kwargs: [])
    assert sweep_cli.main(["table4", "--smoke", "--results", str(tmp_path)]) == 0
    job = sweep_jobs.jobs(load_spec("table4", smoke=True), tmp_path / "smoke", smoke=True)[0]
    assert json.loads((job.dir / sweep_runs.SWEPT).read_text())["overrides"] == job.overrides
    capsys.readouterr()
    assert sweep_cli.main(["table4", "trainer.max_epochs=3", "--smoke", "--results", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"{job}: FAILED: {job.dir} holds a run trained with other overrides" in out
    assert "(only in that run: []; only in this sweep: ['trainer.max_epochs=3'])" in out and "delete the dir" in out
    # A run that no sweep recorded (trained by hand, or before sweeps recorded it) is taken as it is.
    for path in (tmp_path / "smoke" / "runs").rglob(sweep_runs.SWEPT):
        path.unlink()
    assert sweep_cli.main(["table4", "trainer.max_epochs=3", "--smoke", "--results", str(tmp_path)]) == 0


def test_a_run_with_the_wrong_member_count_fails(tmp_path, monkeypatch, capsys):
    def fake_run(job):
        return {"num_members": 1, "metrics": {"test/acc": 0.5}}  # e.g. ensemble_size not passed

    monkeypatch.setattr(sweep, "run_in_process", fake_run)
    monkeypatch.setattr(sweep, "build", lambda *args, **kwargs: [])
    assert sweep_cli.main(["table6", "--smoke", "--results", str(tmp_path)]) == 1
    assert "sve M=2 seed 0: FAILED: recorded 1 members, the table expects 2" in capsys.readouterr().out


def test_dry_run_lists_commands_with_stable_directories(tmp_path, capsys):
    assert sweep_cli.main(["table2", "--results", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "[ 1/24] sst2_bert single M=1 seed 0: sve-train experiment=sst2_bert method=single" in out
    assert not (tmp_path / "runs").exists()
    job = sweep_jobs.jobs(load_spec("table2"), tmp_path, smoke=False)[-1]
    assert job.dir == tmp_path / "runs" / "sst2_bert" / "sve_m8" / "seed2"
    assert "ensemble_size=8" in job.overrides and "trainer=debug" not in job.overrides


def test_tuning_chooses_on_validation_and_reuses_the_chosen_run(tmp_path, monkeypatch):
    # Fake runs whose validation NLL is lowest at lr 0.01 and whose *test* accuracy is best at 0.001: the
    # choice follows validation only; the chosen tuning run becomes seed 0's run, seed 1 trains with it.
    trained = []

    def fake_run(job):
        lr = next(o.split("=")[1] for o in job.overrides if o.startswith("method.lr="))
        trained.append((job.seed, lr, job.tuning))
        return finished(
            job,
            {
                "method": job.method,
                "seed": job.seed,
                "num_members": job.members,
                "ensemble_size": 1,
                "experiment": job.experiment,
                "metrics": {"test/acc": 0.9 if lr == "0.001" else 0.5, "val/nll": 0.2 if lr == "0.01" else 0.4},
            },
        )

    monkeypatch.setattr(sweep, "run_in_process", fake_run)
    monkeypatch.setattr(sweep, "build", lambda *args, **kwargs: [])
    assert sweep_cli.main(["mini_table2", "--smoke", "--results", str(tmp_path)]) == 0
    row = run_dir(tmp_path / "smoke", "mini_sst2_minilm", "sve", 4, 0).parent
    choice = json.loads((row / "tuned.json").read_text())
    assert (choice["value"], choice["metric"]) == ("0.01", "val/nll")
    assert [t for t in trained if t[2] is None] == [(1, "0.01", None)] * 2  # single, sve: seed 1
    assert (row / "seed0" / "REUSED.txt").exists()
    assert json.loads((row / "seed0" / "results.json").read_text())["metrics"]["val/nll"] == 0.2
    trained.clear()
    assert sweep_cli.main(["mini_table2", "--smoke", "--results", str(tmp_path)]) == 0
    assert trained == []  # a rerun finds every run and every choice


def test_a_row_can_take_another_rows_tuned_value(tmp_path, monkeypatch):
    # mini Table 3's smoke variant: SVE (M=2) has tune_as svf:1. Only SVF's grid trains; SVE trains its seed 0
    # with SVF's choice (not a copy of SVF's run) and records where the choice came from.
    trained = []

    def fake_run(job):
        lr = next(o.split("=")[1] for o in job.overrides if o.startswith("method.lr="))
        trained.append((job.method, job.seed, lr, job.tuning))
        return finished(
            job,
            {
                "method": job.method,
                "seed": job.seed,
                "num_members": job.members,
                "ensemble_size": job.members,
                "experiment": job.experiment,
                "metrics": {"test/acc": 0.5, "val/nll": 0.2 if lr == "0.01" else 0.4},
            },
        )

    monkeypatch.setattr(sweep, "run_in_process", fake_run)
    monkeypatch.setattr(sweep, "build", lambda *args, **kwargs: [])
    assert sweep_cli.main(["mini_table3", "--smoke", "--results", str(tmp_path)]) == 0
    assert [t for t in trained if t[3]] == [
        ("svf", 0, "0.001", "method.lr=0.001"),
        ("svf", 0, "0.01", "method.lr=0.01"),
        ("svf", 0, "0.03", "method.lr=0.03"),
    ]  # the grid grew past its edge
    assert [t for t in trained if not t[3]] == [("sve", 0, "0.01", None)]
    sve_row = run_dir(tmp_path / "smoke", "mini_arc_smollm2", "sve", 2, 0).parent
    choice = json.loads((sve_row / "tuned.json").read_text())
    assert (choice["value"], choice["from"]) == ("0.01", "svf_m1")
    assert not (sve_row / "tune").exists() and not (sve_row / "seed0" / "REUSED.txt").exists()


def test_tune_as_must_name_a_tuned_row_of_the_table(tmp_path, monkeypatch):
    spec = sweep.load_spec("mini_table3", smoke=True)
    spec.rows[1].tune_as = "sve:4"  # not a row of the smoke table
    monkeypatch.setattr(sweep, "load_spec", lambda name, smoke: spec)
    with pytest.raises(ValueError, match=r"tune_as=sve:4 names no tuned row of this table; choose one of \['svf:1'\]"):
        sweep.sweep("mini_table3", smoke=True, root=tmp_path)


def test_rows_limits_the_sweep_to_the_named_rows(tmp_path, capsys):
    assert sweep_cli.main(["table2", "--results", str(tmp_path), "--dry-run", "--rows", "deep_ensemble:8"]) == 0
    out = capsys.readouterr().out
    listed = [line for line in out.splitlines() if line.startswith("[")]
    assert len(listed) == 3 and all("deep_ensemble M=8" in line for line in listed)
    with pytest.raises(ValueError, match=r"--rows \['deep_ensemble:4'\] not in table2; choose from \[.*'sve:8'"):
        sweep.sweep("table2", root=tmp_path, dry_run=True, rows=["deep_ensemble:4"])


def test_a_row_is_not_tuned_from_part_of_its_grid(tmp_path, monkeypatch):
    # One grid run fails (e.g. its directory is held by another sweep): no choice is made from the rest, no
    # seed of the row trains, and the failure says which values are missing; a later sweep tunes the row.
    def fake_run(job):
        lr = next(o.split("=")[1] for o in job.overrides if o.startswith("method.lr="))
        if lr == "0.01" and job.tuning:
            raise RuntimeError("run directory is in use by another run")
        return finished(
            job,
            {
                "method": job.method,
                "seed": job.seed,
                "num_members": job.members,
                "ensemble_size": job.members,
                "experiment": job.experiment,
                "metrics": {"test/acc": 0.5, "val/nll": 0.4},
            },
        )

    monkeypatch.setattr(sweep, "run_in_process", fake_run)
    monkeypatch.setattr(sweep, "build", lambda *args, **kwargs: [])
    failures = sweep.sweep("mini_table2", smoke=True, root=tmp_path)
    row = run_dir(tmp_path / "smoke", "mini_sst2_minilm", "sve", 4, 0).parent
    assert not (row / "tuned.json").exists() and not (row / "seed1").exists()
    assert any("not tuned yet" in f and "['0.01']" in f for f in failures), failures


def held_lock(directory, pid: int) -> None:
    """The lock a run with process ``pid`` on this host holds on ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": pid, "started": "earlier"}))


def test_a_run_another_process_trains_is_left_to_it_and_awaited_at_the_end(tmp_path, monkeypatch, capsys):
    # Two sweeps of one table share a store: the second leaves the run the first is training (its lock is
    # held by a live process, here this one), trains the rest, then waits for it and takes its results; it
    # never writes into that directory. The fake "other process" finishes when the last own run is done.
    spec = load_spec("table4", smoke=True)
    todo = sweep_jobs.jobs(spec, tmp_path / "smoke", smoke=True)
    other = todo[1]
    held_lock(other.dir, os.getpid())
    order = []

    def fake_run(job):
        assert job.dir != other.dir
        order.append(job.dir)
        if len(order) == len(todo) - 1:  # the other process finishes meanwhile
            finished(other, result(other))
            (other.dir / ".lock").unlink()
        return finished(job, result(job))

    monkeypatch.setattr(sweep, "run_in_process", fake_run)
    monkeypatch.setattr(sweep, "build", lambda *args, **kwargs: [])
    monkeypatch.setattr(sweep, "POLL_SECONDS", 0.01)
    assert sweep_cli.main(["table4", "--smoke", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{other}: being trained by another process (pid {os.getpid()}" in out
    assert f"{other}: finished by another process" in out
    assert out.index(f"{todo[-1]}: trained in") < out.index(f"{other}: finished by another process")
    assert sorted(p.name for p in other.dir.iterdir()) == ["results.json"]  # no train.log, no failed.json


def test_a_run_whose_holder_died_is_resumed_in_order(tmp_path, monkeypatch, capsys):
    todo = sweep_jobs.jobs(load_spec("table4", smoke=True), tmp_path / "smoke", smoke=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    held_lock(todo[1].dir, dead.pid)
    (todo[1].dir / "failed.json").write_text('{"error": "an earlier attempt failed"}')
    order = []
    monkeypatch.setattr(sweep, "run_in_process", lambda job: order.append(job.dir) or finished(job, result(job)))
    monkeypatch.setattr(sweep, "build", lambda *args, **kwargs: [])
    assert sweep_cli.main(["table4", "--smoke", "--results", str(tmp_path)]) == 0
    assert order == [job.dir for job in todo]  # nothing deferred
    assert not (todo[1].dir / "failed.json").exists()  # superseded by the successful attempt
    assert "another process" not in capsys.readouterr().out


def test_holder_tells_a_live_lock_from_a_dead_or_absent_one(tmp_path):
    assert holder(tmp_path) is None
    held_lock(tmp_path, os.getpid())
    assert holder(tmp_path)["pid"] == os.getpid()
    (tmp_path / ".lock").write_text("")  # being written by a run that is starting
    assert holder(tmp_path) == {}
    old = time.time() - 60
    os.utime(tmp_path / ".lock", (old, old))  # left empty by a crash long ago
    assert holder(tmp_path) is None


def test_a_lock_whose_pid_now_belongs_to_another_process_is_stale(tmp_path):
    # A session's runs end with it and their pids go to other processes: the recorded start time tells them apart.
    import json
    import socket

    from sve.runs.rundir import process_start

    me, started = os.getpid(), process_start(os.getpid())
    assert started is not None and started == process_start(me)  # stable for a living process
    record = {"host": socket.gethostname(), "pid": me, "pid_start": started, "slurm_job": None}
    (tmp_path / ".lock").write_text(json.dumps(record))
    assert holder(tmp_path)["pid"] == me  # this very process: live
    (tmp_path / ".lock").write_text(json.dumps({**record, "pid_start": str(int(started) - 1)}))
    assert holder(tmp_path) is None  # a live pid, started at another time: the recorded run is gone
    reused = {**record, "pid": 999_999_999, "run_pids": [me], "run_starts": [str(int(started) - 1)]}
    (tmp_path / ".lock").write_text(json.dumps(reused))
    assert holder(tmp_path) is None  # the adopting run's pid was reused too
    (tmp_path / ".lock").write_text(json.dumps({**reused, "run_starts": [started]}))
    assert holder(tmp_path)["run_pids"] == [me]
    legacy = {k: v for k, v in record.items() if k != "pid_start"}  # a lock written before start times
    (tmp_path / ".lock").write_text(json.dumps(legacy))
    assert holder(tmp_path)["pid"] == me


def result(job) -> dict:
    return {
        "method": job.method,
        "num_members": job.members,
        "seed": job.seed,
        "metrics": {"test/acc": 0.5},
        "config": {"experiment_name": job.experiment},
    }


def test_a_row_whose_tuning_another_process_trains_waits_until_the_rest_is_done(tmp_path, monkeypatch, capsys):
    # The other process trains one grid value of the first row: this sweep tunes and trains every other row
    # first, then waits for that value, chooses, and trains the first row's seeds.
    spec = load_spec("mini_table2", smoke=True)
    todo = sweep_jobs.jobs(spec, tmp_path / "smoke", smoke=True)
    first = todo[0]
    rest = [job for job in todo if job.method != first.method]
    other = sweep_tuning.tuning_jobs(spec, first, sweep_tuning.settings(spec.tune)[0])[1]
    held_lock(other.dir, os.getpid())
    order = []

    def fake_run(job):
        assert job.dir != other.dir
        order.append(job)
        if job.dir == rest[-1].dir:  # everything else is done: the other process finishes meanwhile
            finished(other, {**result(other), "metrics": {"test/acc": 0.5, "val/nll": 0.3}})
            (other.dir / ".lock").unlink()
        return finished(job, {**result(job), "metrics": {"test/acc": 0.5, "val/nll": 0.4}})

    monkeypatch.setattr(sweep, "run_in_process", fake_run)
    monkeypatch.setattr(sweep, "build", lambda *args, **kwargs: [])
    monkeypatch.setattr(sweep, "POLL_SECONDS", 0.01)
    assert sweep_cli.main(["mini_table2", "--smoke", "--results", str(tmp_path)]) == 0
    seeds_trained = [i for i, job in enumerate(order) if job.method == first.method and not job.tuning]
    assert [order[i].seed for i in seeds_trained] == [todo[1].seed]  # seed 0 is reused, not trained
    dirs = [job.dir for job in order]
    assert all(i > dirs.index(job.dir) for job in rest if job.dir in dirs for i in seeds_trained)  # deferred
    assert rest[-1].dir in dirs  # (behind every other row)
    tuned = json.loads((first.dir.parent / "tuned.json").read_text())
    assert tuned["value"] == other.tuning.split("=")[1]  # the other process's value won (val nll 0.3 < 0.4)
    assert (first.dir / "REUSED.txt").exists()  # seed 0 is the other process's chosen tuning run
    out = capsys.readouterr().out
    assert out.count(f"tune {other}: being trained by another process") == 1  # once, not once per seed
    assert f"tune {other}: finished by another" in out


def test_two_sweeps_on_one_store_train_every_run_exactly_once(tmp_path):
    # Two real processes start the same tables at the same moment (make mini's two workers): each run is
    # claimed by exactly one of them, tuning included, and both end with every table complete.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [
        sys.executable,
        "-m",
        "sve.cli.sweep",
        "mini_table3",
        "mini_table2",
        "--smoke",
        "--results",
        str(tmp_path),
    ]
    workers = [
        subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outs = [w.communicate(timeout=600)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], "\n".join(o[-3000:] for o in outs)
    trained = [
        line.split(": trained in")[0].split("] ", 1)[-1].strip()
        for out in outs
        for line in out.splitlines()
        if ": trained in" in line
    ]
    assert len(trained) == len(set(trained)), trained  # no run trained twice
    assert all(len([line for line in out.splitlines() if ": trained in" in line]) > 0 for out in outs)  # both worked
    root = tmp_path / "smoke"
    for name in ("mini_table3", "mini_table2"):
        table_jobs = sweep_jobs.jobs(load_spec(name, smoke=True), root, smoke=True)
        assert table_jobs and all(
            (job.dir / "results.json").exists() and not (job.dir / ".lock").exists() for job in table_jobs
        )
    recorded = sittings.recorded_runs(root)
    assert len(recorded) == len(trained) and len({r["pid"] for r in recorded}) == 2  # every run, as it ended
    trained_dirs = [f.parent for f in root.glob("runs/**/results.json") if not (f.parent / "REUSED.txt").exists()]
    assert sorted(r["run"] for r in recorded) == sorted(str(d.relative_to(root)) for d in trained_dirs)
    assert sittings.wall_seconds(recorded) <= sum(r["finished"] - r["started"] for r in recorded)


def test_wall_seconds_counts_overlapping_sittings_once(tmp_path):
    lines = [
        {"started": 0, "finished": 10},
        {"started": 5, "finished": 12},
        {"started": 20, "finished": 25},
        {"started": 21, "finished": 22},
    ]
    (tmp_path / sittings.SITTINGS).write_text("".join(json.dumps(line) + "\n" for line in lines) + "\n")  # blank end
    assert sittings.wall_seconds(sittings.recorded_runs(tmp_path)) == 12 + 5
    assert sittings.wall_seconds(sittings.recorded_runs(tmp_path / "absent")) is None


def test_a_sitting_records_the_commit_its_run_trained_with(tmp_path):
    # A long run keeps the code it started with while its clone moves on: the sitting names the run's commit.
    trained = sweep_jobs.Job("exp", "sve", 4, 0, [], tmp_path / "runs" / "exp" / "sve_m4" / "seed0")
    trained.dir.mkdir(parents=True)
    (trained.dir / "results.json").write_text(json.dumps({"git_commit": "0123abc"}))
    failed = sweep_jobs.Job("exp", "sve", 4, 1, [], tmp_path / "runs" / "exp" / "sve_m4" / "seed1")  # no results.json
    sittings.record_run(tmp_path, trained, started=1.0)
    sittings.record_run(tmp_path, failed, started=2.0)
    first, second = sittings.recorded_runs(tmp_path)
    assert first["commit"] == "0123abc" and first["run"] == "runs/exp/sve_m4/seed0"
    assert second["commit"] == sittings.git_commit()  # nothing of its own: the checked-out code's


def test_a_run_adopts_the_lock_its_sweep_holds_and_stays_live_while_either_lives(tmp_path, monkeypatch):
    from sve.runs.rundir import HELD_LOCK, DirectoryInUse, claim

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    held_lock(tmp_path, dead.pid)  # the sweep that claimed the directory has died meanwhile
    monkeypatch.setenv(HELD_LOCK, str((tmp_path / ".lock").resolve()))
    with claim(tmp_path):
        record = holder(tmp_path)
        assert record is not None and record["run_pids"] == [os.getpid()]  # live through the run
    assert (tmp_path / ".lock").exists()  # the sweep, not the run, removes it
    monkeypatch.delenv(HELD_LOCK)
    with pytest.raises(DirectoryInUse, match="in use by another run"):
        with claim(tmp_path):
            pass


def test_a_sweep_left_with_held_runs_trains_any_that_frees_up_before_waiting_on_the_rest(tmp_path, monkeypatch):
    # Two runs are another process's when the sweep reaches them. While it waits, the other process gives one
    # up (its lock goes away without results): the sweep trains that one at once, and only then is the other
    # one finished by its holder. Waiting on the first held run in order would never end here.
    todo = sweep_jobs.jobs(load_spec("table4", smoke=True), tmp_path / "smoke", smoke=True)
    x, y = todo[1], todo[2]
    held_lock(x.dir, os.getpid())
    held_lock(y.dir, os.getpid())
    trained, sleeps = [], []

    def fake_run(job):
        trained.append(job.dir)
        if job.dir == y.dir:  # the holder of x finishes it meanwhile
            finished(x, result(x))
            (x.dir / ".lock").unlink()
        return finished(job, result(job))

    def fake_sleep(seconds):
        sleeps.append(seconds)
        assert len(sleeps) < 50, "the sweep kept waiting"
        (y.dir / ".lock").unlink(missing_ok=True)  # the other process gives y up

    monkeypatch.setattr(sweep, "run_in_process", fake_run)
    monkeypatch.setattr(sweep, "build", lambda *args, **kwargs: [])
    monkeypatch.setattr(sweep.time, "sleep", fake_sleep)
    assert sweep_cli.main(["table4", "--smoke", "--results", str(tmp_path)]) == 0
    assert trained[-1] == y.dir and x.dir not in trained and len(sleeps) == 1
    assert (x.dir / "results.json").exists()


def test_a_stopped_sweep_passes_sigterm_on_to_its_run(tmp_path):
    # `kill <sweep>` must end its run too: otherwise the run trains on, orphaned, holding the lock.
    import signal
    import subprocess
    import sys
    import time

    got = tmp_path / "child_got_sigterm"
    child = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (open({str(got)!r}, 'w').write('yes'), sys.exit(0)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = (
        "import subprocess, sys\n"
        "from sve.paper.sweep_runs import forwarded_sigterm\n"
        f"child = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.PIPE, text=True)\n"
        "child.stdout.readline()\n"
        "with forwarded_sigterm(child) as stopped:\n"
        "    print('waiting', flush=True)  # the handler is in place from here on\n"
        "    code = child.wait()\n"
        "print('stopped' if stopped else 'not stopped', code, flush=True)\n"
    )
    start = time.monotonic()
    sweep = subprocess.Popen([sys.executable, "-c", parent], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert sweep.stdout.readline().strip() == "waiting"
    sweep.send_signal(signal.SIGTERM)
    out, _ = sweep.communicate(timeout=60)
    assert out.strip() == "stopped 0" and got.read_text() == "yes"
    assert time.monotonic() - start < 30  # not the child's 60 s sleep


def test_a_stopped_sweep_says_what_its_run_said_about_resuming(tmp_path):
    # "saved its checkpoint and resumes there" is true only of a run that wrote one: the sweep repeats the run's words.
    from sve.paper.sweep_runs import what_follows

    (tmp_path / "train.log").write_text(
        "Epoch 1/1 ...\nerror: run in x stopped by SIGTERM at step 23; nothing was written to results.json. "
        "Start the same command again: it starts over: no checkpoint had been written yet\n"
    )
    assert what_follows(tmp_path) == "starts over: no checkpoint had been written yet"
    assert "train.log" in what_follows(tmp_path / "absent")
