"""The command line answers a mistake in one line before torch is imported, its --help lists the config groups
and keys, and a refused run leaves nothing behind."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from sve.cli.configs import NOT_RUN_GROUPS, compose_error, groups, main_keys
from sve.errors import InputError, did_you_mean
from tests.conftest import CONFIGS, ROOT
from tests.helpers import run_main

COMMANDS = {
    "sve-train": "train",
    "sve-eval": "evaluate",
    "sve-generate": "generate",
    "sve-sweep": "sweep",
    "sve-tables": "tables",
    "sve-distill": "distill",
    "sve-bench": "bench",
}


def composition_error(overrides: list[str]) -> str:
    """What sve-train says about ``overrides`` that Hydra cannot compose."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        try:
            compose("train", overrides=overrides)
        except Exception as err:  # noqa: BLE001 - Hydra's composition error, to be rewritten
            rewritten = compose_error(err)
            assert rewritten is not None, err
            return str(rewritten)
    raise AssertionError(f"{overrides} composed")


def command(name: str, *args: str, cwd: Path = ROOT) -> tuple[int, str, str, bool, float]:
    """(exit status, stdout, stderr, whether torch was imported, seconds) of the console script ``name`` run in
    a fresh interpreter, as its entry point runs it."""
    code = (
        f"import sys, runpy; sys.argv = [{name!r}] + sys.argv[1:]\n"
        "try:\n    runpy.run_module('sve.cli." + COMMANDS[name] + "', run_name='__main__')\n"
        "except SystemExit as stop:\n    code = stop.code\nelse:\n    code = 0\n"
        "print('TORCH', 'torch' in sys.modules, file=sys.stderr)\nsys.exit(code)"
    )
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    seconds = time.perf_counter() - start
    stderr = done.stderr.replace("TORCH True\n", "").replace("TORCH False\n", "")
    return done.returncode, done.stdout, stderr, "TORCH True" in done.stderr, seconds


# ----- Hydra's composition errors, one line with "did you mean" ------------------------------------------------


@pytest.mark.parametrize(
    "override, said",
    [
        ("method=sev", "method=sev: no such option (did you mean sve?); the options of method are: batch_ensemble"),
        ("backbone=bert_bsae", "backbone=bert_bsae: no such option (did you mean bert_base?)"),
        ("trainer=gpuu", "trainer=gpuu: no such option (did you mean gpu?)"),
        ("experiment=mini_sst2_mnilm", "experiment=mini_sst2_mnilm: no such option (did you mean mini_sst2_minilm?)"),
        ("dataset=cifar1000", "dataset=cifar1000: no such option (did you mean cifar100?)"),
    ],
)
def test_an_unknown_option_of_any_group_names_it_the_closest_and_every_option(override, said):
    message = composition_error([override])
    assert message.startswith(said) and "\n" not in message and "search path" not in message.lower()
    group = override.split("=")[0]
    assert message.endswith(", ".join(groups()[group]))


def test_a_key_not_in_the_struct_is_named_with_the_keys_there_and_not_the_plus_that_would_hide_it():
    message = composition_error(["dataset=image_folder", "dataset.roots=/data"])
    assert message.startswith("dataset.roots: no such key (did you mean root?); dataset has: _target_, name, root,")
    assert "+dataset.roots" not in message and "\n" not in message
    assert composition_error(["ensembel_size=2"]).startswith("ensembel_size: no such key (did you mean ensemble_size?)")
    assert composition_error(["trainer.max_epoch=2"]).startswith(
        "trainer.max_epoch: no such key (did you mean max_epochs?)"
    )
    assert composition_error(["methd=sve"]).startswith("methd: no such key (did you mean method?)")


def test_did_you_mean_prefers_a_swap_of_two_letters():
    # difflib's ratio ranks sev as close to svf as to sve.
    assert did_you_mean("sev", ["single", "svf", "sve"]) == " (did you mean sve?)"
    assert did_you_mean("zzz", ["sve"]) == ""


def test_sve_train_answers_a_bad_option_in_one_line_without_torch_and_creates_nothing(tmp_path):
    for args, said in (
        (["method=sev"], "error: method=sev: no such option (did you mean sve?)"),
        (["-m", "method=sve,sev"], "error: method=sev: no such option (did you mean sve?)"),
        (["dataset=image_folder", "dataset.roots=x"], "error: dataset.roots: no such key (did you mean root?)"),
        (
            ["dataset=image_folder", f"dataset.root={tmp_path}/absent"],
            f"error: dataset image_folder: dataset.root={tmp_path}/absent: no such file or directory",
        ),
        (["plan=true", "plan_memory_gib=-1"], "error: plan_memory_gib=-1 is not valid"),
        (["plan=true", "plan_memory_gib=abc"], "error: plan_memory_gib='abc' is not valid"),
    ):
        code, out, err, torch, _ = command("sve-train", *args, cwd=tmp_path)
        assert code == 2 and err.startswith(said) and err.count("\n") == 1, (args, out, err)
        assert not torch, args
    assert list(tmp_path.iterdir()) == []  # no outputs/.../<time>/ of a refused run


# ----- --help ----------------------------------------------------------------------------------------------------


def test_every_command_answers_help_without_torch_with_its_options():
    said, seconds = {}, {}
    for name in COMMANDS:
        code, out, err, torch, seconds[name] = command(name, "--help")
        assert code == 0 and not torch and not err.strip(), (name, out[-2000:], err[-2000:])
        said[name] = out
    print("--help seconds:", {k: round(v, 2) for k, v in seconds.items()})
    assert "Works on an empty store" in said["sve-tables"]  # the whole description, not its first line
    assert "update_results=" in said["sve-eval"] and "dataset: " in said["sve-eval"]
    assert "method:" not in said["sve-eval"]  # the trained run's: not an option of an evaluation
    assert "objective" in said["sve-distill"] and "student=<option of configs/method>: " in said["sve-distill"]
    assert "prompts_file=" in said["sve-generate"] and "num_samples=" in said["sve-generate"]
    assert "--parts" in said["sve-bench"] and "--rows" in said["sve-sweep"]


def test_sve_train_help_lists_every_group_directory_with_its_options_and_every_key_with_a_line():
    code, out, err, torch, _ = command("sve-train", "--help")
    assert code == 0 and not torch
    lines = out.splitlines()
    directories = {p.parent.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.yaml")} - {"."}
    run_groups = {d for d in directories if d.split("/")[0] not in NOT_RUN_GROUPS}
    train_groups = {next(iter(e)) for e in OmegaConf.load(CONFIGS / "train.yaml").defaults if not isinstance(e, str)}
    assert train_groups <= run_groups
    for group in run_groups:
        line = next((line for line in lines if line.startswith(f"  {group}")), None)
        assert line is not None, f"configs/{group}/ is not listed by sve-train --help"
        assert all(p.stem in line for p in (CONFIGS / group).glob("*.yaml")), line
    for key, _, text in main_keys():
        assert text, f"train.yaml's {key} has no comment to describe it in --help"
        line = next(line for line in lines if line.startswith(f"  {key}"))
        assert len(line) <= 120, line


# ----- the other commands' mistakes -------------------------------------------------------------------------------


def test_sve_eval_refuses_an_added_key_that_nothing_reads():
    from sve.runs.eval_config import apply_overrides
    from tests.conftest import compose_cfg

    cfg = compose_cfg([])
    with pytest.raises(InputError, match=r"^\+datset.root: the run's config has no datset \(did you mean dataset\?\)"):
        apply_overrides(cfg, ["+datset.root=/data"])
    assert apply_overrides(cfg, ["+dataset.ood=null"]).dataset.ood is None  # an added key of a known node passes


def test_a_table_file_with_a_yaml_syntax_error_is_one_line_naming_the_file_and_line(tmp_path):
    from sve.paper.store import load_spec

    path = tmp_path / "mine.yaml"
    path.write_text("kind: metrics\nexperiments: [a, b\nrows: x\n")
    with pytest.raises(InputError) as caught:
        load_spec(str(path))
    assert str(caught.value).startswith(f"{path}:3: not valid YAML (expected ',' or ']', but got ':')")
    assert "\n" not in str(caught.value)


# ----- a refused run leaves nothing behind --------------------------------------------------------------------


def refuse(cfg, values_checked=False):
    raise InputError("dataset.root=/x lacks train/")


def test_a_run_refused_after_hydra_started_removes_the_directory_it_created(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_main(monkeypatch, [], refuse) == 2
    assert list(tmp_path.iterdir()) == []  # not even the empty outputs/<dataset>/<method>/<backbone>/


def test_a_refused_run_keeps_a_directory_that_was_there_or_that_it_wrote_into(tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    assert run_main(monkeypatch, [f"hydra.run.dir={mine}"], refuse) == 2
    assert mine.is_dir() and (mine / ".hydra").is_dir()

    def writes_then_refuses(cfg, values_checked=False):
        (Path(cfg.paths.output_dir) / "checkpoints").mkdir()
        refuse(cfg)

    fresh = tmp_path / "fresh" / "run"
    assert run_main(monkeypatch, [f"hydra.run.dir={fresh}"], writes_then_refuses) == 2
    assert (fresh / "checkpoints").is_dir()


# ----- quiet by default -----------------------------------------------------------------------------------------

NOISE = (
    "`torch.jit.script` is deprecated",
    "`isinstance(treespec, LeafSpec)` is deprecated",
    "backend not available",
    "💡 Tip:",
    "GPU available: ",
    "TPU available: ",
)


def test_a_tiny_run_prints_none_of_the_libraries_notices(tmp_path):
    code, out, err, _, _ = command(
        "sve-train", "trainer=debug", "callbacks=none", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path
    )
    assert code == 0, err[-3000:]
    assert (tmp_path / "run" / "results.json").is_file()
    for notice in NOISE:
        assert notice not in out + err, notice


def test_sve_verbose_keeps_the_notices(monkeypatch):
    import warnings

    from sve.cli import quiet

    def shown() -> list[str]:
        seen = []

        class Keep(logging.Handler):
            def emit(self, record):
                seen.append(record.getMessage())

        handler = Keep()
        lightning = logging.getLogger("pytorch_lightning.utilities.rank_zero")
        lightning.addHandler(handler)
        lightning.setLevel(logging.INFO)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")  # not once per place: each call counts
                quiet.hide_noise()
                warnings.warn("`torch.jit.script` is deprecated. Please switch", FutureWarning, stacklevel=1)
                warnings.warn("the learning rate is large", FutureWarning, stacklevel=1)  # not noise: kept
                lightning.info("💡 Tip: For seamless cloud uploads, try installing litmodels")
                lightning.info("Seed set to 0")
        finally:
            lightning.removeHandler(handler)
            for f in [f for f in lightning.filters if isinstance(f, quiet.Noise)]:
                lightning.removeFilter(f)
        return [str(w.message) for w in caught] + seen

    monkeypatch.setenv("SVE_VERBOSE", "1")
    assert len(shown()) == 4
    monkeypatch.delenv("SVE_VERBOSE")
    assert shown() == ["the learning rate is large", "Seed set to 0"]


def test_every_runs_device_lines_load_report_and_logging_interval_notice_are_hidden_unless_verbose(monkeypatch):
    # Lightning's GPU/TPU lines and its logging-interval notice, and transformers' LOAD REPORT, would come on
    # every run and say nothing about it. What does (a GPU left unused, another warning) stays.
    import warnings

    from sve.cli import quiet

    loggers = [logging.getLogger(n) for n in ("pytorch_lightning.utilities.rank_zero", "transformers.modeling_utils")]

    def shown() -> list[str]:
        seen = []

        class Keep(logging.Handler):
            def emit(self, record):
                seen.append(record.getMessage())

        handler = Keep()
        for logger in loggers:
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
        lightning, transformers = loggers
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                quiet.hide_noise()
                warnings.warn(
                    "The number of training batches (2) is smaller than the logging interval "
                    "Trainer(log_every_n_steps=50). Set a lower value for log_every_n_steps",
                    UserWarning,
                    stacklevel=1,
                )
                lightning.info("GPU available: False, used: False")
                lightning.info("TPU available: False, using: 0 TPU cores")
                lightning.warning("GPU available but not used. You can set it by doing `Trainer(accelerator='gpu')`.")
                transformers.warning("\x1b[1mBertModel LOAD REPORT\x1b[0m from: /w\nKey | Status\npooler | UNEXPECTED")
        finally:
            for logger in loggers:
                logger.removeHandler(handler)
                for f in [f for f in logger.filters if isinstance(f, quiet.Noise)]:
                    logger.removeFilter(f)
        return [str(w.message) for w in caught] + seen

    monkeypatch.setenv("SVE_VERBOSE", "1")
    assert len(shown()) == 5
    monkeypatch.delenv("SVE_VERBOSE")
    assert [line[:26] for line in shown()] == ["GPU available but not used"]


def test_the_progress_bar_counts_the_epochs_that_run_and_lightnings_flops_summary_is_off(tmp_path):
    # Lightning's own bar said "Epoch 1/1" in the second of two epochs, and its summary "Total FLOPs: 0".
    import pytorch_lightning as pl

    from sve.runs.run import make_trainer
    from sve.training.progress import EpochProgressBar
    from tests.conftest import compose_cfg

    cfg = compose_cfg(["trainer=cpu", "trainer.max_epochs=2"], tmp_path)
    trainer = make_trainer(cfg, logger=False, callbacks=[])
    bars = [c for c in trainer.callbacks if isinstance(c, pl.callbacks.ProgressBar)]
    assert len(bars) == 1 and isinstance(bars[0], EpochProgressBar)
    bars[0].setup(trainer, None, "fit")  # where Lightning gives a callback its trainer
    assert [bars[0]._get_train_description(e).strip() for e in (0, 1)] == ["Epoch 1/2", "Epoch 2/2"]
    assert not any(isinstance(c, pl.callbacks.ModelSummary) for c in trainer.callbacks)
    cfg = compose_cfg(["trainer=cpu", "+trainer.enable_model_summary=true"], tmp_path)  # asked for: kept
    assert any(isinstance(c, pl.callbacks.ModelSummary) for c in make_trainer(cfg, False, []).callbacks)


def test_the_progress_bar_shows_seconds_per_step_and_time_left_when_steps_are_slow():
    # Rich's speed is over its last 30 s: at 26-36 s a step, Lightning's bar said 0.00it/s and no time left.
    from rich.progress import Progress

    from sve.training.progress import EpochProgressBar, PaceColumn, TimeLeftColumn

    columns = EpochProgressBar().configure_columns(trainer=None)
    assert sum(isinstance(c, PaceColumn | TimeLeftColumn) for c in columns) == 2
    assert not any(type(c).__name__ in ("ProcessingSpeedColumn", "CustomTimeColumn") for c in columns)
    progress = Progress(*columns[-2:], auto_refresh=False, get_time=lambda: 23 * 30.0)
    progress.add_task("Epoch 1/1", total=48)
    task = progress.tasks[0]
    task.start_time, task.completed = 0.0, 23  # 23 steps of 30 s done, 25 to go
    texts = [str(c.render(task)) for c in columns[-2:]]
    assert texts == ["0:11:30 • 0:12:30", "30.0s/it"]
    task.completed = 0
    assert [str(c.render(task)) for c in columns[-2:]] == ["0:11:30 • -:--:--", "–s/it"]
