"""Checks of a composed config before any work; each names the key, the value and what is valid.

``check_values`` needs nothing but the config, so ``sve-train`` runs it before importing torch: a bad value
answers at once. It checks the run's own keys (train.yaml's, the trainer's, the optimizer's) and hands each
group's node to the rules its owner states without torch: ``sve.methods.options`` (sigma_init, factor_dtype),
``sve.data.options`` (batch and split sizes, workers); the classes apply the same rules when built directly.
``check_config`` adds what needs the code: every key is one its target takes (which imports the targets),
and each target class's own ``check_options`` (SVE's inference paths, say). The model itself is checked by
``sve.runs.probe``.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import socket
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from sve.data.options import check_data_options
from sve.errors import InputError
from sve.methods.options import check_method_options, check_sigma_init

AGGREGATES = ("probs", "logits")
MAX_SEED = 2**32 - 1


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _require(ok: bool, key: str, value, valid: str) -> None:
    if not ok:
        raise InputError(f"{key}={value!r} is not valid; expected {valid}")


def check_config(cfg: DictConfig, *, values_checked: bool = False) -> None:
    """Raises ``InputError`` naming the first invalid key. ``values_checked``: the caller has run
    ``check_values`` already (``sve-train`` does, before it imports torch), so only what needs the code is left."""
    if not values_checked:
        check_values(cfg)
    check_known_keys(cfg)
    check_accelerator(cfg)
    check_wandb(cfg)
    check_method_name(cfg)


def check_method_name(cfg: DictConfig) -> None:
    """``method=lora_ensemble method._target_=mypkg.Mine`` trains one's own class under the shipped option's
    ``name``, which names the run directory, results.json's ``method`` and the tables' rows: its numbers would
    sit beside (or be averaged with) the shipped method's. A warning, not an error: a saved run keeps building."""
    import warnings

    from hydra.utils import get_object

    name, target = OmegaConf.select(cfg, "method.name"), OmegaConf.select(cfg, "method._target_")
    shipped = CONFIGS / "method" / f"{name}.yaml"
    if not isinstance(name, str) or not isinstance(target, str) or not shipped.is_file():
        return
    shipped_target = OmegaConf.load(shipped).get("_target_")
    try:  # the same class under another import path (a moved module kept as an alias) is the same method
        same = shipped_target == target or get_object(shipped_target) is get_object(target)
    except Exception:  # noqa: BLE001 - an unimportable target is check_known_keys' error, named there
        return
    if not same:
        warnings.warn(
            f"method._target_={target} is not the class of the shipped method {name!r} "
            f"({shipped_target}), but method.name={name}: the run directory, results.json and the tables "
            f"will call it {name}; set method.name=<your method's name> (or use a config file of your "
            "own, configs/method/<name>.yaml under --config-dir)",
            stacklevel=2,
        )


CPU_INSTEAD = "use trainer=cpu, or trainer=ddp_sim / fsdp_sim to run DDP / FSDP in CPU processes"


def check_accelerator(cfg: DictConfig, instead: str = CPU_INSTEAD) -> None:
    """``trainer=gpu`` (or ``ddp``, ``fsdp``) where torch sees no GPU, or more GPUs than there are, is named
    before the data is read and the SVD computed; Lightning would say only "No supported gpu backend found"."""
    import torch

    accelerator = str(OmegaConf.select(cfg, "trainer.accelerator", default="cpu"))
    if accelerator not in ("gpu", "cuda"):
        return
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not available:
        raise InputError(
            f"trainer.accelerator={accelerator} (trainer=gpu, ddp or fsdp) but torch finds no CUDA GPU "
            f"here (torch {torch.__version__}, built for CUDA {torch.version.cuda}); {instead}"
        )
    devices = OmegaConf.select(cfg, "trainer.devices", default=None)
    if OmegaConf.is_list(devices):
        wanted = [d for d in devices if not (_is_int(d) and 0 <= d < available)]
        if wanted:
            raise InputError(
                f"trainer.devices={list(devices)} names GPU(s) {wanted} that are not here; the "
                f"visible GPUs are {list(range(available))}"
            )
    elif _is_int(devices) and devices > available:
        raise InputError(
            f"trainer.devices={devices} but {available} GPU(s) are visible; use trainer.devices="
            f"{available} or -1 (all of them)"
        )


def check_values(cfg: DictConfig) -> None:
    """The values that need no code to check (numbers, names, files); ``InputError`` naming the first bad one."""
    get = lambda key: OmegaConf.select(cfg, key, default=None)  # noqa: E731
    _require(
        _is_int(get("ensemble_size")) and get("ensemble_size") >= 1,
        "ensemble_size",
        get("ensemble_size"),
        "a positive integer, e.g. ensemble_size=4",
    )
    # Lightning's seed_everything seeds numpy too, which takes only 0 .. 2**32 - 1 (and fails deep inside otherwise).
    _require(
        _is_int(get("seed")) and 0 <= get("seed") <= MAX_SEED, "seed", get("seed"), f"an integer from 0 to {MAX_SEED}"
    )
    _require(get("aggregate") in AGGREGATES, "aggregate", get("aggregate"), f"one of {list(AGGREGATES)}")
    if get("sigma_init") is not None:  # train.yaml's own key, which the methods' sigma_init interpolate
        check_sigma_init(get("sigma_init"))
    check_method_options(cfg.get("method"))  # the methods' own checks (sve.methods.options)
    _require(
        _number(get("optimizer.lr")) and get("optimizer.lr") > 0,
        "optimizer.lr",
        get("optimizer.lr"),
        "a positive number",
    )
    if get("method.lr") is not None:
        _require(
            _number(get("method.lr")) and get("method.lr") > 0,
            "method.lr",
            get("method.lr"),
            "a positive number or null",
        )
    for key in ("optimizer.weight_decay", "trainer.gradient_clip_val"):
        if get(key) is not None:
            _require(_number(get(key)) and get(key) >= 0, key, get(key), "a non-negative number or null")
    max_epochs, max_steps = get("trainer.max_epochs"), get("trainer.max_steps")
    _require(
        max_epochs is None or (_is_int(max_epochs) and (max_epochs >= 1 or max_epochs == -1)),
        "trainer.max_epochs",
        max_epochs,
        "a positive integer (or -1 with trainer.max_steps)",
    )
    _require(
        max_steps is None or (_is_int(max_steps) and (max_steps >= 1 or max_steps == -1)),
        "trainer.max_steps",
        max_steps,
        "a positive integer or -1",
    )
    if max_epochs == -1 and max_steps in (None, -1):  # no end: the schedule's length would be float("inf")
        raise InputError(
            "trainer.max_epochs=-1 trains until trainer.max_steps, which is not set; give "
            "+trainer.max_steps=N (a positive integer), or a positive trainer.max_epochs"
        )
    limit = get("trainer.limit_train_batches")
    # 0 trains nothing, and the untrained model's numbers would be written as the run's results.
    _require(
        limit is None or (_is_int(limit) and limit >= 1) or (_number(limit) and 0 < limit <= 1),
        "trainer.limit_train_batches",
        limit,
        "a positive number of batches, or a fraction in (0, 1] of them (0 would train nothing)",
    )
    accumulate = get("trainer.accumulate_grad_batches")
    _require(
        accumulate is None or (_is_int(accumulate) and accumulate >= 1),
        "trainer.accumulate_grad_batches",
        accumulate,
        "a positive integer",
    )
    check_data_options(cfg.get("dataset"))  # the data modules' own checks (sve.data.options)
    above = get("predictions.float16_above_mb")
    _require(
        above is None or (_number(above) and above >= 0),
        "predictions.float16_above_mb",
        above,
        "a non-negative number of megabytes",
    )
    every = get("callbacks.checkpoint.every_n_steps")
    _require(
        every is None or (_is_int(every) and every >= 1),
        "callbacks.checkpoint.every_n_steps",
        every,
        "a positive integer or null",
    )
    if get("ckpt_path") is not None:
        _require(
            Path(str(get("ckpt_path"))).expanduser().is_file(),
            "ckpt_path",
            get("ckpt_path"),
            "an existing checkpoint file (e.g. <run dir>/checkpoints/last.ckpt)",
        )
    # plan=true on the CPU plans against the machine's free memory and never reads plan_memory_gib, so a bad
    # one (plan_memory_gib=-1 or abc) would pass unnoticed there: it is checked here, on every device.
    if "plan" in cfg:
        _require(isinstance(get("plan"), bool), "plan", get("plan"), "true or false")
    if "plan_memory_gib" in cfg:
        _require(
            _number(get("plan_memory_gib")) and get("plan_memory_gib") > 0,
            "plan_memory_gib",
            get("plan_memory_gib"),
            "the device memory in GiB that plan=true checks against, a positive number (e.g. 24 for an RTX 4090)",
        )
    check_logger_installed(cfg)


# What a logger target needs installed, and the extra that installs it.
LOGGER_PACKAGES = {
    "TensorBoardLogger": (("tensorboard", "tensorboardX"), "loggers"),
    "MLFlowLogger": (("mlflow",), "loggers"),
    "WandbLogger": (("wandb",), None),
}


def check_logger_installed(cfg: DictConfig) -> None:
    """``logger=tensorboard`` without tensorboard (say) is one line with the install command, before any work."""
    import importlib.util

    target = str((cfg.get("logger") or {}).get("_target_", ""))
    for name, (packages, extra) in LOGGER_PACKAGES.items():
        if target.endswith(name) and not any(importlib.util.find_spec(p) for p in packages):
            how = f"pip install 'singular-value-ensembles[{extra}]'" if extra else f"pip install {packages[0]}"
            raise InputError(
                f"logger {target} needs the {packages[0]} package, which is not installed: {how} (or logger=csv)"
            )


def check_wandb(cfg: DictConfig) -> None:
    """``logger=wandb`` online needs the network and a login; say how to run offline instead of hanging."""
    logger = cfg.get("logger") or {}
    if "WandbLogger" not in str(logger.get("_target_", "")) or logger.get("offline"):
        return
    if os.environ.get("WANDB_MODE") in ("offline", "disabled"):
        return
    hint = (
        "; without network use logger.offline=true (logs go to <run dir>/wandb; upload later with "
        "`wandb sync`) or logger=csv"
    )
    try:
        socket.create_connection(("api.wandb.ai", 443), timeout=5).close()
    except OSError as err:
        raise InputError(f"logger=wandb cannot reach api.wandb.ai ({err}){hint}") from None
    netrc = Path("~/.netrc").expanduser()
    if not os.environ.get("WANDB_API_KEY") and not (netrc.is_file() and "api.wandb.ai" in netrc.read_text()):
        raise InputError(f"logger=wandb needs a login (WANDB_API_KEY or `wandb login`){hint}")


# ----- keys the code does not read: `+ensembel_size=2` (Hydra's own hint after a typo) adds a key silently ------
from sve.paths import CONFIGS  # noqa: E402 - beside the section that reads it

# Hydra's instantiate keys and the group options' own label; no target receives them.
SPECIAL_KEYS = {"_target_", "_partial_", "_convert_", "_recursive_", "_args_", "name"}


@functools.cache
def root_keys() -> frozenset[str]:
    """The top-level keys a run reads: configs/train.yaml's own, its config groups, and what recipes and
    experiments set at the top level."""
    keys = {k for k in OmegaConf.load(CONFIGS / "train.yaml") if k not in ("defaults", "hydra")}
    keys |= {p.name for p in CONFIGS.iterdir() if p.is_dir()}
    for group in ("recipe", "experiment"):
        for path in (CONFIGS / group).glob("*.yaml"):
            keys |= {k for k in OmegaConf.load(path) if k != "defaults"}
    return frozenset(keys)


def accepted_keys(target) -> set[str] | None:
    """The keyword arguments ``target`` (a class or a function) takes, from its signature and, for a class
    whose ``__init__`` passes ``**kwargs`` on, its bases' (this framework's classes pass them to
    ``super().__init__``); None when it takes any keyword (``**kwargs`` of a function or of another
    package's class, which may go anywhere)."""
    import torch  # its Module ends the chain; the targets asked about import it anyway

    chain = [k for k in target.__mro__ if "__init__" in vars(k)] if inspect.isclass(target) else [target]
    # A subclass of this framework's classes (one's own method or data module, as docs/extending.md writes them)
    # passes **kwargs to super().__init__ as the framework's own classes do: its keys are checked against the
    # chain too, instead of only failing when Hydra builds it, after the data was read.
    extends_sve = inspect.isclass(target) and any(k.__module__.startswith("sve.") for k in chain)
    names: set[str] = set()
    for owner in chain:
        if owner in (object, torch.nn.Module):  # they take no keyword arguments
            return names
        function = vars(owner)["__init__"] if inspect.isclass(owner) else owner
        try:
            parameters = list(inspect.signature(function).parameters.values())
        except (TypeError, ValueError):
            return None
        if inspect.isclass(owner):
            parameters = parameters[1:]  # self
        names |= {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            return names
        if not inspect.isclass(owner) or not (owner.__module__.startswith("sve.") or extends_sve):
            return None
    return None


def _unknown(key: str, valid: set[str], where: str) -> InputError:
    import difflib

    name = key.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(name, sorted(valid), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return InputError(
        f"{key}: no such option{hint}. {where} reads: {', '.join(sorted(valid))}. A key added "
        "with + must be one the code reads; nothing would use this one"
    )


def _check_importable(target: str, prefix: str) -> None:
    """A target whose top-level package Python cannot find is most often one's own class in a project folder:
    the console scripts (sve-train, ...) do not look in the current directory, unlike ``python -m``. Said
    before Hydra tries the import, which would log an error about an uninstalled module first."""
    import importlib.util

    package = target.split(".", 1)[0]
    if package and importlib.util.find_spec(package) is None:
        raise InputError(
            f"{prefix}._target_={target!r}: no module named {package!r} on Python's path. For a class "
            "of your own project, install the project (pip install -e .) or put its folder on "
            f"PYTHONPATH (e.g. PYTHONPATH=$PWD sve-train ...); sve-train does not search the current "
            "directory. Otherwise expected a class or function path such as sve.methods.SVE"
        )


def check_known_keys(cfg: DictConfig) -> None:
    """Every top-level key is one the run reads, and every key of a node with ``_target_`` is an argument of
    that target (``+trainer.limit_train_batches=5`` passes; ``+trainer.limt_train_batches=5`` does not)."""
    known = root_keys()
    for key in cfg:
        if key not in known:
            raise _unknown(str(key), known, "the top level of configs/train.yaml")

    def walk(node, prefix: str) -> None:
        if not isinstance(node, DictConfig):
            return
        target = node.get("_target_")
        if isinstance(target, str):
            from hydra.utils import get_object

            _check_importable(target, prefix)
            try:
                valid = accepted_keys(get_object(target))
            except Exception as err:  # noqa: BLE001 - any import failure is the user's target
                raise InputError(
                    f"{prefix}._target_={target!r} cannot be imported ({type(err).__name__}: "
                    f"{err}); expected a class or function path"
                ) from None
            if valid is not None:
                for key in node:
                    if key not in SPECIAL_KEYS and key not in valid:
                        raise _unknown(f"{prefix}.{key}", valid, target)
            # The class checks its own values (a method, a data module: ``check_options``), before any work.
            own_check = getattr(get_object(target), "check_options", None)
            if callable(own_check):
                own_check(node, prefix)
        for key in node:
            if not OmegaConf.is_missing(node, key) and not OmegaConf.is_interpolation(node, key):
                walk(node[key], f"{prefix}.{key}" if prefix else str(key))

    for key in cfg:
        if key not in ("paths", "hydra"):
            walk(cfg[key], str(key))
