"""``run(cfg) -> results``: what ``train.py`` and the tests call. Checks the config, builds backbone, data,
method, module and trainer from it, trains (resuming from the run directory's checkpoint when it has one),
runs the method's post-training step, writes ``checkpoints/final.ckpt`` (when the run keeps checkpoints),
evaluates on every evaluation set (``sve.runs.evaluation``: predictions under ``predictions/``, metrics, shift),
and writes ``results.json`` to the run directory, which no other live run may use at the same time.

Under DDP every rank runs all of this; only rank 0 writes files."""

from __future__ import annotations

import logging
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import hydra
import numpy as np
import pytorch_lightning as pl
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.utilities.exceptions import SIGTERMException

import sve.runs.resolvers  # noqa: F401 - ${package:} and ${run_id:} for every config composed here
from sve.api.adapter_files import ADAPTER, write_adapter
from sve.errors import InputError, RunInterrupted
from sve.layers.singular_values import save_singular_values
from sve.methods import registry
from sve.paths import CONFIGS
from sve.runs.evaluation import evaluate
from sve.runs.probe import probe
from sve.runs.results import format_table, git_commit, read_results, run_record, write_json
from sve.runs.rundir import (
    RUN_CONFIG,
    claim,
    config_changes,
    describe_changes,
    global_rank,
    read_run_config,
    remember_config,
)
from sve.runs.validate import check_config
from sve.training.allocator import set_cpu_allocator
from sve.training.checkpoint import FILENAME, FINAL, LastCheckpoint, read_checkpoint, save_final
from sve.training.curves import LearningCurve
from sve.training.loggers import CSVLogger
from sve.training.module import EnsembleModule
from sve.training.sharding import is_sharded, unshard_method

log = logging.getLogger(__name__)


def instantiate(node: DictConfig, **kwargs):
    """``hydra.utils.instantiate`` without the ``name`` key that every group option carries."""
    resolved = OmegaConf.to_container(node, resolve=True)  # interpolations need the root config
    resolved.pop("name", None)
    # _convert_="all": targets get plain lists and dicts, never OmegaConf containers (timm rejects ListConfig).
    return hydra.utils.instantiate(resolved, _convert_="all", **kwargs)


def build(cfg: DictConfig):
    """Instantiates (backbone, datamodule, method, module) from a composed config. The data files are read
    and checked first (``check_data``): a bad file fails before any download or SVD."""
    datamodule = instantiate(cfg.dataset)
    datamodule.check_data()
    backbone = instantiate(cfg.backbone)
    datamodule.attach(backbone)
    method = instantiate(
        cfg.method,
        backbone=backbone,
        ensemble_size=int(cfg.ensemble_size),
        num_classes=datamodule.num_classes,
        task=cfg.dataset.name,  # a pretrained head is reused only for the task it was trained on
    )
    module = EnsembleModule(
        method,
        optimizer=hydra.utils.instantiate(cfg.optimizer),
        scheduler=hydra.utils.instantiate(cfg.scheduler) if cfg.get("scheduler") else None,
        aggregate=cfg.aggregate,
        draw_seed=int(cfg.seed),
        exact_draws=bool(cfg.get("exact_draws", True)),
    )
    return backbone, datamodule, method, module


def make_loggers(cfg: DictConfig):
    """The config's logger, with the CSV log of ``logger=csv`` first beside any other (the budget report and
    the learning-curve figures read it); False without one."""
    if not cfg.get("logger"):
        return False
    logger = hydra.utils.instantiate(cfg.logger)
    if isinstance(logger, CSVLogger):
        return logger
    csv = OmegaConf.load(CONFIGS / "logger" / "csv.yaml")
    csv.save_dir = str(cfg.paths.output_dir)
    return [hydra.utils.instantiate(csv), logger]


def make_trainer(cfg: DictConfig, logger, callbacks: list) -> pl.Trainer:
    # Checkpoints only where the callbacks config asks for them (Lightning would otherwise add its own).
    checkpointing = any(isinstance(c, pl.callbacks.Checkpoint) for c in callbacks)
    if cfg.trainer.get("enable_progress_bar", True) and not any(
        isinstance(c, pl.callbacks.ProgressBar) for c in callbacks
    ):
        from sve.training.progress import EpochProgressBar

        callbacks = [*callbacks, EpochProgressBar()]
    # Lightning's model summary is off unless the trainer config asks for it: the method logs its own (trainable
    # parameters against the backbone's, sve.methods.base.log_summary), and Lightning's adds a FLOPs column that
    # reads 0 for every model it cannot trace.
    summary = bool(cfg.trainer.get("enable_model_summary", False))
    return hydra.utils.instantiate(
        cfg.trainer,
        logger=logger,
        callbacks=callbacks,
        enable_checkpointing=checkpointing,
        enable_model_summary=summary,
    )


def resume_path(cfg: DictConfig, checkpoint: LastCheckpoint | None) -> str | None:
    """``ckpt_path`` when given, else the run directory's own last checkpoint (a killed or requeued run).
    The checkpoint must be a training checkpoint written with this config (``resume_with_changes=true``
    accepts another one)."""
    path = cfg.get("ckpt_path")
    if path is None and checkpoint is not None and checkpoint.path.exists():
        path = checkpoint.path
        log.info("resuming from %s (this run directory's last checkpoint)", path)
    if path is None:
        return None
    state = read_checkpoint(path)  # a clear error for an empty, truncated or foreign file, before any work
    if "optimizer_states" not in state:
        raise InputError(
            f"ckpt_path={path} holds the trained weights only ({FINAL}: for evaluate.py, which "
            f"re-evaluates a finished run), not a training state to resume; resume from "
            f"{Path(path).with_name(FILENAME)}, or run `python evaluate.py <run dir>`"
        )
    saved = state.get("callbacks", {}).get("LastCheckpoint", {}).get("run_config")
    if saved is not None and not cfg.get("resume_with_changes", False):
        changes = config_changes(saved, run_config(cfg))
        if changes:
            raise InputError(
                f"ckpt_path={path} was written by a run with another config: "
                f"{describe_changes(changes)}. Resume with the values it was started with, start "
                "afresh in another directory (hydra.run.dir=...), or pass resume_with_changes=true "
                "to continue it with these (its optimiser and schedule state stay the checkpoint's)"
            )
    return str(path)


def run_config(cfg: DictConfig) -> dict:
    """The resolved config as a plain dict (what run_config.yaml and checkpoints record)."""
    container = OmegaConf.to_container(cfg, resolve=True)
    container.pop("hydra", None)
    return container


def holds_work(out_dir: Path) -> bool:
    """Whether a run directory has something its config binds: results, or a checkpoint to resume."""
    checkpoints = out_dir / "checkpoints"
    return (out_dir / "results.json").exists() or (checkpoints.is_dir() and any(checkpoints.glob("*.ckpt")))


def check_same_config(cfg: DictConfig, out_dir: Path) -> list | None:
    """A run directory keeps the config it was started with (``run_config.yaml``, else the config in its
    results.json); starting it again with
    another config is refused, naming the keys that differ, unless ``resume_with_changes=true``. Returns
    the accepted changes (recorded in results.json), or None when the directory holds no work (an earlier
    start that failed before its first checkpoint: a wrong data path, say): then the new config replaces the
    record, so correcting a typo and running the same command again works."""
    saved, record = read_run_config(out_dir), out_dir / RUN_CONFIG
    done = out_dir / "results.json"
    if saved is None and done.exists() and read_results(done).get("config"):
        # A run recorded before run_config.yaml existed (or copied without it): its results.json has the config.
        saved, record = {k: v for k, v in read_results(done)["config"].items() if k != "hydra"}, done
    current = run_config(cfg)
    if saved is None or global_rank() != 0:  # rank 0 decides (and has written it for this attempt already)
        return []
    changes = config_changes(saved, current)
    if changes and not holds_work(out_dir):
        log.info(
            "run directory %s holds no checkpoint or results from its earlier start (%s): this config "
            "replaces that start's",
            out_dir,
            describe_changes(changes),
        )
        return None
    if changes and not cfg.get("resume_with_changes", False):
        finished = done.exists()
        raise InputError(
            f"run directory {out_dir} was started with another config ({record}): "
            f"{describe_changes(changes)}. Use the values it was started with, or another directory "
            "(hydra.run.dir=...) to train with these"
            + (
                ". The run has finished: skip_finished=false resume_with_changes=true continues its trained model "
                "with these values (e.g. more epochs), recorded in results.json"
                if finished
                else ", or resume_with_changes=true to continue its checkpoint with these"
            )
        )
    return [list(change) for change in changes]


def planned_epochs(trainer: pl.Trainer, datamodule) -> int:
    """The epochs this schedule trains: ``max_epochs``, or fewer when ``max_steps`` ends it first."""
    datamodule.setup()
    steps_per_epoch = -(-len(datamodule.splits["train"]) // datamodule.batch_size)
    limit = trainer.limit_train_batches
    if isinstance(limit, int) or (isinstance(limit, float) and limit > 1):
        steps_per_epoch = min(steps_per_epoch, int(limit) // trainer.accumulate_grad_batches or 1)
    epochs = trainer.max_epochs if trainer.max_epochs not in (None, -1) else float("inf")
    if trainer.max_steps not in (None, -1):
        epochs = min(epochs, -(-trainer.max_steps // steps_per_epoch))
    return int(epochs) if epochs != float("inf") else 2**31


def prediction_options(cfg: DictConfig) -> dict:
    """How predictions are saved (``predictions`` in configs/train.yaml; defaults for configs without it)."""
    options = cfg.get("predictions") or {}
    return {"save": bool(options.get("save", True)), "float16_above_mb": float(options.get("float16_above_mb", 256))}


def run(cfg: DictConfig, *, values_checked: bool = False) -> dict:
    """Trains, tests and writes ``results.json``; a run directory that already has one is skipped.
    ``values_checked``: the caller has run ``check_values`` (``sve-train`` does, before it imports torch)."""
    start = time.perf_counter()
    check_config(cfg, values_checked=values_checked)
    set_cpu_allocator(cfg.get("cpu_allocator", "system"))  # before any tensor: the whole run reuses its memory
    out_dir = Path(cfg.paths.output_dir)
    done = out_dir / "results.json"
    skip = cfg.get("skip_finished", True)
    # A finished run is never silently returned for another config, nor an unfinished one continued with it. Also
    # with skip_finished=false: a finished run's last.ckpt holds its trained model, which the run resumes, so
    # other values must be refused, or accepted and recorded (resume_with_changes=true), as for any resume.
    changes = check_same_config(cfg, out_dir)
    if skip and done.exists():
        log.info("%s exists: this run has finished, skipping it (skip_finished=false runs it again)", done)
        return read_results(done)
    replaced, changes = changes is None, changes or []
    with claim(out_dir):  # the record is rewritten only by the run that holds the directory
        if global_rank() == 0 and (not (out_dir / RUN_CONFIG).exists() or changes or replaced or not skip):
            remember_config(out_dir, run_config(cfg))
        with stops_explained(out_dir) as attempt:
            return train_and_evaluate(cfg, out_dir, start, changes, attempt)


@contextmanager
def stops_explained(out_dir: Path):
    """A stop from outside (SIGTERM, Ctrl-C) during the run becomes ``RunInterrupted``, saying what is kept and
    what the same command will do. Yields the attempt's record, where the run puts its checkpoint callback."""
    on_interrupt = signal.getsignal(signal.SIGINT)
    attempt: dict = {}
    try:
        yield attempt
    except SIGTERMException:  # Lightning stops at the next batch end and exits 0 unless told otherwise
        raise interrupted(out_dir, "SIGTERM", signal.SIGTERM, attempt.get("checkpoint")) from None
    except SystemExit as stop:
        # Ctrl-C: Lightning shuts down and exits 1 from inside its KeyboardInterrupt handler, saying only that
        # it detected one. Say what is kept and how to go on, and exit as an interrupted process does.
        if not isinstance(stop.__context__, KeyboardInterrupt):
            raise
        # Lightning also ignores Ctrl-C from then on, for its shutdown; a notebook or a script that goes on
        # after this run must get it back.
        if on_interrupt is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, on_interrupt)
        raise interrupted(out_dir, "Ctrl-C", signal.SIGINT, attempt.get("checkpoint")) from None


def interrupted(out_dir: Path, by: str, signal_number: int, checkpoint: LastCheckpoint | None = None) -> RunInterrupted:
    """The stop, saying what the same command will do: resume from the step its checkpoint holds, or start over
    (no checkpoint written yet, or none kept: then it must not promise a resume)."""
    trainer = checkpoint.trainer if checkpoint is not None else None
    at = f" at step {trainer.global_step}" if trainer is not None else ""
    if checkpoint is None:
        then = "starts over: this run keeps no checkpoint (callbacks has no checkpoint)"
    elif checkpoint.resumes_from is None and not checkpoint.path.exists():
        then = "starts over: no checkpoint had been written yet"
    else:
        step = checkpoint.resumes_from
        then = f"resumes from {f'step {step}' if step is not None else 'its last checkpoint'} ({checkpoint.path})"
    return RunInterrupted(
        f"run in {out_dir} stopped by {by}{at}; nothing was written to results.json. Start the same command again: "
        f"it {then}",
        signal_number,
    )


def train_and_evaluate(cfg: DictConfig, out_dir: Path, start: float, changes: list, attempt: dict) -> dict:
    """The run's steps, in order. ``attempt`` gets the checkpoint callback (the stop message reads it);
    ``changes``: the config changes accepted with resume_with_changes=true, recorded in results.json."""
    commit = git_commit()  # the code as it was when the run started
    pl.seed_everything(cfg.seed, workers=True)
    callbacks = [hydra.utils.instantiate(c) for c in cfg.get("callbacks", {}).values() if c]
    checkpoint = next((c for c in callbacks if isinstance(c, LastCheckpoint)), None)
    attempt["checkpoint"] = checkpoint
    curve = next((c for c in callbacks if isinstance(c, LearningCurve)), None)
    if checkpoint is not None:
        checkpoint.run_config = run_config(cfg)  # a resume from this checkpoint compares its config
    ckpt_path = resume_path(cfg, checkpoint)  # the checkpoint's file and config, before any download or SVD
    _, datamodule, method, module = build(cfg)
    datamodule.setup()  # reads and checks every data file now, before any training
    logger = make_loggers(cfg)
    trainer = make_trainer(cfg, logger, callbacks)
    prepare_training(cfg, trainer, datamodule, method, module)
    trainer = fit(trainer, module, datamodule, method, lambda: make_trainer(cfg, logger, callbacks), ckpt_path)
    finish_training(trainer, module, method, datamodule, checkpoint)
    if trainer.is_global_zero:
        write_run_adapter(cfg, method, datamodule, out_dir)
    evaluation = evaluate_run(cfg, trainer, module, method, datamodule, out_dir)
    results = run_record(
        cfg,
        method,
        datamodule,
        trainer,
        evaluation,
        curve=curve.record() if curve is not None else None,
        resumed_from=ckpt_path,
        config_changes=changes,
        # All attempts: earlier ones up to their last checkpoint, plus this one.
        wall_time_s=(checkpoint.previous_seconds if checkpoint else 0.0) + time.perf_counter() - start,
        commit=commit,
    )
    if trainer.is_global_zero:
        write_outputs(results, method, out_dir)
    return results


def prepare_training(cfg: DictConfig, trainer: pl.Trainer, datamodule, method, module: EnsembleModule) -> None:
    """Each process's share of the data, the data order, the method's own check of the schedule, and one
    training step's worth of the real model: the method runs on this backbone and data, or fails now."""
    # The recipe's batch is the global batch: each process takes its share (sve.data.sampling).
    datamodule.distribute(trainer.world_size, trainer.global_rank, trainer.accumulate_grad_batches)
    datamodule.order_seed = int(cfg.seed)
    method.check_training(planned_epochs(trainer, datamodule))  # e.g. too few epochs for M checkpoints
    unused = probe(module, datamodule)
    if unused:
        message = f"{len(unused)} trainable parameter(s) get no gradient: {unused[:4]}"
        if trainer.world_size > 1:
            raise RuntimeError(f"{message}; DDP cannot train them. The method must freeze them (requires_grad=False)")
        log.info("%s (they stay as they are)", message)


def fit(trainer: pl.Trainer, module, datamodule, method, new_trainer, ckpt_path: str | None) -> pl.Trainer:
    """``trainer.fit``, resuming from ``ckpt_path``; a method with rounds (a sequential deep ensemble) fits once
    more per round, each with a trainer from ``new_trainer()``. Returns the trainer of the last fit."""
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    while method.next_round():  # one fresh fit per round of members
        datamodule.order_seed += 1  # each round its own data order (restored from checkpoints of that round)
        trainer = new_trainer()
        trainer.fit(module, datamodule=datamodule)
    return trainer


def finish_training(trainer: pl.Trainer, module, method, datamodule, checkpoint: LastCheckpoint | None) -> None:
    """The whole trained model on every rank, the method's ``after_fit`` (a posterior, snapshots) on the whole
    training split, and the final checkpoints."""
    if is_sharded(method):  # trainer=fsdp: from here on every rank holds the whole trained model
        unshard_method(method)
    module.to(trainer.strategy.root_device)  # Lightning's teardown moved it to the CPU; a posterior fits here
    with datamodule.whole_training_split():  # every rank fits the same thing on the same data
        method.after_fit(datamodule)
    if checkpoint is not None:
        checkpoint.save(trainer)  # last.ckpt with the final state (a posterior): a rerun of this run refits nothing
        save_final(trainer, checkpoint.dirpath)  # weights and method state only, for evaluate.py


def write_run_adapter(cfg: DictConfig, method, datamodule, out_dir: Path) -> None:
    """What training changed, apart from the base (``sve.api.adapter_files``)."""
    write_adapter(
        method,
        out_dir / ADAPTER,
        {
            "backbone": type(method.backbone).__name__,
            "method": cfg.method.name,
            "ensemble_size": method.ensemble_size,
            "num_classes": method.num_classes,
            "class_names": datamodule.class_names(),
            "config": OmegaConf.to_container(cfg, resolve=True),
        },
        adapter_shard_bytes(cfg),
    )


def evaluate_run(cfg: DictConfig, trainer: pl.Trainer, module, method, datamodule, out_dir: Path) -> dict:
    """Every evaluation set (``sve.runs.evaluation``), saying when the method predicts with another number of
    members than it was asked for."""
    evaluation = evaluate(trainer, module, datamodule, out_dir, int(cfg.seed), **prediction_options(cfg))
    if not (method.stochastic or method.shared_head) and evaluation["num_members"] != method.ensemble_size:
        log.warning(
            "%s was asked for ensemble_size=%d and predicts with %d member(s); results.json records both "
            "(ensemble_size, num_members)",
            type(method).__name__,
            method.ensemble_size,
            evaluation["num_members"],
        )
    return evaluation


def write_outputs(results: dict, method, out_dir: Path) -> None:
    """Rank 0's files: the singular values, results.json and the run's figures; then the small table."""
    save_singular_values(method, out_dir)  # Figs. 4-6 (Appendix B); nothing for methods without SV layers
    write_json(out_dir / "results.json", results)
    run_reliability_figure(results, out_dir)  # reliability.png: the diagram and its confidence histogram
    run_severity_figure(results, out_dir)  # severity.png, with shift sets: the metrics against the severity
    run_shifted_figure(results, out_dir)  # shifted.png, with shifted sets: each beside the test set
    print(format_table(results))
    log.info("results written to %s", out_dir / "results.json")


def run_reliability_figure(results: dict, out_dir: Path) -> list[Path]:
    """``reliability.png``/``.pdf`` of one run, from its results' test bins; nothing without them."""
    record = (results.get("reliability") or {}).get("test")
    if not isinstance(record, dict) or "accuracy" not in record:
        return []
    bins = {
        k: np.asarray([np.nan if v is None else v for v in record[k]], dtype=float)
        for k in ("count", "confidence", "accuracy")
    }
    import matplotlib

    matplotlib.use("Agg")  # files only, no display; matplotlib only once the results are safe
    from sve.metrics.plots import reliability_grid, save_figure

    members = int(results["num_members"])
    ece = (results.get("metrics") or {}).get("test/ece")
    name = method_label(results)
    label = (f"{name} (M={members})" if members > 1 else name) + (f", ECE {100 * ece:.2f}%" if ece is not None else "")
    fig = reliability_grid(
        [(label, bins)], f"{results.get('dataset')} · {results.get('backbone')} · seed {results.get('seed')}"
    )
    return save_figure(fig, Path(out_dir), "reliability")


def run_severity_figure(results: dict, out_dir: Path) -> list[Path]:
    """``severity.png``/``.pdf``: accuracy, ECE and NLL against the severity, from the results' (or an
    evaluation's) ``shift.by_severity``; nothing without shift sets."""
    by_severity = (results.get("shift") or {}).get("by_severity")
    if not by_severity:
        return []
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    from sve.metrics.plots import save_figure, severity_figure

    fig = severity_figure(by_severity, title=f"{method_label(results)} · {results.get('dataset')}: shifted test sets")
    return save_figure(fig, Path(out_dir), "severity")


def adapter_shard_bytes(cfg) -> int | None:
    """The largest adapter file a run writes (``adapter.shard_mb``, in MiB; None: one file of any size)."""
    shard_mb = (cfg.get("adapter") or {}).get("shard_mb")
    return None if shard_mb is None else int(float(shard_mb) * 2**20)


def run_shifted_figure(results: dict, out_dir: Path) -> list[Path]:
    """``shifted.png``/``.pdf``: accuracy, ECE, NLL and the members' mutual information on the test set and on each
    shifted set (``shifted.sets``); nothing without shifted sets."""
    sets = (results.get("shifted") or {}).get("sets")
    if not sets:
        return []
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    from sve.metrics.plots import save_figure, shifted_figure

    members = results.get("num_members")
    title = f"{method_label(results)} (M={members}) · trained on {results.get('dataset')}: test set and shifted sets"
    return save_figure(shifted_figure(sets, title), Path(out_dir), "shifted")


def method_label(results: dict) -> str:
    """The figures' name of the results' method: its row label, or the method key where no option has it."""
    method = str(results.get("method"))
    return registry.display_name(method) if method in registry.options() else method
