"""The config resolvers every entry point registers before Hydra composes a config (light: no torch).

- ``${package:}``, ``${sve_cache:}``, ``${shared:}``: where things are (``sve.paths.register_path_resolvers``,
  which the library API registers too);
- ``${run_id:}``: ends every run directory's name (``sve.runs.rundir.run_id``), so runs started in the same second
  never share one;
- ``${members:TARGET,ENSEMBLE_SIZE}``: the member count a run of the method ``TARGET`` records: its fixed count
  (``single``, ``svf``, ``mc_dropout``: 1), else ``ENSEMBLE_SIZE``; it names a sweep's job folders. It imports
  the method's class (torch), which only a job about to run does;
- ``${job_suffix:}``: the rest of a sweep job's folder name, from its overrides (``job_suffix``).
"""

from __future__ import annotations

import importlib

from omegaconf import OmegaConf

from sve.paths import register_path_resolvers


def recorded_members(target: str, ensemble_size) -> int:
    module, _, name = str(target).rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    fixed = getattr(cls, "fixed_ensemble_size", None)
    return int(fixed if fixed is not None else ensemble_size)


# Already in a job folder's name (``<method>_m<M>_seed<S>``), or not part of what a run is.
NAMED_KEYS = ("method", "ensemble_size", "seed")
NOT_THE_RUN = ("skip_finished", "resume_with_changes")
MAX_SUFFIX = 48  # longer override lists are named by a hash


def override_key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def swept_keys(argv: list[str]) -> set[str] | None:
    """The keys a multirun command line sweeps (``seed=0,1,2``, ``range(...)``, ``choice(...)``), or None when the
    command line is not this process's (a launcher that runs jobs elsewhere) or cannot be read."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = [a for a in argv if "=" in a and not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except Exception:  # noqa: BLE001 - any parse failure: fall back to naming by every override
        return None
    keys = {o.key_or_group for o in parsed if o.is_sweep_override()}
    return keys or None


def job_suffix(members=None, ensemble_size=None) -> str:
    """What ends a sweep job's folder name after ``<method>_m<M>_seed<S>``: the job's values of the other swept
    keys (``_optimizer.lr=0.001``), or, where the sweep's command line is not at hand, a hash of the job's other
    overrides. Never the job's number: a sweep run again with a value added renumbers its jobs, and every
    finished run would be trained again under its new number; by its overrides a job finds its folder again.
    ``ensemble_size`` is named by ``m<M>`` only where ``members`` (what the run records) equals it: a method of
    fixed size (single: M = 1) swept over ensemble_size=1,4 would otherwise give two jobs one folder."""
    import hashlib
    import re
    import sys

    from hydra.core.hydra_config import HydraConfig

    try:
        task = list(HydraConfig.get().overrides.task)
    except ValueError:  # not inside a Hydra job
        return ""
    named = NAMED_KEYS if str(members) == str(ensemble_size) else tuple(k for k in NAMED_KEYS if k != "ensemble_size")
    own = sorted(
        o for o in task if override_key(o) not in named + NOT_THE_RUN and not override_key(o).startswith("hydra.")
    )
    swept = swept_keys(sys.argv[1:])
    if swept is not None:
        shown = [o for o in own if override_key(o) in swept]
        text = re.sub(r"[^A-Za-z0-9._=,+-]", "_", ",".join(shown))
        if len(text) <= MAX_SUFFIX:
            return f"_{text}" if text else ""
        own = shown
    return f"_{hashlib.sha1(','.join(own).encode()).hexdigest()[:8]}" if own else ""


def register() -> None:
    from sve.runs.rundir import run_id

    register_path_resolvers()
    if not OmegaConf.has_resolver("members"):
        OmegaConf.register_new_resolver("members", recorded_members)
    if not OmegaConf.has_resolver("job_suffix"):
        OmegaConf.register_new_resolver("job_suffix", job_suffix)
    if not OmegaConf.has_resolver("run_id"):
        OmegaConf.register_new_resolver("run_id", run_id, use_cache=True)


register()


def compose_run(overrides: list[str]):
    """The config ``sve-train <overrides>`` runs with, composed from the package's configs (resolvers registered;
    no Hydra job, so ``hydra.*`` is not resolved)."""
    from hydra import compose, initialize_config_dir

    from sve.paths import CONFIGS

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=list(overrides))
