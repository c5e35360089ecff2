"""The registry of methods: every option of the ``method`` config group, the class it builds, and that class's facts.

A method class registers itself where it is defined (``EnsembleMethod.__init_subclass__``, as timm's
``register_model`` and peft's ``register_peft_method`` do) and states its facts as class attributes
(``display_name``, its row label in the tables, and ``trains``, what its optimiser updates) and its kind by its
base classes (``sve.methods.kinds``): ``sampled`` (members are ``num_samples`` samples of one model),
``fits_after_training`` (``after_fit`` reads the training split) and ``epoch_snapshots`` (members are epoch-end
snapshots).
The options are the group's files (``sve/configs/method/*.yaml``) and what Hydra's ``ConfigStore`` holds
under ``method``; each is composed by Hydra itself, so a run, ``sve.wrap``, the plan, the benchmark and the
tables read the same settings and the same class. Nothing else lists methods by name
(``tests/methods/test_registry.py``).

Importing this module loads no torch: the class behind an option is imported when its facts are asked for.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass

from sve.paths import CONFIGS

GROUP = "method"
CLASSES: dict[str, type] = {}  # "module.QualName" -> class, filled as each method class is defined


def register(cls: type) -> type:
    """Adds a method class to the registry (called by ``EnsembleMethod.__init_subclass__``)."""
    CLASSES[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return cls


@contextmanager
def _hydra():
    """Hydra initialised on the package's configs for the duration, whatever Hydra state the caller is in (a
    user's own ``@hydra.main`` app, a test's ``initialize_config_dir``): that state is put back after."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    saved = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            yield GlobalHydra.instance()
    finally:
        restore_gh_from_backup(saved)


def options() -> list[str]:
    """Every option of the ``method`` group: the config files and the ``ConfigStore`` entries."""
    with _hydra() as gh:
        return sorted(gh.config_loader().get_group_options(GROUP))


@functools.cache
def option_config(option: str):
    """The option's config as ``train.py method=<option>`` composes it (its defaults list merged by Hydra);
    interpolations into the run's config (``${sigma_init}``) are left unresolved."""
    from hydra import compose
    from omegaconf import OmegaConf

    known = options()
    if option not in known:
        raise ValueError(f"method={option!r} is not valid; choose one of {known}")
    with _hydra():
        cfg = compose(f"{GROUP}/{option}")[GROUP]
    OmegaConf.set_readonly(cfg, True)  # cached and shared by every reader
    return cfg


@functools.cache
def learning_rates(option: str) -> dict[str, float]:
    """The learning rates ``train.py method=<option>`` trains at without a recipe: ``lr``, the option's own
    ``lr`` (Appendix C.3's rates) or else the default optimizer's, and ``sv_lr``, the singular values' own rate,
    where the option sets one."""
    from hydra import compose

    with _hydra():
        cfg = compose("train", overrides=[f"{GROUP}={option}"])
    rates = {"lr": float(cfg[GROUP].lr if cfg[GROUP].get("lr") is not None else cfg.optimizer.lr)}
    if cfg[GROUP].get("sv_lr") is not None:
        rates["sv_lr"] = float(cfg[GROUP].sv_lr)
    return rates


def method_class(option: str) -> type:
    """The registered class that ``option`` builds (its ``_target_``)."""
    from hydra.utils import get_class

    target = option_config(option)._target_
    cls = get_class(target)
    if CLASSES.get(f"{cls.__module__}.{cls.__qualname__}") is not cls:
        raise TypeError(
            f"method={option}: _target_ {target} is not a method class (a subclass of sve.methods.EnsembleMethod)"
        )
    return cls


@dataclass(frozen=True)
class MethodInfo:
    """What the readers of the registry know about one option (see the class attributes of ``EnsembleMethod``)."""

    option: str
    cls: type
    display_name: str
    sampled: bool  # a SampledMethod: members are num_samples samples of one model, ensemble_size is 1
    num_samples: int | None  # the option's default sample count (sampled methods only)
    fits_after_training: bool  # a FittedAfterTraining: after_fit reads the training split
    epoch_snapshots: bool  # a SnapshotMethod: members are epoch-end snapshots, a run trains ensemble_size epochs
    trains: str

    def members(self, ensemble_size: int) -> int:
        """Members of the trained method at evaluation, at the option's defaults and this ``ensemble_size``."""
        if self.sampled:
            return self.num_samples
        return self.cls.fixed_ensemble_size or ensemble_size

    def member_overrides(self, members: int) -> list[str]:
        """The config overrides that give ``members`` members: samples for a sampled method, else the size."""
        return ["ensemble_size=1", f"method.num_samples={members}"] if self.sampled else [f"ensemble_size={members}"]


@functools.cache
def info(option: str) -> MethodInfo:
    # A class names the options it serves (option_display_names); a subclass does not inherit its parent's.
    cls = method_class(option)
    name = vars(cls).get("option_display_names", {}).get(option, cls.display_name)
    sampled = is_kind(cls, "SampledMethod")
    return MethodInfo(
        option=option,
        cls=cls,
        display_name=name,
        sampled=sampled,
        num_samples=int(option_config(option).num_samples) if sampled else None,
        fits_after_training=is_kind(cls, "FittedAfterTraining"),
        epoch_snapshots=is_kind(cls, "SnapshotMethod"),
        trains=cls.trains,
    )


def is_kind(cls: type, kind: str) -> bool:
    """Whether ``cls`` is of the kind ``sve.methods.kinds.<kind>``. Looked up among the registered classes, not
    imported (the kinds import the base, which imports this module): a kind that no loaded class builds on is
    not registered yet, and ``cls`` is not of it."""
    base = CLASSES.get(f"sve.methods.kinds.{kind}")
    return base is not None and issubclass(cls, base)


def display_name(option: str) -> str:
    return info(option).display_name
