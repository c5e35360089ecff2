"""A finished run evaluated again from its checkpoint, without training: what ``evaluate.py`` calls.

``python evaluate.py run_dir=<run dir> [dataset=<option>] [key=value ...] [name=...] [update_results=true]``

The model is rebuilt from the run's own config (results.json ``config``, else ``.hydra/config.yaml``), seeded as
in training, and loaded from ``checkpoints/final.ckpt``, which ``run`` writes after training and ``after_fit``
when the run keeps checkpoints (``callbacks=default``). Checkpoints are lean: the frozen part is rebuilt from
the config and checked against the checkpoint's fingerprints, so a config that no longer builds the same
model is an error naming the tensors, never a silently different model.

Every other argument overrides the run's config for the evaluation: ``dataset=<option>`` swaps in another
option of ``configs/dataset`` (with the same classes, e.g. ``cifar100_c`` for a CIFAR-100 run), a dotted
``key=value`` changes one value (``dataset.corruptions=all`` adds the shift sets, ``dataset.root=...`` points
at the data), ``+key=value`` adds one and ``~key`` removes one. ``experiment`` and ``recipe`` cannot be swapped:
they decide the training.

What a method's ``after_fit`` built (Bayes-LoRA's Laplace posterior, a checkpoint ensemble's snapshots) is
part of its state in ``final.ckpt``, so nothing is refitted: the evaluated model is the tested one.

Output (rank 0): ``evaluations/<name>.json`` in the run directory (``name`` defaults to the evaluated
dataset's name) holding ``sve.evaluation``'s keys plus what was evaluated; predictions under
``evaluations/<name>/predictions/``. The training ``results.json`` is left as it is unless
``update_results=true``, which replaces its evaluation keys (``num_members``, ``metrics``, ``predictions``,
``reliability``, ``shift``) with the new ones, records ``evaluated_by``, and writes predictions under
``predictions/``.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pytorch_lightning as pl
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from sve.checkpoint import FINAL, read_checkpoint
from sve.errors import InputError
from sve.evaluation import PREDICTIONS, evaluate
from sve.results import command_line, git_commit, package_versions, write_json
from sve.rundir import claim
from sve.run import build, instantiate, make_trainer, prediction_options

log = logging.getLogger(__name__)

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
EVALUATIONS = "evaluations"
GLOBAL_GROUPS = ("experiment", "recipe")  # `# @package _global_` groups: they set the training, not a node
EVALUATION_KEYS = ("num_members", "metrics", "predictions", "reliability", "shift")
OPTIONS = {"run_dir": None, "name": None, "ckpt_path": None, "update_results": "false"}


def saved_config(run_dir: Path) -> DictConfig:
    """The run's resolved config (results.json), else the one Hydra saved; ``paths.output_dir`` is set to
    ``run_dir`` (the directory may have moved since training)."""
    results, hydra_saved = run_dir / "results.json", run_dir / ".hydra" / "config.yaml"
    config = json.loads(results.read_text()).get("config") if results.exists() else None
    if config:
        cfg = OmegaConf.create(config)
    elif hydra_saved.exists():
        cfg = OmegaConf.load(hydra_saved)
    else:
        raise InputError(f"run_dir={run_dir} holds neither results.json nor .hydra/config.yaml: not a run directory")
    cfg.paths.output_dir = str(run_dir)
    if cfg.trainer.get("default_root_dir"):
        cfg.trainer.default_root_dir = str(run_dir)
    return cfg


def group_option(group: str, option: str) -> DictConfig:
    """The node ``configs/<group>/<option>.yaml`` composes to (its defaults list followed), unresolved, so
    its interpolations resolve against the run's config."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        composed = compose("train", overrides=[f"{group}={option}"])
    return OmegaConf.create(OmegaConf.to_container(composed[group], resolve=False))


def apply_overrides(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """A copy of ``cfg`` with Hydra-style command-line overrides applied (see the module docstring)."""
    cfg = copy.deepcopy(cfg)
    absent = object()
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group
        if key in GLOBAL_GROUPS:
            raise InputError(f"{key}=... cannot be changed when evaluating: it sets how the run was trained")
        if override.is_delete():
            parent, _, last = key.rpartition(".")
            node = OmegaConf.select(cfg, parent) if parent else cfg
            if node is None or last not in node:
                raise InputError(f"~{key}: the run's config has no key {key}")
            del node[last]
        elif (CONFIGS / key).is_dir():
            if not isinstance(override.value(), str):
                raise InputError(f"{key}={override.value()!r}: expected an option of configs/{key}/")
            cfg[key] = group_option(key, override.value())
        else:
            adding = override.is_add() or override.is_force_add()
            if OmegaConf.select(cfg, key, default=absent) is absent and not adding:
                raise InputError(f"{key}: not a key of the run's config; +{key}=... adds it")
            OmegaConf.update(cfg, key, override.value(), merge=False, force_add=True)
    return cfg


def evaluate_run(run_dir: str | Path, overrides: list[str] = (), name: str | None = None,
                 ckpt_path: str | Path | None = None, update_results: bool = False) -> dict:
    """Evaluates a trained run again; returns the record written to ``evaluations/<name>.json``."""
    run_dir = Path(run_dir).expanduser()
    trained = saved_config(run_dir)
    cfg = apply_overrides(trained, list(overrides))
    path = Path(ckpt_path).expanduser() if ckpt_path else run_dir / "checkpoints" / FINAL
    if not path.is_file():
        raise InputError(
            f"{path} not found. Runs write checkpoints/{FINAL} after training when they keep checkpoints "
            "(callbacks=default); a run trained with callbacks=none cannot be evaluated again. ckpt_path=<file> "
            "evaluates another checkpoint (e.g. checkpoints/last.ckpt: the model at its last epoch end, before "
            "after_fit and before a sequential deep ensemble's last round was stored)"
        )
    name = name or str(cfg.dataset.name)
    checkpoint = read_checkpoint(path)
    with claim(run_dir):
        pl.seed_everything(int(cfg.seed), workers=True)  # as in training: random backbones rebuild the same
        backbone, datamodule, method, module = build(cfg)
        if cfg.dataset != trained.dataset:
            trained_classes = instantiate(trained.dataset).num_classes
            if trained_classes != datamodule.num_classes:
                raise InputError(f"dataset {cfg.dataset.name} has {datamodule.num_classes} classes; the run was "
                                 f"trained on {trained.dataset.name} with {trained_classes}")  # fmt: skip
        datamodule.setup()  # every data file is read and checked before the model runs
        module.on_load_checkpoint(checkpoint)  # the frozen part: checked against the fingerprints, then filled in
        module.load_state_dict(checkpoint["state_dict"])
        trainer = make_trainer(cfg, logger=False, callbacks=[])
        datamodule.distribute(trainer.world_size, trainer.global_rank)
        datamodule.order_seed = int(cfg.seed)
        save_to = PREDICTIONS if update_results else f"{EVALUATIONS}/{name}/{PREDICTIONS}"
        evaluation = evaluate(trainer, module, datamodule, run_dir, int(cfg.seed), save_to=save_to,
                              **prediction_options(cfg))  # fmt: skip
        record = {
            "name": name,
            "method": cfg.method.name,
            "dataset": cfg.dataset.name,
            "trained_on": trained.dataset.name,
            "checkpoint": str(path),
            "overrides": list(overrides),
            "aggregate": cfg.aggregate,
            **evaluation,
            "command": command_line(),
            "git_commit": git_commit(),
            "versions": package_versions(),
            "config": OmegaConf.to_container(cfg, resolve=True),
        }
        if trainer.is_global_zero:
            write_json(run_dir / EVALUATIONS / f"{name}.json", record)
            if update_results:
                merge_into_results(run_dir / "results.json", record)
            print(summary(record, run_dir, update_results))
    return record


def merge_into_results(path: Path, record: dict) -> None:
    """results.json with its evaluation keys replaced by ``record``'s (asked for with update_results=true)."""
    results = json.loads(path.read_text()) if path.exists() else {}
    for key in EVALUATION_KEYS:
        results.pop(key, None)
        if key in record:
            results[key] = record[key]
    results["evaluated_by"] = {k: record[k] for k in ("name", "checkpoint", "overrides",
                                                      "command", "git_commit")}  # fmt: skip
    write_json(path, results)


def summary(record: dict, run_dir: Path, update_results: bool) -> str:
    m = record["metrics"]
    lines = [f"evaluated {record['method']} (trained on {record['trained_on']}) on {record['dataset']}: "
             f"{record['num_members']} members, acc {100 * m['test/acc']:.2f}%, ece {100 * m['test/ece']:.2f}%, "
             f"nll {m['test/nll']:.4f}"]  # fmt: skip
    if "shift" in record:
        by_severity = record["shift"]["by_severity"]
        lines.append("shift, acc by severity: " + ", ".join(f"{s}: {100 * v['acc']:.2f}%"
                                                              for s, v in by_severity.items()))  # fmt: skip
    lines.append(f"written: {run_dir / EVALUATIONS / (record['name'] + '.json')}"
                 + (" and results.json (update_results=true)" if update_results else ""))  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``evaluate.py``'s command line: its own options (``OPTIONS``) and the overrides of the run's config."""
    options, overrides = dict(OPTIONS), []
    for arg in argv:
        key = arg.split("=", 1)[0]
        if key in OPTIONS and "=" in arg:
            options[key] = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
    if not options["run_dir"]:
        print(__doc__.split("\n\n")[1])
        return 2
    if options["update_results"] not in ("true", "false"):
        raise InputError(f"update_results={options['update_results']!r} is not valid; expected true or false")
    evaluate_run(options["run_dir"], overrides, options["name"] or None, options["ckpt_path"] or None,
                 options["update_results"] == "true")  # fmt: skip
    return 0
