"""``sve-train method=sve dataset=sst2 backbone=bert_base ensemble_size=8`` (also ``python train.py ...`` in a
checkout, and ``python -m sve.cli.train ...``): one run, or a Hydra multirun with ``-m``.

The config groups ship inside the package (``sve/configs``); ``sve-train --help`` lists them. Outputs go
under the current directory (``outputs/``, ``multirun/``) unless ``hydra.run.dir`` says otherwise.
"""

import logging
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

import sve.runs.resolvers  # noqa: F401 - ${package:} and ${run_id:}, before Hydra composes
from sve.errors import InputError, debugging, one_line_errors, user_error
from sve.runs import rundir

log = logging.getLogger(__name__)


# Launchers that are extras: without their plugin Hydra says only "Could not load 'hydra/launcher/...'".
LAUNCHER_PLUGINS = {
    "slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
    "submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
    "submitit_local": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
}


# Where @hydra.main finds the primary config: sve/configs/train.yaml.
CONFIG_PATH, CONFIG_NAME = "../configs", "train"


def main() -> None:
    """``sve-train``: ``--help`` lists the config groups and keys; a mistake Hydra would report on several lines
    (an unknown option, key or group) and a bad value are one line (exit 2), before torch is imported and
    without a run directory left behind. Hydra alone composes the config; ``one_run`` checks its values."""
    import sys

    from hydra._internal.utils import get_args_parser  # the command line as @hydra.main reads it

    args = get_args_parser().parse_args(sys.argv[1:])
    if args.help:
        print(usage())
        raise SystemExit(0)
    check_launcher(args.overrides)
    if hydra_command(args):
        hydra_main()  # Hydra's own answer, as for any application
        return
    with one_line_errors():
        dirs = check_command_line(args)
    start_hydra(args, dirs)


def usage() -> str:
    from sve.cli.configs import groups_help, keys_help

    head = __doc__.split("\n\n")[0].replace("``", "")
    return f"""usage: sve-train [group=option ...] [key=value ...] [-m] [--config-dir DIR] [--cfg job]

{head}

Config groups (group=option; every key of the chosen option is set as group.key=value, e.g. dataset.root=DIR):
{groups_help()}

Main keys (key=default):
{keys_help()}

+key=value adds a key the chosen option lacks (one its code reads), ~key removes one. --config-dir DIR adds your
own config folder (DIR/method/*.yaml, DIR/experiment/*.yaml, ...). --cfg job prints the composed config without
running it. -m runs a sweep (method=sve,deep_ensemble seed=0,1). Environment: SVE_VERBOSE=1 keeps the notices of
the libraries that are hidden by default; SVE_DEBUG=1 shows the traceback of an error. Hydra's own options:
--hydra-help."""


def check_launcher(overrides: list[str]) -> None:
    """A launcher whose plugin is not installed is one line with the install command."""
    import importlib.util
    import sys

    for arg in overrides:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "hydra/launcher" and value in LAUNCHER_PLUGINS:
            module, extra = LAUNCHER_PLUGINS[value]
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:  # not even the hydra_plugins namespace
                found = False
            if not found:  # the whole answer: no traceback to point to
                print(
                    f"error: hydra/launcher={value} needs the submitit launcher plugin, which is not installed: "
                    f"pip install 'singular-value-ensembles[{extra}]' (in a checkout: pip install -e "
                    f"'.[{extra}]')",
                    file=sys.stderr,
                )
                raise SystemExit(2)


def hydra_command(args) -> bool:
    """Whether the command line is one of Hydra's own commands (``--cfg``, ``--info``, ...), names another
    primary config, or combines commands Hydra refuses together: Hydra answers those as for any application."""
    return bool(
        args.cfg
        or args.info
        or args.shell_completion
        or args.hydra_help
        or args.resolve
        or args.experimental_rerun
        or args.config_path
        or args.config_name not in (None, CONFIG_NAME)
        or (args.run and args.multirun)
    )


def check_command_line(args) -> list[Path]:
    """What can be checked before composing: ``--config-dir`` names a folder, and every value a sweep gives a
    config group is one of its options (the sweep's jobs compose them one by one, after the first has started).
    Returns the config folders the groups are looked up in, where an unknown option's valid ones are read."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from sve.cli.configs import check_group_values, search_dirs

    if args.config_dir is not None and not Path(args.config_dir).is_dir():
        raise InputError(
            f"--config-dir {args.config_dir}: no such directory; expected your config folder (holding "
            "method/, dataset/, experiment/ ... with *.yaml options)"
        )
    try:
        parsed = OverridesParser.create().parse_overrides(args.overrides)
    except Exception:  # noqa: BLE001 - a syntax error: Hydra's own message points into the override
        return search_dirs(args.config_dir)
    searchpath = [str(p) for o in parsed if o.key_or_group == "hydra.searchpath" for p in o.value()]
    dirs = search_dirs(args.config_dir, searchpath)
    if args.multirun or any(o.is_sweep_override() for o in parsed):
        check_group_values(args.overrides, dirs)
    return dirs


def start_hydra(args, dirs: list[Path]) -> None:
    """Starts the run or the sweep as ``@hydra.main`` does (``hydra._internal.utils._run_hydra`` and ``_run_app``:
    the same search path, task name and mode), except that a composition error naming an unknown option, group
    or key is one line naming the closest valid one (exit 2). Any other error is Hydra's to report."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import (
        create_automatic_config_search_path,
        detect_calling_file_or_module_from_task_function,
        detect_task_name,
        run_and_report,
    )
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException

    from sve.cli.configs import compose_error

    calling_file, calling_module = detect_calling_file_or_module_from_task_function(job)
    search_path = create_automatic_config_search_path(calling_file, calling_module, CONFIG_PATH)
    if args.config_dir is not None:  # where @hydra.main puts --config-dir: after the package's configs
        search_path.prepend(
            provider="command-line",
            path=f"file://{os.path.abspath(args.config_dir)}",
            anchor=SearchPathQuery(provider="schema"),
        )
    app = Hydra.create_main_hydra2(detect_task_name(calling_file, calling_module), search_path)
    overrides = list(args.overrides)
    mode = app.get_mode(config_name=CONFIG_NAME, overrides=overrides)  # a config may set hydra.mode
    if mode is None or (args.multirun and mode == RunMode.RUN):
        mode = RunMode.MULTIRUN if args.multirun else RunMode.RUN
        overrides.append(f"hydra.mode={mode.name}")
    launch = app.multirun if mode == RunMode.MULTIRUN else app.run

    def compose_and_launch() -> None:
        try:
            launch(config_name=CONFIG_NAME, task_function=job, overrides=overrides)
        except ConfigCompositionException as err:
            one_line = compose_error(err, dirs)
            if one_line is None:
                raise
            with one_line_errors():  # its SystemExit passes through Hydra's report of exceptions
                raise one_line from None

    try:
        run_and_report(compose_and_launch)
    finally:
        GlobalHydra.instance().clear()


def job(cfg: DictConfig) -> None:
    """What Hydra runs in the run directory (in a sweep, in each job's): one run, its plan, or a sweep's job."""
    from sve.cli.quiet import hide_noise

    hide_noise()  # after Hydra has configured logging for the job
    if cfg.get("plan") or HydraConfig.get().mode != RunMode.MULTIRUN:
        # a user error is one line naming what to change; a bug keeps its traceback
        with nothing_left_if_refused(), one_line_errors():
            one_run(cfg)
    else:
        sweep_job(cfg)


# Hydra's own commands (--cfg, --info, ...) go through its decorator, as for any application.
hydra_main = hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name=CONFIG_NAME)(job)


def one_run(cfg: DictConfig) -> None:
    """The values, checked before torch is imported (a bad value answers at once); then the plan (``plan=true``:
    the memory a run would take per device, on fake tensors; nothing trained or downloaded), or the sources the
    run would download (one that cannot happen, without network, answers before torch too) and the run."""
    from sve.runs.validate import check_values

    check_values(cfg)
    if cfg.get("plan"):
        from sve.runs.plan_report import print_plan

        print(recipe_line(cfg))
        print_plan(cfg)
        return
    from sve.runs.preflight import check_sources

    check_sources(cfg)
    print(recipe_line(cfg))
    from sve.runs.run import run  # torch and Lightning: only once there is a run to do

    run(cfg, values_checked=True)


def sweep_job(cfg: DictConfig) -> None:
    """One job of a multirun: a failing run does not stop the sweep (``sve.runs.multirun`` lists it at the end);
    a stop from outside does."""
    from sve.errors import RunInterrupted
    from sve.runs.multirun import record_failure
    from sve.runs.run import run

    print(recipe_line(cfg))
    try:
        run(cfg)  # checks the values itself: a bad one fails this job only
    except RunInterrupted as err:
        # A stop from outside (a scheduler's SIGTERM, `kill`, Ctrl-C) is meant for the whole sweep: going on
        # would start the next run only to be stopped in it. SystemExit passes through Hydra's job loop, which
        # catches Exception; this run is left without failed.json (incomplete), so a rerun resumes it.
        import sys

        sweep_dir = HydraConfig.get().sweep.dir
        print(
            f"error: {err}. The sweep stops here; to finish it, run the same command again with "
            f"hydra.sweep.dir={sweep_dir} (finished runs are skipped)",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(128 + err.signal_number) from None
    except Exception as err:  # one failing run does not stop the sweep; sve.runs.multirun lists it at the end
        if user_error(err) is not None and not debugging():  # what to change, in one line; a bug keeps its trace
            log.error("run failed; the sweep goes on: %s", user_error(err))
        else:
            log.exception("run failed; the sweep goes on")
        record_failure(Path(cfg.paths.output_dir), err)


# What every run directory holds before the run does any work (Hydra's .hydra/ and <job>.log, the lock, the
# config the directory remembers: sve.runs.rundir): a directory holding only these holds nothing of value.
BOOKKEEPING = (".hydra", rundir.LOCK, rundir.RUN_CONFIG)


@contextmanager
def nothing_left_if_refused():
    """A run refused with a user error (exit status 2) before it wrote anything removes the directory Hydra
    created for it (and the parents Hydra created), so a typo leaves no ``outputs/.../<time>/`` behind; a
    directory that existed before the run, or one the run wrote into, is kept."""
    try:
        yield
    except SystemExit as stop:
        top = rundir.created_by_this_run
        if stop.code == 2 and top is not None and HydraConfig.initialized():
            directory = Path(HydraConfig.get().runtime.output_dir)
            log_file = f"{HydraConfig.get().job.name}.log"
            written = (
                [p for p in directory.iterdir() if p.name not in (*BOOKKEEPING, log_file)] if directory.is_dir() else []
            )
            if directory.is_dir() and not written and (directory == top or top in directory.parents):
                release_log_files(directory)
                shutil.rmtree(directory, ignore_errors=True)
                for parent in directory.parents:  # the parents Hydra made for it, when they hold nothing else
                    if parent == top.parent or any(parent.iterdir()):
                        break
                    parent.rmdir()
        raise


def release_log_files(directory: Path) -> None:
    """Closes and detaches the logging handlers writing into ``directory`` (Hydra's ``<job>.log``), so nothing
    is written there once it is removed."""
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in list(getattr(logger, "handlers", [])):
            if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).is_relative_to(directory):
                logger.removeHandler(handler)
                handler.close()


def recipe_line(cfg: DictConfig) -> str:
    """Which Table 7 recipe the run uses (configs/recipe/; a paper dataset selects its own), and its values."""
    get = lambda key: OmegaConf.select(cfg, key, default=None)  # noqa: E731 - a group may be removed (~scheduler)
    max_steps = get("trainer.max_steps") or -1
    length = f"{max_steps} steps" if max_steps > 0 else f"{get('trainer.max_epochs')} epochs"
    # method.lr replaces the recipe's rate (sve.training.module.configure_optimizers): name the one that trains.
    lr = get("optimizer.lr")
    if get("method.lr") is not None:
        lr = f"{get('method.lr')} (method.lr; the recipe's is {lr})"
    return (
        f"recipe: {get('recipe')} (backbone {get('backbone.name')}, lr {lr}, weight decay "
        f"{get('optimizer.weight_decay')}, {get('scheduler.kind') or 'constant'} schedule, {length}, batch "
        f"{get('dataset.batch_size')}, ensemble_size {get('ensemble_size')}, sigma_init {get('sigma_init')})"
    )


if __name__ == "__main__":
    main()
