"""A method's settings as its config group states them: the defaults ``wrap`` builds with, the options it
takes, and the learning rates it recommends (``Ensemble.parameter_groups``)."""

from __future__ import annotations

import inspect

from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError

from sve.methods import rates, registry
from sve.methods.base import EnsembleMethod
from sve.paths import register_path_resolvers

register_path_resolvers()  # ${sve_cache:} in svd_cache's default, resolved below

# Config keys that are the training recipe's, not the method's (a hand loop sets its own optimizer).
RECIPE_KEYS = ("_target_", "name", "lr")


def method_names() -> list[str]:
    return registry.options()


def method_class_and_defaults(method: str) -> tuple[type, dict]:
    """The class of ``method`` and its config's defaults: environment defaults resolved (``svd_cache`` is
    ``$SVE_SVD_CACHE`` or ``$XDG_CACHE_HOME/sve/svd``, as for ``train.py``), values taken from a run's recipe
    (``sigma_init``) left to the class's own default."""
    cfg = method_config(method)
    cls = registry.method_class(method)
    defaults = {}
    for key in cfg:
        if key in RECIPE_KEYS:
            continue
        try:  # an environment default resolves (the SVD cache's directory, as train.py has it) ...
            value = cfg[key]
        except InterpolationResolutionError:  # ... a run's recipe key does not: the class's default applies
            continue
        defaults[key] = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return cls, defaults


def method_config(method: str):
    """The method's config as ``train.py method=<method>`` composes it (Hydra's compose, through the registry)."""
    return registry.option_config(method)


def valid_options(cls: type, defaults: dict) -> list[str]:
    """Keyword arguments ``wrap`` passes on to a method: its config's keys and its classes' parameters."""
    names = set(defaults)
    for klass in cls.__mro__:
        if issubclass(klass, EnsembleMethod):
            names |= {p for p in inspect.signature(klass.__init__).parameters if p not in ("self", "backbone")}
    names -= {"ensemble_size", "num_classes", "task", "args", "kwargs", "common"}
    return sorted(names)


def parameter_groups(method: EnsembleMethod, option: str, lr: float | None = None) -> list[dict]:
    """The method's optimizer groups, each with its learning rate: ``lr``, else the one given to ``wrap``
    (``lr=``), else the library's measured default (``sve.methods.rates``: the miniature's tuned rate, or the
    paper's), else, for a method of one's own configs, the rate ``train.py method=<option>`` trains at without a
    recipe (``registry.learning_rates``). A group that names its own rate keeps it (the singular values'
    ``sv_lr``, from ``wrap``'s option, else ``sve.methods.rates``, else the config)."""
    if lr is None:
        lr = method.lr if method.lr is not None else rates.default_lr(option)
    if lr is None:
        lr = registry.learning_rates(option)["lr"]
    return [{**group, "lr": group.get("lr", lr)} for group in method.parameter_groups()]
