"""The config a finished run is evaluated with: its own saved config (or an adapter's), with the command line's
overrides applied and checked against what the run trained (``sve.runs.reevaluate`` loads and scores it)."""

from __future__ import annotations

import copy
import importlib
import logging
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from sve.api import adapter_files
from sve.errors import InputError, did_you_mean
from sve.paths import CONFIGS
from sve.runs.results import read_results
from sve.runs.validate import accepted_keys, check_values, root_keys

log = logging.getLogger(__name__)

GLOBAL_GROUPS = ("experiment", "recipe")  # `# @package _global_` groups: they set the training, not a node
MODEL_GROUPS = ("method", "backbone")  # what the checkpoint's tensors belong to
# The nodes that evaluating a run instantiates (sve.runs.run.build and make_trainer); callbacks and logger are not.
BUILT = ("backbone", "dataset", "method", "optimizer", "scheduler", "trainer")
HYDRA_KEYS = {"_target_", "_partial_", "_convert_", "_recursive_", "_args_"}
REQUIRED = ("paths", "trainer", "backbone", "dataset", "method", "seed")  # what an evaluation reads


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
            setter, fix = where(f"{key}._target_")
            raise InputError(
                f"run_dir={run_dir}: {setter} {key}._target_={path!r}, which this code cannot import "
                f"({type(err).__name__}: {err}); {fix}"
            ) from None
        valid = accepted_keys(target)
        if valid is None:
            return
        for child, value in node.items():
            if child in HYDRA_KEYS or (top and child == "name") or child in valid:
                continue
            setter, fix = where(f"{key}.{child}")
            raise InputError(
                f"run_dir={run_dir}: {setter} {key}.{child}={value!r}, which {path} does not take "
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


def changed_data(cfg: DictConfig, trained: DictConfig) -> list[str]:
    """The dataset keys (``dataset.<key>=<value> (trained with ...)``) by which the evaluated data is other data
    than the run's own: another dataset, other splits or subsets; not where the files are or how they are read."""

    def splits(config: DictConfig) -> dict:
        node = OmegaConf.to_container(config.dataset, resolve=True)
        return {k: v for k, v in node.items() if k not in SAME_DATA_KEYS}

    evaluated, own = splits(cfg), splits(trained)
    changed = sorted(k for k in set(evaluated) | set(own) if evaluated.get(k) != own.get(k))
    return [f"dataset.{k}={evaluated.get(k)} (trained with {own.get(k)})" for k in changed]


def same_data(cfg: DictConfig, trained: DictConfig) -> bool:
    """The evaluation is on the run's own data (its val split is the in-distribution one)."""
    return not changed_data(cfg, trained)


def check_same_data(cfg: DictConfig, trained: DictConfig) -> None:
    """``update_results=true`` replaces the run's metrics in results.json, whose ``dataset`` and ``config`` keys
    stay the trained ones: metrics of other data (another dataset, other splits or subsets) would be filed as the
    run's own, and a table would show them. Such an evaluation keeps its own file."""
    changed = changed_data(cfg, trained)
    if changed:
        shown = ", ".join(changed[:4])
        raise InputError(
            f"update_results=true writes into the run's own results.json, which are for the data it "
            f"was trained and tested on; these overrides evaluate other data: {shown}. Drop "
            "update_results=true: the evaluation is written to evaluations/<name>.json beside them"
        )
