"""A finished run evaluated again from its checkpoint, without training: what ``evaluate.py`` calls.

``python evaluate.py run_dir=<run dir> [dataset=<option>] [key=value ...] [name=...] [update_results=true]``
(``sve-eval <run dir> ...`` also takes the directory as its first argument)

``run_dir`` may also be an adapter directory (``<run dir>/adapter``, or one shared elsewhere): the model is then
rebuilt from the config recorded in its ``adapter_config.json``, checked against its base fingerprint, and
loaded from its safetensors (``sve.api.adapter_files``); the evaluation is written into that directory.

The model is rebuilt from the run's own config (results.json ``config``, else ``.hydra/config.yaml``), seeded as
in training, and loaded from ``checkpoints/final.ckpt``, which ``run`` writes after training and ``after_fit``
when the run keeps checkpoints (``callbacks=default``). Checkpoints are lean: the frozen part is rebuilt from
the config and checked against the checkpoint's fingerprints, so a config that no longer builds the same
model is an error naming the tensors, never a silently different model. A saved config that names what this
code no longer has (a ``_target_`` that does not import, a key its target does not take) is an ``InputError``
naming the key, its value and the valid keys, and the commit that trained the run (results.json
``git_commit``) to check out; so is an unreadable results.json, config.yaml or checkpoint, naming the file.

Every other argument overrides the run's config for the evaluation: ``dataset=<option>`` swaps in another
option of ``configs/dataset`` (with the same classes, e.g. ``cifar100_c`` for a CIFAR-100 run; the keys that
shape the model, its data module's ``model_keys``, keep the run's values: ``keep_own_values``), a dotted
``key=value`` changes one value (``dataset.corruptions=all`` adds the shift sets, ``dataset.root=...`` points
at the data), ``+key=value`` adds one and ``~key`` removes one. ``experiment`` and ``recipe`` cannot be swapped:
they decide the training. Options of one's own config folder are found as sve-train finds them:
``--config-dir <dir>`` (or ``hydra.searchpath=[file://<dir>]``) adds it to where ``dataset=<option>`` is looked up.

What a method's ``after_fit`` built (Bayes-LoRA's Laplace posterior, a checkpoint ensemble's snapshots) is
part of its state in ``final.ckpt``, so nothing is refitted: the evaluated model is the tested one.

Output (rank 0): ``evaluations/<name>.json`` in the run directory (``name`` defaults to the evaluated
dataset's name) holding ``sve.runs.evaluation``'s keys plus what was evaluated; predictions under
``evaluations/<name>/predictions/``. The training ``results.json`` is left as it is unless
``update_results=true``, which replaces its evaluation keys (``num_members``, ``metrics``, ``predictions``,
``reliability``, ``risk_coverage``, ``shift``) with the new ones, records ``evaluated_by``, and writes predictions
under ``predictions/``. With shift sets (``dataset.corruptions=...``), ``evaluations/<name>/severity.png`` and
``.pdf`` (in the run directory with ``update_results=true``): accuracy, ECE and NLL against the severity.
"""

from __future__ import annotations

import copy
import importlib
import logging
from pathlib import Path

import pytorch_lightning as pl
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf

from sve.api import adapter_files
from sve.errors import InputError, did_you_mean
from sve.paths import CONFIGS
from sve.runs.evaluation import evaluate
from sve.runs.prediction_files import PREDICTIONS
from sve.runs.results import git_commit, read_results, results_record, write_json
from sve.runs.run import build, instantiate, make_trainer, prediction_options, run_severity_figure
from sve.runs.rundir import claim
from sve.runs.validate import accepted_keys, check_accelerator, check_values, root_keys
from sve.runs.writable import check_writable
from sve.training.checkpoint import FINAL, CheckpointMismatch, read_checkpoint
from sve.training.loops import stopped_by_sigterm

log = logging.getLogger(__name__)

EVALUATIONS = "evaluations"
GLOBAL_GROUPS = ("experiment", "recipe")  # `# @package _global_` groups: they set the training, not a node
MODEL_GROUPS = ("method", "backbone")  # what the checkpoint's tensors belong to
EVALUATION_KEYS = ("num_members", "metrics", "predictions", "reliability", "risk_coverage", "shift")
OPTIONS = {"run_dir": None, "name": None, "ckpt_path": None, "update_results": "false"}
# The nodes that evaluating a run instantiates (sve.runs.run.build and make_trainer); callbacks and logger are not.
BUILT = ("backbone", "dataset", "method", "optimizer", "scheduler", "trainer")
HYDRA_KEYS = {"_target_", "_partial_", "_convert_", "_recursive_", "_args_"}
REQUIRED = ("paths", "trainer", "backbone", "dataset", "method", "seed")  # what an evaluation reads
# A run trained on a GPU, evaluated where there is none: the keys that keep the rest of its trainer (trainer=cpu
# would replace all of it).
ON_THE_CPU = (
    "evaluate on the CPU with trainer.accelerator=cpu trainer.devices=1 (and trainer.strategy=auto for a "
    "DDP or FSDP run)"
)


def adapter_run_config(directory: Path) -> DictConfig:
    """The config of the run that wrote the adapter in ``directory`` (its ``adapter_config.json``), with
    ``paths.output_dir`` set to the directory: evaluations are written beside the adapter."""
    config = adapter_files.read_config(directory)
    if not config.get("config"):
        raise InputError(
            f"{directory / adapter_files.CONFIG} was written by sve.wrap (no run config); load it with "
            "sve.from_pretrained(model, directory) on its base model"
        )
    cfg = OmegaConf.create(config["config"])
    cfg.paths.output_dir = str(directory)
    if cfg.trainer.get("default_root_dir"):
        cfg.trainer.default_root_dir = str(directory)
    return cfg


def saved_config(run_dir: Path) -> DictConfig:
    """The run's resolved config (results.json), else the one Hydra saved; ``paths.output_dir`` is set to
    ``run_dir`` (the directory may have moved since training). A results.json that is not valid JSON, a
    config.yaml that is not YAML, or a config that lacks what an evaluation reads is an ``InputError`` naming
    the file."""
    results, hydra_saved = run_dir / "results.json", run_dir / ".hydra" / "config.yaml"
    if not run_dir.is_dir():
        raise InputError(
            f"run_dir={run_dir}: {'not a directory' if run_dir.exists() else 'no such directory'}; "
            "expected a trained run's directory (the one holding results.json)"
        )
    config = read_results(results).get("config") if results.exists() else None
    if config:
        cfg, source = OmegaConf.create(config), f"{results} (its config)"
    elif hydra_saved.exists():
        try:
            cfg = OmegaConf.load(hydra_saved)
        except Exception as err:  # noqa: BLE001 - yaml's errors, or a file that cannot be read
            reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
            raise InputError(
                f"{hydra_saved} is not a readable config ({type(err).__name__}: {reason}); restore it "
                "from a copy of the run, or retrain the run"
            ) from None
        source = str(hydra_saved)
    else:
        raise InputError(f"run_dir={run_dir} holds neither results.json nor .hydra/config.yaml: not a run directory")
    missing = [key for key in REQUIRED if not isinstance(cfg, DictConfig) or key not in cfg]
    if missing:
        raise InputError(f"{source} is not a training config of this framework: it lacks {missing}")
    cfg.paths.output_dir = str(run_dir)
    if cfg.trainer.get("default_root_dir"):
        cfg.trainer.default_root_dir = str(run_dir)
    return cfg


def group_option(group: str, option: str, searchpath: list[str] = ()) -> DictConfig:
    """The node ``configs/<group>/<option>.yaml`` composes to (its defaults list followed), unresolved, so
    its interpolations resolve against the run's config; ``searchpath`` adds one's own config folders."""
    extra = [f"hydra.searchpath=[{','.join(searchpath)}]"] if searchpath else []
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        composed = compose("train", overrides=[f"{group}={option}", *extra])
    return OmegaConf.create(OmegaConf.to_container(composed[group], resolve=False))


def apply_overrides(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """A copy of ``cfg`` with Hydra-style command-line overrides applied (see the module docstring)."""
    cfg = copy.deepcopy(cfg)
    absent = object()
    parsed = OverridesParser.create().parse_overrides(list(config_dir_as_searchpath(overrides)))
    # Where group options are looked up, not a key of the run's config: taken out first, so it applies to every
    # group override wherever it stands on the command line.
    searchpath = [str(p) for o in parsed if o.key_or_group == "hydra.searchpath" for p in o.value()]
    for override in parsed:
        key = override.key_or_group
        if key == "hydra.searchpath":
            continue
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
            option = group_option(key, override.value(), searchpath)
            if key == "dataset":
                given = {o.key_or_group.split(".", 2)[1] for o in parsed if o.key_or_group.startswith("dataset.")}
                option = keep_own_values(cfg, option, given)
            cfg[key] = option
        else:
            adding = override.is_add() or override.is_force_add()
            if OmegaConf.select(cfg, key, default=absent) is absent and not adding:
                raise InputError(f"{key}: not a key of the run's config; +{key}=... adds it")
            top = key.split(".")[0]
            if adding and top not in cfg and top not in root_keys():  # `+datset.root=...`: nothing would read it
                known = sorted(set(root_keys()) | {str(k) for k in cfg})
                raise InputError(
                    f"+{key}: the run's config has no {top}{did_you_mean(top, known)}, and nothing "
                    f"reads it; the top-level keys are: {', '.join(known)}"
                )
            OmegaConf.update(cfg, key, override.value(), merge=False, force_add=True)
    return cfg


def keep_own_values(cfg: DictConfig, option: DictConfig, given: set[str]) -> DictConfig:
    """``option`` (the dataset option swapped in) with the run's own values of the keys that shape the model
    (its data module's ``model_keys``: ARC's ``scoring`` sets what the head reads), unless the evaluation's command
    line gives them (``given``). Composed afresh, ``dataset=arc_challenge`` dropped ``dataset.scoring=cloze`` of
    ``experiment=mini_arc_smollm2`` and rebuilt another head than the checkpoint's. Everything else of the option
    is its own (its files, sizes, subsets). One warning names what was kept."""
    try:
        model_keys = getattr(locate(str(option.get("_target_"))), "model_keys", ())
    except (ImportError, AttributeError):  # check_targets names it
        return option
    own = cfg.get("dataset") or {}
    kept = {k: own[k] for k in model_keys if k in own and k in option and k not in given and own[k] != option[k]}
    if kept:
        option = copy.deepcopy(option)
        for k, v in kept.items():
            option[k] = v
        log.warning(
            "dataset=%s keeps the run's %s: it shapes the trained model",
            option.get("name"),
            ", ".join(f"dataset.{k}={v}" for k, v in kept.items()),
        )
    return option


def config_dir_as_searchpath(argv: list[str]):
    """``--config-dir DIR`` (``-cd``, ``--config-dir=DIR``), as sve-train takes it, as the searchpath override the
    evaluation's own composition reads: an evaluation of a run on a dataset option of one's own project."""
    argv = list(argv)
    while argv:
        arg = argv.pop(0)
        flag, eq, value = arg.partition("=")
        if flag in ("--config-dir", "-cd"):
            if not eq:
                if not argv:
                    raise InputError(f"{arg} needs a directory: {arg} <your config folder>")
                value = argv.pop(0)
            if not Path(value).is_dir():
                raise InputError(f"{flag} {value}: no such directory (a config folder holds dataset/, method/, ...)")
            yield f"hydra.searchpath=[file://{Path(value).resolve()}]"
        else:
            yield arg


def check_same_model(trained: DictConfig, overrides: list[str]) -> None:
    """The checkpoint holds the trained method's and backbone's tensors: another ``method=`` or ``backbone=``
    option is another model, refused before it is built (an SVD of every layer) only to fail to load. (sve-distill
    swaps the method for its student through ``apply_overrides`` itself, not through here.)"""
    for override in OverridesParser.create().parse_overrides(list(config_dir_as_searchpath(overrides))):
        key = override.key_or_group
        trained_option = OmegaConf.select(trained, f"{key}.name", default=None) if key in MODEL_GROUPS else None
        if trained_option is not None and not override.is_delete() and override.value() != trained_option:
            raise InputError(
                f"{key}={override.value()} cannot be changed when evaluating: the run was trained with "
                f"{key}={trained_option} and its checkpoint holds that model; an evaluation changes "
                "the data and how the model is evaluated, never the model"
            )


def trained_commit(run_dir: Path) -> str | None:
    """The commit of the code that trained the run (results.json ``git_commit``), when it is recorded."""
    path = run_dir / "results.json"
    return read_results(path).get("git_commit") if path.exists() else None


def rebuild_hint(run_dir: Path) -> str:
    """How to evaluate a run that this code can no longer build: with the code it was trained with."""
    commit = trained_commit(run_dir)
    if not commit:
        return (
            "evaluate it with the code it was trained with (its results.json records no git_commit); or "
            "change the key with an override (evaluate.py run_dir=... key=value, ~key removes it)"
        )
    base, dirty = commit.removesuffix("-dirty"), commit.endswith("-dirty")
    return (
        f"evaluate it with the code it was trained with: git checkout {base} (results.json git_commit {commit}"
        + (": trained with uncommitted changes on top of that commit" if dirty else "")
        + "), then run evaluate.py again; or change the key with an override (key=value, ~key removes it)"
    )


def locate(path: str):
    """The object a ``_target_`` names (``package.module.Name``); ImportError or AttributeError if none."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        module_name = ".".join(parts[:i])
        try:
            found = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and (module_name == err.name or module_name.startswith(f"{err.name}.")):
                continue  # not a module: the name is an attribute of a shorter prefix
            raise  # the module exists but imports one that does not
        for attr in parts[i:]:
            found = getattr(found, attr)
        return found
    raise ModuleNotFoundError(f"no module named {parts[0]!r}")


def check_targets(cfg: DictConfig, trained: DictConfig, run_dir: Path) -> None:
    """Every node that evaluating the run instantiates names a ``_target_`` this code has, with keys that it
    takes; else an ``InputError`` naming the key, its value and the valid keys (the saved config of a run
    trained with older code), and how to evaluate it anyway (``rebuild_hint``)."""
    absent = object()

    def where(key: str) -> tuple[str, str]:
        """Who set ``key`` (the saved config, or this evaluation's overrides) and what to do about it."""
        try:
            found = OmegaConf.select(trained, key, default=absent, throw_on_missing=False)
        except Exception:  # noqa: BLE001 - an interpolation that does not resolve here: the key is there
            found = None
        if found is absent:
            return "the overrides set", "remove or correct that override"
        return "the run's config sets", rebuild_hint(run_dir)

    def visit(node, key: str, top: bool) -> None:
        if isinstance(node, list):
            for i, item in enumerate(node):
                visit(item, f"{key}[{i}]", False)
            return
        if not isinstance(node, dict):
            return
        for child, value in node.items():
            visit(value, f"{key}.{child}", False)
        path = node.get("_target_")
        if not isinstance(path, str) or "${" in path:
            return
        try:
            target = locate(path)
        except (ImportError, AttributeError) as err:
            who, fix = where(f"{key}._target_")
            raise InputError(
                f"run_dir={run_dir}: {who} {key}._target_={path!r}, which this code cannot import "
                f"({type(err).__name__}: {err}); {fix}"
            ) from None
        valid = accepted_keys(target)
        if valid is None:
            return
        for child, value in node.items():
            if child in HYDRA_KEYS or (top and child == "name") or child in valid:
                continue
            who, fix = where(f"{key}.{child}")
            raise InputError(
                f"run_dir={run_dir}: {who} {key}.{child}={value!r}, which {path} does not take "
                f"(its keys: {sorted(valid)}); {fix}"
            )

    for key in BUILT:
        if key in cfg:
            visit(OmegaConf.to_container(cfg, resolve=False)[key], key, True)


# Keys that evaluating never reads from the run's config (it has its own ckpt_path; no logger, no callbacks): their
# values are not checked, so a run whose logger package is gone, or whose resume file has moved, still evaluates.
NOT_READ = ("ckpt_path", "logger", "callbacks")


def check_overridden_values(cfg: DictConfig, trained: DictConfig) -> None:
    """``check_values`` of the config as overridden (``ensemble_size=four`` or ``seed=abc`` is one line naming
    the value, not a traceback from deep in the build). A complaint that the run's own config draws as well is
    not this evaluation's doing (a run from code with other ranges) and is let through."""

    def complaint(config: DictConfig) -> str | None:
        config = copy.deepcopy(config)
        for key in NOT_READ:
            config.pop(key, None)
        try:
            check_values(config)
        except InputError as err:
            return str(err)
        return None

    found = complaint(cfg)
    if found is not None and found != complaint(trained):
        raise InputError(found)


# What the trained model is made of: an override of one of these builds another model than the checkpoint's.
MODEL_KEYS = ("ensemble_size", "method.name", "backbone.name", "seed")


def mismatch_cause(cfg: DictConfig, trained: DictConfig, run_dir: Path) -> str:
    """Why a run's checkpoint does not fit the model rebuilt for its evaluation, and what to do."""
    get = lambda config, key: OmegaConf.select(config, key, default=None)  # noqa: E731
    changed = [
        f"{key}={get(cfg, key)} (trained with {get(trained, key)})"
        for key in MODEL_KEYS
        if get(cfg, key) != get(trained, key)
    ]
    if changed:
        return (
            f"the overrides change the model: {', '.join(changed)}. An evaluation keeps the model as it was "
            "trained; drop those overrides"
        )
    # The data module shapes the model too (its classes, ARC's scoring): name the dataset keys that differ.
    evaluated, own = (OmegaConf.to_container(c.dataset, resolve=False) for c in (cfg, trained))
    data = [
        f"dataset.{k}={evaluated.get(k)} (trained with {own.get(k)})"
        for k in sorted(set(evaluated) | set(own))
        if k != "name" and evaluated.get(k) != own.get(k)
    ]
    if data:
        return (
            f"the evaluated dataset differs from the trained one in {', '.join(data[:6])}; one of them shapes "
            "the model (e.g. dataset.scoring): give it its trained value"
        )
    return f"the run's own config no longer builds the model its checkpoint holds; {rebuild_hint(run_dir)}"


def trained_class_names(run_dir: Path, adapter: bool) -> list | None:
    """The class names the run was trained with (results.json or adapter_config.json ``class_names``), where
    its data named them (image_folder, text_table); None otherwise."""
    if adapter:
        return adapter_files.read_config(run_dir).get("class_names")
    results = run_dir / "results.json"
    return read_results(results).get("class_names") if results.exists() else None


def check_same_classes(datamodule, trained_names: list | None, trained_dataset: str) -> None:
    """Label i of the evaluated data must be the class the run learned as label i: folders (or labels) with other
    names but as many of them gave metrics of a head scored against classes it never saw."""
    names = datamodule.class_names()
    if trained_names is None or names is None:
        return
    if [str(n) for n in names] != [str(n) for n in trained_names]:
        raise InputError(
            f"{datamodule.what}: its classes {list(names)} are not the classes the run was trained "
            f"with on {trained_dataset} {list(trained_names)} (label i must be the same class in both, "
            "in this order); evaluate on data with the trained classes"
        )


def rebuilt(cfg: DictConfig, run_dir: Path):
    """``build(cfg)``; an ``InputError`` when the config no longer builds with this code (a required argument
    that the saved config lacks, a target gone), as ``check_targets`` cannot see every such case."""
    try:
        return build(cfg)
    except InstantiationException as err:
        text = str(err)
        if not any(
            s in text
            for s in (
                "unexpected keyword argument",
                "required positional argument",
                "required keyword-only argument",
                "Error locating target",
                "Error loading",
            )
        ):
            raise
        first = " ".join(text.split())[:300]
        raise InputError(
            f"run_dir={run_dir}: the run's config does not build with this code ({first}); {rebuild_hint(run_dir)}"
        ) from None


def load_run(run_dir: str | Path, overrides: list[str] = (), ckpt_path: str | Path | None = None, trainer: bool = True):
    """(config, checkpoint path, module, datamodule) of a trained run (or adapter directory) rebuilt from its
    config with ``overrides`` and loaded with its trained state; the datamodule is set up (every data file
    read and checked). What ``evaluate_run`` and ``sve-distill`` start from; ``trainer=False`` for a caller
    that builds no Lightning trainer from this config (the teacher of ``sve-distill``)."""
    run_dir = Path(run_dir).expanduser()
    adapter = (run_dir / adapter_files.CONFIG).is_file()  # an adapter directory (a run's, or one shared)
    trained = adapter_run_config(run_dir) if adapter else saved_config(run_dir)
    check_same_model(trained, list(overrides))
    cfg = apply_overrides(trained, list(overrides))
    check_overridden_values(cfg, trained)
    check_targets(cfg, trained, run_dir)
    if trainer:
        check_accelerator(cfg, instead=ON_THE_CPU)
    path = run_dir if adapter else Path(ckpt_path).expanduser() if ckpt_path else run_dir / "checkpoints" / FINAL
    if not adapter and not path.is_file():
        raise InputError(
            f"{path} not found. Runs write checkpoints/{FINAL} after training when they keep checkpoints "
            "(callbacks=default); a run trained with callbacks=none cannot be evaluated again. ckpt_path=<file> "
            "evaluates another checkpoint (e.g. checkpoints/last.ckpt: the model at its last epoch end, before "
            "after_fit and before a sequential deep ensemble's last round was stored)"
        )
    checkpoint = None if adapter else read_checkpoint(path)
    pl.seed_everything(int(cfg.seed), workers=True)  # as in training: random backbones rebuild the same
    backbone, datamodule, method, module = rebuilt(cfg, run_dir)
    if cfg.dataset != trained.dataset:
        trained_classes = instantiate(trained.dataset).num_classes
        if trained_classes != datamodule.num_classes:
            raise InputError(
                f"dataset {cfg.dataset.name} has {datamodule.num_classes} classes; the run was "
                f"trained on {trained.dataset.name} with {trained_classes}"
            )
    check_same_classes(datamodule, trained_class_names(run_dir, adapter), trained.dataset.name)
    datamodule.setup()  # every data file is read and checked before the model runs
    if adapter:  # the base as the config builds it, checked against the adapter's fingerprint
        adapter_files.check_fingerprint(adapter_files.read_config(run_dir), method.base_fingerprint, run_dir)
        adapter_files.load_trained_state(method, run_dir)
    else:
        try:
            module.on_load_checkpoint(checkpoint)  # the frozen part: checked against the fingerprints, then filled in
        except CheckpointMismatch as err:
            raise InputError(
                f"{path} does not fit the model rebuilt for this evaluation: {err.detail}; "
                f"{mismatch_cause(cfg, trained, run_dir)}"
            ) from None
        module.load_state_dict(checkpoint["state_dict"])
    return cfg, path, module, datamodule


def evaluate_run(
    run_dir: str | Path,
    overrides: list[str] = (),
    name: str | None = None,
    ckpt_path: str | Path | None = None,
    update_results: bool = False,
) -> dict:
    """Evaluates a trained run again; returns the record written to ``evaluations/<name>.json``."""
    run_dir = Path(run_dir).expanduser()
    adapter = (run_dir / adapter_files.CONFIG).is_file()
    trained = adapter_run_config(run_dir) if adapter else saved_config(run_dir)
    check_writable(run_dir, "run_dir", hint="copy the run directory somewhere writable and pass run_dir=<the copy>")
    with claim(run_dir):
        cfg, path, module, datamodule = load_run(run_dir, overrides, ckpt_path)
        if update_results:
            check_same_data(cfg, trained)
        name = name or str(cfg.dataset.name)
        trainer = make_trainer(cfg, logger=False, callbacks=[])
        datamodule.distribute(trainer.world_size, trainer.global_rank)
        datamodule.order_seed = int(cfg.seed)
        save_to = PREDICTIONS if update_results else f"{EVALUATIONS}/{name}/{PREDICTIONS}"
        with stopped_by_sigterm(f"evaluation of {run_dir}"):
            evaluation = evaluate(
                trainer, module, datamodule, run_dir, int(cfg.seed), save_to=save_to, **prediction_options(cfg)
            )
        record = results_record(
            {
                "name": name,
                "method": cfg.method.name,
                "dataset": cfg.dataset.name,
                "trained_on": trained.dataset.name,
                "checkpoint": str(path),
                "overrides": list(overrides),
                "aggregate": cfg.aggregate,
                **evaluation,
            },
            OmegaConf.to_container(cfg, resolve=True),
            git_commit(),
        )
        if trainer.is_global_zero:
            write_json(run_dir / EVALUATIONS / f"{name}.json", record)
            if update_results:
                merge_into_results(run_dir / "results.json", record)
            figures = run_severity_figure(record, run_dir if update_results else run_dir / EVALUATIONS / name)
            print(summary(record, run_dir, update_results, figures))
    return record


# Dataset keys that leave the run's own splits as they were: where the files are, how they are batched and
# read, and the shifted and OOD sets evaluated beside the clean test split.
SAME_DATA_KEYS = (
    "root",
    "download",
    "num_workers",
    "batch_size",
    "eval_batch_size",
    "corruptions",
    "severities",
    "corruption_seed",
    "shift_size",
    "ood",
)


def check_same_data(cfg: DictConfig, trained: DictConfig) -> None:
    """``update_results=true`` replaces the run's metrics in results.json, whose ``dataset`` and ``config`` keys
    stay the trained ones: metrics of other data (another dataset, other splits or subsets) would be filed as the
    run's own, and a table would show them. Such an evaluation keeps its own file."""

    def splits(config: DictConfig) -> dict:
        node = OmegaConf.to_container(config.dataset, resolve=True)
        return {k: v for k, v in node.items() if k not in SAME_DATA_KEYS}

    evaluated, own = splits(cfg), splits(trained)
    changed = sorted(k for k in set(evaluated) | set(own) if evaluated.get(k) != own.get(k))
    if changed:
        shown = ", ".join(f"dataset.{k}={evaluated.get(k)} (trained with {own.get(k)})" for k in changed[:4])
        raise InputError(
            f"update_results=true writes into the run's own results.json, which are for the data it "
            f"was trained and tested on; these overrides evaluate other data: {shown}. Drop "
            "update_results=true: the evaluation is written to evaluations/<name>.json beside them"
        )


def merge_into_results(path: Path, record: dict) -> None:
    """results.json with its evaluation keys replaced by ``record``'s (asked for with update_results=true)."""
    results = read_results(path) if path.exists() else {}
    for key in EVALUATION_KEYS:
        results.pop(key, None)
        if key in record:
            results[key] = record[key]
    results["evaluated_by"] = {k: record[k] for k in ("name", "checkpoint", "overrides", "command", "git_commit")}
    write_json(path, results)


def summary(record: dict, run_dir: Path, update_results: bool, figures: list[Path] = ()) -> str:
    m = record["metrics"]
    lines = [
        f"evaluated {record['method']} (trained on {record['trained_on']}) on {record['dataset']}: "
        f"{record['num_members']} members, acc {100 * m['test/acc']:.2f}%, ece {100 * m['test/ece']:.2f}%, "
        f"nll {m['test/nll']:.4f}"
    ]
    if "shift" in record:
        by_severity = record["shift"]["by_severity"]
        lines.append(
            "shift, acc by severity: " + ", ".join(f"{s}: {100 * v['acc']:.2f}%" for s, v in by_severity.items())
        )
    lines.append(
        f"written: {run_dir / EVALUATIONS / (record['name'] + '.json')}"
        + (" and results.json (update_results=true)" if update_results else "")
        + "".join(f", {path}" for path in figures)
    )
    return "\n".join(lines)


def command_options(argv: list[str], defaults: dict) -> tuple[dict, list[str]]:
    """A run command's own ``key=value`` options (the keys of ``defaults``) and the config overrides; a first
    argument without ``=`` is the run directory (``sve-eval <run dir> ...``, as people type it)."""
    options, overrides = dict(defaults), []
    for i, arg in enumerate(argv):
        key, eq, value = arg.partition("=")
        if key in defaults and eq:
            options[key] = value
        elif i == 0 and not eq and not arg.startswith(("~", "-", "+")):
            options["run_dir"] = arg
        else:
            overrides.append(arg)
    return options, overrides
