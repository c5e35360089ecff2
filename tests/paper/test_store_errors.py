"""No silent outcomes, no raw tracebacks in the result store: unreadable store files, full disks,
read-only directories and saved configs that this code can no longer build are one ``InputError`` line each,
naming the file or key, what is wrong and what to do."""

import errno
import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from sve.cli import sweep as sweep_cli
from sve.errors import InputError
from sve.paper import sittings, sweep, sweep_jobs
from sve.paper.build import build
from sve.paper.store import load_spec, run_dir
from sve.runs import multirun, writable
from sve.runs.prediction_files import read_predictions, write_predictions
from sve.runs.reevaluate import evaluate_run
from sve.runs.results import UnreadableFile, read_json, read_results, write_json
from sve.runs.writable import check_writable
from sve.training.module import Predictions
from tests.conftest import ROOT, compose_cfg


def finished(job, results: dict) -> dict:
    job.dir.mkdir(parents=True, exist_ok=True)
    (job.dir / "results.json").write_text(json.dumps(results))
    return results


def fake_results(job) -> dict:
    return {
        "method": job.method,
        "ensemble_size": job.members,
        "num_members": job.members,
        "seed": job.seed,
        "experiment": job.experiment,
        "metrics": {"test/acc": 0.5, "val/nll": 0.4},
    }


def no_temp_files(directory) -> bool:
    return not [p for p in directory.rglob("*") if p.name.endswith(".tmp")]


# --- 1. unreadable results.json, tuned.json and failure records -------------------------------------------


def test_a_truncated_results_json_is_named_with_its_position_and_the_fix(tmp_path):
    path = tmp_path / "run" / "results.json"
    path.parent.mkdir()
    path.write_text('{"method": "sve", "metrics": {"test/acc": 0.9')  # cut short
    with pytest.raises(InputError) as caught:
        read_results(path)
    message = str(caught.value)
    assert str(path) in message and "is not valid JSON" in message and "line 1 column" in message
    assert "cut short" in message and f"delete it (or the run directory {path.parent}) to run that run again" in message
    assert "\n" not in message
    path.write_text("")
    with pytest.raises(InputError, match="is empty .* not valid JSON"):
        read_results(path)
    path.write_text("[1, 2]")
    with pytest.raises(InputError, match="holds a JSON list, not an object"):
        read_results(path)
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(InputError, match="not UTF-8 text"):
        read_results(path)
    path.write_text('{"format": 1, "metrics": {}}')
    assert read_results(path) == {"format": 1, "metrics": {}}


def test_the_sweep_reports_a_corrupt_results_json_once_and_never_as_done(tmp_path, monkeypatch, capsys, caplog):
    calls = []

    def fake_run(job):
        calls.append(job.method)
        return finished(job, {**fake_results(job), "config": {"experiment_name": job.experiment}})

    monkeypatch.setattr(sweep, "run_in_process", fake_run)
    assert sweep_cli.main(["table4", "--smoke", "--results", str(tmp_path)]) == 0
    corrupt = run_dir(tmp_path / "smoke", "cifar100_dino", "sve", 4, 0) / "results.json"
    corrupt.write_text(corrupt.read_text()[:25])  # a disk that filled while it was copied
    calls.clear()
    capsys.readouterr()
    with caplog.at_level(logging.WARNING):
        assert sweep_cli.main(["table4", "--smoke", "--results", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert calls == []  # not retrained behind the user's back, nor counted as done
    failed = [line for line in out.splitlines() if "FAILED" in line]
    assert len(failed) == 1 and "sve M=4 seed 0: FAILED:" in failed[0], out
    assert f"{corrupt} (25 bytes) is not valid JSON" in failed[0] and "delete it (or the run directory" in failed[0]
    assert "done earlier" not in failed[0] and "Traceback" not in out
    assert not [r for r in caplog.records if str(corrupt) in r.getMessage()]  # the tables do not say it again
    assert "not valid JSON" in json.loads((corrupt.parent / "failed.json").read_text())["error"]
    # Doing what it says: the run trains again, and its failure record goes.
    corrupt.unlink()
    assert sweep_cli.main(["table4", "--smoke", "--results", str(tmp_path)]) == 0
    assert calls == ["sve"] and not (corrupt.parent / "failed.json").exists()


def test_the_tables_skip_a_corrupt_results_json_with_a_warning_naming_it(tmp_path, caplog):
    path = run_dir(tmp_path, "exp_a", "sve", 4, 0) / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"method": "sve", "seed"')
    from sve.paper.store import load_runs

    with caplog.at_level(logging.WARNING):
        assert load_runs(tmp_path) == []
    [record] = [r for r in caplog.records if str(path) in r.getMessage()]
    assert "not valid JSON" in record.getMessage() and "to run that run again" in record.getMessage()


@pytest.mark.parametrize("metrics", [[0.5], None, "absent"])
def test_the_tables_skip_a_results_json_whose_metrics_are_not_an_object(metrics, tmp_path, caplog):
    # Valid JSON, but no metrics object (edited by hand, or another tool's file): a list must not stop every table
    # (an AttributeError), and a missing one must not leave the cell to the other seeds without a word.
    path = run_dir(tmp_path, "exp_a", "sve", 4, 0) / "results.json"
    path.parent.mkdir(parents=True)
    results = {"method": "sve", "ensemble_size": 4, "seed": 0, "experiment": "exp_a", "metrics": metrics}
    if metrics == "absent":
        del results["metrics"]
    write_json(path, results)
    from sve.paper.store import load_runs

    with caplog.at_level(logging.WARNING):
        assert load_runs(tmp_path) == []
    [record] = [r for r in caplog.records if str(path) in r.getMessage()]
    assert "not the results of a run" in record.getMessage() and '"metrics"' in record.getMessage()


def test_a_corrupt_or_foreign_tuned_json_fails_its_row_and_says_to_delete_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sweep, "run_in_process", lambda job: finished(job, fake_results(job)))
    monkeypatch.setattr(sweep, "build", lambda *args, **kwargs: [])
    assert sweep_cli.main(["mini_table2", "--smoke", "--results", str(tmp_path)]) == 0
    tuned = run_dir(tmp_path / "smoke", "mini_sst2_minilm", "sve", 4, 0).parent / "tuned.json"
    assert json.loads(tuned.read_text())["key"] == "method.lr"  # written atomically, as before
    tuned.write_text('{"key": "method.lr", "val')
    failures = sweep.sweep("mini_table2", smoke=True, root=tmp_path)
    assert any(f"{tuned}" in f and "not valid JSON" in f and "delete it to choose again" in f for f in failures)
    assert any("not run, its row has no tuned method.lr" in f for f in failures)  # the sweep went on
    tuned.write_text(json.dumps({"key": "optimizer.weight_decay", "value": "0.1"}))
    failures = sweep.sweep("mini_table2", smoke=True, root=tmp_path)
    assert any(
        "chose optimizer.weight_decay=0.1 over [], but the table tunes method.lr starting from" in f for f in failures
    )


def test_sweep_and_multirun_write_one_failure_record_that_the_summary_reads(tmp_path, monkeypatch):
    def fake_run(job):
        if job.method == "svf":
            raise RuntimeError("boom")
        return finished(job, fake_results(job))

    monkeypatch.setattr(sweep, "run_in_process", fake_run)
    monkeypatch.setattr(sweep, "build", lambda *args, **kwargs: [])
    sweep.sweep("table4", smoke=True, root=tmp_path)
    failed = run_dir(tmp_path / "smoke", "cifar100_dino", "svf", 1, 0)
    assert not (failed / "error.txt").exists()
    record = json.loads((failed / "failed.json").read_text())
    assert record["error"] == "RuntimeError: boom" and "Traceback" in record["traceback"]
    summary = multirun.summarize(failed.parent)  # the multirun summary reads the sweep's record
    assert summary["runs"] == [{"run": "seed0", "state": "failed", "error": "RuntimeError: boom"}]


def test_the_multirun_summary_names_unreadable_results_and_failure_records(tmp_path):
    (tmp_path / "0_run").mkdir()
    (tmp_path / "0_run" / "results.json").write_text('{"metrics": {"test/acc": 0.')
    (tmp_path / "1_run").mkdir()
    (tmp_path / "1_run" / "failed.json").write_text('{"error": "Runt')
    (tmp_path / "2_run").mkdir()
    write_json(tmp_path / "2_run" / "results.json", {"metrics": {"test/acc": 0.5}})
    summary = multirun.summarize(tmp_path)
    states = {r["run"]: r for r in summary["runs"]}
    assert states["0_run"]["state"] == "unreadable" and "is not valid JSON" in states["0_run"]["error"]
    assert "to run that run again" in states["0_run"]["error"]
    assert states["1_run"]["state"] == "failed" and "failure record unreadable" in states["1_run"]["error"]
    assert states["2_run"] == {"run": "2_run", "state": "finished", "test/acc": 0.5}
    assert summary["not_finished"] == ["0_run", "1_run"]


def test_a_finished_run_whose_rerun_was_refused_is_failed_in_the_multirun_summary(tmp_path):
    # A sweep rerun in the same directory with other values (trainer.max_epochs=1 -> 2): each finished run is
    # refused for its other config, and Hydra rewrites its .hydra/overrides.yaml with the new values. The old
    # results.json must not be summarised as this sweep's run, under the new overrides.
    run = tmp_path / "0_sve_m2_seed0"
    (run / ".hydra").mkdir(parents=True)
    write_json(run / "results.json", {"seed": 0, "metrics": {"test/acc": 0.5}})
    (run / ".hydra" / "overrides.yaml").write_text("- trainer.max_epochs=2\n- seed=0\n")
    multirun.record_failure(run, InputError("run directory was started with another config: trainer.max_epochs"))
    summary = multirun.summarize(tmp_path)
    assert summary["runs"][0]["state"] == "failed" and "another config" in summary["runs"][0]["error"]
    assert summary["not_finished"] == ["0_sve_m2_seed0"] and summary["groups"] == []
    # A failure record older than the results (that attempt failed, a later one finished) is not news.
    os.utime(run / multirun.FAILED, ns=(1, 1))
    assert multirun.summarize(tmp_path)["runs"][0]["state"] == "finished"


def test_the_multirun_summary_counts_each_seed_of_a_group_once(tmp_path):
    # A sweep rerun in its directory with a method added renumbers its jobs: seed 1 of sve is trained again as
    # 3_sve_m2_seed1 beside the first sweep's 2_sve_m2_seed1. The group's mean and std take that seed once.
    for name, seed, acc in (("0_sve_m2_seed0", 0, 0.2), ("2_sve_m2_seed1", 1, 0.6), ("3_sve_m2_seed1", 1, 0.6)):
        (tmp_path / name / ".hydra").mkdir(parents=True)
        write_json(tmp_path / name / "results.json", {"seed": seed, "metrics": {"test/acc": acc}})
        (tmp_path / name / ".hydra" / "overrides.yaml").write_text(f"- method=sve\n- seed={seed}\n")
    [group] = multirun.summarize(tmp_path)["groups"]
    assert group["seeds"] == [0, 1] and group["runs"] == 2
    assert group["metrics"]["test/acc"]["mean"] == pytest.approx(0.4)
    assert group["metrics"]["test/acc"]["std"] == pytest.approx(0.2 * 2**0.5)
    assert group["repeated_seeds_left_out"] == ["3_sve_m2_seed1"]


# --- 2. a disk that fills while writing ---------------------------------------------------------------------


def predictions(n: int = 50) -> Predictions:
    return Predictions(torch.randn(2, n, 3), torch.arange(n) % 3, torch.arange(n))


def enospc(*args, **kwargs):
    file = args[0]
    file.write(b"PK\x03\x04 partial")  # some bytes reach the disk, then it is full
    raise OSError(errno.ENOSPC, "No space left on device")


def test_predictions_on_a_full_disk_are_one_error_and_leave_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "predictions" / "test.npz"
    write_predictions(path, predictions(), "probs", float16_above_mb=256)
    before = path.read_bytes()
    monkeypatch.setattr(np, "savez", enospc)
    with pytest.raises(InputError) as caught:
        write_predictions(path, predictions(), "probs", float16_above_mb=256)
    message = str(caught.value)
    assert message.startswith(f"{path}: not written: no space left on the device (ENOSPC)")
    assert "it needed about" in message and "free" in message and "the previous test.npz is unchanged" in message
    assert path.read_bytes() == before and no_temp_files(tmp_path)
    with pytest.raises(InputError, match="no partial file was left"):
        write_predictions(tmp_path / "predictions" / "val.npz", predictions(), "probs", float16_above_mb=256)
    assert not (tmp_path / "predictions" / "val.npz").exists() and no_temp_files(tmp_path)


class FullDisk:
    """A file whose writes fail with ``code`` after the first few bytes."""

    def __init__(self, file, code: int):
        self.file, self.code = file, code

    def write(self, data):
        self.file.write(data[:10])
        raise OSError(self.code, os.strerror(self.code))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


@pytest.mark.parametrize(
    "code, reason",
    [
        (errno.ENOSPC, "no space left on the device (ENOSPC)"),
        (errno.EDQUOT, "the disk quota is exceeded (EDQUOT)"),
        (errno.EROFS, "the file system is read-only (EROFS)"),
        (errno.EACCES, "permission denied (EACCES)"),
    ],
)
def test_results_json_on_a_full_disk_is_one_error_and_leaves_the_previous_file(code, reason, tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    write_json(path, {"metrics": {"test/acc": 0.5}})
    before = path.read_bytes()
    monkeypatch.setattr(writable, "open", lambda p, mode: FullDisk(open(p, mode), code), raising=False)
    with pytest.raises(InputError) as caught:
        write_json(path, {"metrics": {"test/acc": 0.6}})
    message = str(caught.value)
    assert message.startswith(f"{path}: not written: {reason}; it needed about ")
    assert f"the file system holding {tmp_path} has" in message and "bytes" in message
    assert path.read_bytes() == before and no_temp_files(tmp_path)


def test_any_error_while_writing_removes_the_temporary_file(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        args[0].write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_predictions(tmp_path / "test.npz", predictions(), "probs", float16_above_mb=256)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(writable, "open", lambda p, mode: FullDisk(open(p, mode), errno.EIO), raising=False)
    with pytest.raises(OSError) as caught:  # not one the user can fix: raised as it is
        write_json(tmp_path / "results.json", {"a": 1})
    assert caught.value.errno == errno.EIO and not isinstance(caught.value, InputError)
    assert list(tmp_path.iterdir()) == []


# --- 3. read-only run directories ----------------------------------------------------------------------------


def test_check_writable_names_the_directory_and_the_reason(tmp_path, monkeypatch):
    fresh = tmp_path / "a" / "b"
    check_writable(fresh, "run directory")  # created, probed, left empty
    assert fresh.is_dir() and list(fresh.iterdir()) == []

    def refused(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(writable.os, "open", refused)  # as a read-only directory refuses (root ignores chmod)
    with pytest.raises(InputError) as caught:
        check_writable(fresh, "run directory")
    message = str(caught.value)
    assert message.startswith(f"run directory {fresh} is not writable: permission denied (EACCES)")
    assert "hydra.run.dir=" in message
    monkeypatch.undo()
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="is a file, not a directory"):
        check_writable(tmp_path / "file", "run directory")


def test_check_writable_on_a_directory_without_write_permission(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("chmod does not take write permission away here (running as root)")
        with pytest.raises(InputError, match=rf"run directory {locked} is not writable: permission denied"):
            check_writable(locked, "run directory")
        with pytest.raises(InputError, match=r"is not writable: permission denied \(EACCES\)"):
            check_writable(locked / "sub", "run directory")  # cannot be created either
    finally:
        locked.chmod(0o700)


# --- 4. evaluate.py on a run this code can no longer build -----------------------------------------------------


def fake_run_dir(tmp_path, commit: str | None = "abc1234-dirty", **changes):
    """A run directory with the results.json of a tiny SVE run (its resolved config) and a checkpoint file
    that reads as one; ``changes``: dotted config keys set before it is written."""
    cfg = compose_cfg(["method=sve", "ensemble_size=2", "backbone=tiny_vit", "dataset=synthetic_image"], tmp_path)
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    write_json(
        tmp_path / "results.json",
        {"metrics": {}, "git_commit": commit, "config": OmegaConf.to_container(cfg, resolve=True)},
    )
    (tmp_path / "checkpoints").mkdir()
    torch.save({"state_dict": {}, "loops": {}}, tmp_path / "checkpoints" / "final.ckpt")
    return tmp_path


def test_evaluate_names_a_config_key_the_code_no_longer_has(tmp_path):
    run = fake_run_dir(tmp_path, **{"method.foo": 3})
    with pytest.raises(InputError) as caught:
        evaluate_run(run)
    message = str(caught.value)
    assert message.startswith(f"run_dir={run}: the run's config sets method.foo=3, which sve.methods.SVE does not take")
    assert "'sigma_init'" in message and "'svd_cache'" in message  # the valid keys, from the signature
    assert "git checkout abc1234 (results.json git_commit abc1234-dirty: trained with uncommitted changes" in message
    assert "\n" not in message
    with pytest.raises(
        InputError,
        match=r"the overrides set method.bar=1, which sve.methods.SVE does not take "
        r"\(its keys: .*\); remove or correct that override$",
    ):
        evaluate_run(run, ["~method.foo", "+method.bar=1"])


def test_evaluate_names_a_target_that_cannot_be_imported(tmp_path):
    run = fake_run_dir(tmp_path, commit=None, **{"dataset.ood": {"_target_": "sve.data.GoneData", "seed": 1}})
    with pytest.raises(InputError) as caught:
        evaluate_run(run)
    message = str(caught.value)
    assert "the run's config sets dataset.ood._target_='sve.data.GoneData', which this code cannot import" in message
    assert "records no git_commit" in message


def requires_x(x, **kwargs):
    """A target whose signature a config cannot be checked against (``**kwargs``) and that needs ``x``."""
    return x


def test_evaluate_names_a_config_that_no_longer_builds(tmp_path):
    run = fake_run_dir(tmp_path, **{"backbone._target_": "tests.paper.test_store_errors.requires_x"})
    with pytest.raises(
        InputError,
        match=rf"run_dir={run}: the run's config does not build with this code .*"
        r"missing 1 required positional argument: 'x'.*git checkout abc1234",
    ):
        evaluate_run(run)


def test_evaluate_names_an_unreadable_results_json_config_or_checkpoint(tmp_path):
    run = fake_run_dir(tmp_path)
    (run / "results.json").write_text('{"config": {"method": ')
    with pytest.raises(InputError, match=rf"{run / 'results.json'} .*is not valid JSON"):
        evaluate_run(run)
    (run / "results.json").unlink()
    (run / ".hydra").mkdir()
    (run / ".hydra" / "config.yaml").write_text("method: {name: sve\n  bad: [")
    with pytest.raises(InputError, match=rf"{run / '.hydra' / 'config.yaml'} is not a readable config"):
        evaluate_run(run)
    (run / ".hydra" / "config.yaml").write_text("seed: 0\n")
    with pytest.raises(
        InputError,
        match=r"config.yaml is not a training config of this framework: it lacks "
        r"\['paths', 'trainer', 'backbone', 'dataset', 'method'\]",
    ):
        evaluate_run(run)
    run = fake_run_dir(tmp_path / "other")
    (run / "checkpoints" / "final.ckpt").write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(InputError, match=r"final.ckpt \(\d+ bytes\) is not a readable checkpoint"):
        evaluate_run(run)
    with pytest.raises(InputError, match="no such directory"):
        evaluate_run(tmp_path / "nowhere")


def test_evaluate_on_a_read_only_run_directory_says_to_copy_it(tmp_path, monkeypatch):
    run = fake_run_dir(tmp_path)

    def refused(path, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(writable.os, "open", refused)
    with pytest.raises(
        InputError,
        match=rf"run_dir {run} is not writable: the file system is read-only \(EROFS\); "
        "pick another directory \\(copy the run directory",
    ):
        evaluate_run(run)


# --- 5. the rest of the store ----------------------------------------------------------------------------------


def test_a_store_that_is_a_file_or_read_only_is_refused_before_any_run(tmp_path, monkeypatch):
    store = tmp_path / "store"
    store.write_text("")
    with pytest.raises(InputError, match=rf"--results: the result store {store} is a file, not a directory"):
        sweep.sweep("table4", smoke=False, root=store)
    monkeypatch.setattr(
        writable.os,
        "open",
        lambda path, *a, **k: (_ for _ in ()).throw(PermissionError(errno.EACCES, "Permission denied", str(path))),
    )
    with pytest.raises(
        InputError,
        match=r"the result store .* is not writable: permission denied \(EACCES\); "
        r"pick another directory \(--results <a writable directory>\)",
    ):
        sweep.sweep("table4", smoke=True, root=tmp_path / "other")


def test_an_unknown_table_names_the_choices():
    with pytest.raises(InputError, match=r"'nope' is not a table; choose one of \[.*'table1'"):
        load_spec("nope")


def test_a_corrupt_benchmark_file_is_named_with_how_to_measure_again(tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "table5.json").write_text('{"methods": {"single": {"parameters": 1')
    with pytest.raises(
        InputError,
        match=r"table5.json \(\d+ bytes\) is not valid JSON.*"
        r"sve-sweep table5 --measure",
    ):
        build("table5", root=tmp_path)
    (tmp_path / "bench" / "table5.json").write_text('{"methods": {"sve": {}}}')
    with pytest.raises(InputError, match=r"is not a benchmark file of this framework \(KeyError: 'single'\)"):
        build("table5", root=tmp_path)


def test_an_unreadable_predictions_file_is_named(tmp_path):
    path = tmp_path / "test.npz"
    write_predictions(path, predictions(), "probs", float16_above_mb=256)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(InputError, match=rf"{path} \(100 bytes\) is not a readable predictions file"):
        read_predictions(path)
    np.save(tmp_path / "bare.npy", np.zeros(3))
    with pytest.raises(InputError, match="is not a readable predictions file"):
        read_predictions(tmp_path / "bare.npy")


def test_a_torn_sittings_line_is_named_and_a_lost_record_is_a_warning(tmp_path, capsys):
    (tmp_path / "sittings.jsonl").write_text('{"started": 1, "finished": 2}\n{"started": 3, "fini\n')
    with pytest.raises(InputError, match=r"sittings.jsonl:2 is not a record of a sitting"):
        sittings.recorded_runs(tmp_path)
    job = sweep_jobs.Job("exp", "sve", 4, 0, [], tmp_path / "runs" / "x")
    sittings.record_run(tmp_path / "missing", job, 0.0)  # cannot be appended to: the run's results stand
    assert "warning: the sitting of exp sve M=4 seed 0 was not recorded" in capsys.readouterr().out


def test_a_stored_json_file_read_through_read_json_names_itself(tmp_path):
    with pytest.raises(UnreadableFile, match=rf"{tmp_path / 'absent.json'} cannot be read: .*ENOENT.*; do this"):
        read_json(tmp_path / "absent.json", "do this")


def test_sweep_py_prints_one_error_line(tmp_path):
    store = tmp_path / "store"
    store.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "sve.cli.sweep", "table4", "--results", str(store)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: --results: the result store {store} is a file, not a directory; name a directory")
    )


def test_diagnostics_teachers_and_smoke_runs_are_never_table_cells(tmp_path):
    from sve.paper.store import load_runs

    run = {"experiment": "exp", "method": "sve", "num_members": 4, "seed": 0, "metrics": {}}
    for part in ("runs", "diagnostics", "teachers", "smoke"):  # a diagnostic is the same row at another rate
        (tmp_path / part / "exp" / "sve_m4" / "seed0").mkdir(parents=True)
        (tmp_path / part / "exp" / "sve_m4" / "seed0" / "results.json").write_text(json.dumps(run))
    assert [r.path.relative_to(tmp_path).parts[0] for r in load_runs(tmp_path)] == ["runs"]


def test_sve_tables_refuses_a_store_that_is_not_there(tmp_path, capsys):
    # A typo in --results built a fresh directory of all-"–" tables, which read as a store without runs.
    from sve.cli.tables import main

    missing = tmp_path / "reslts"
    with pytest.raises(SystemExit) as stop:
        main(["--results", str(missing)])
    assert stop.value.code == 2 and not missing.exists()
    assert f"--results {missing}: no such directory" in capsys.readouterr().err
