"""``sve-train method=sve dataset=sst2 backbone=bert_base ensemble_size=8`` (also ``python train.py ...`` in a
checkout, and ``python -m sve.cli.train ...``): one run, or a Hydra multirun with ``-m``.

The config groups ship inside the package (``sve/configs``); ``sve-train --help`` lists them. Outputs go
under the current directory (``outputs/``, ``multirun/``) unless ``hydra.run.dir`` says otherwise.
"""

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

import sve.runs.resolvers  # noqa: F401 - ${package:} and ${run_id:}, before Hydra composes
from sve.errors import debugging, one_line_errors, user_error

log = logging.getLogger(__name__)


# Launchers that are extras: without their plugin Hydra says only "Could not load 'hydra/launcher/...'".
LAUNCHER_PLUGINS = {"slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
                    "submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
                    "submitit_local": ("hydra_plugins.hydra_submitit_launcher", "slurm")}  # fmt: skip


def main() -> None:
    """``sve-train``: a launcher whose plugin is not installed is one line with the install command."""
    import importlib.util
    import sys

    for arg in sys.argv[1:]:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "hydra/launcher" and value in LAUNCHER_PLUGINS:
            module, extra = LAUNCHER_PLUGINS[value]
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:  # not even the hydra_plugins namespace
                found = False
            if not found:
                print(f"error: hydra/launcher={value} needs the submitit launcher plugin, which is not installed: "
                      f"pip install 'singular-value-ensembles[{extra}]' (in a checkout: pip install -e "
                      f"'.[{extra}]')", file=sys.stderr)  # fmt: skip
                raise SystemExit(2)
    hydra_main()


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
def hydra_main(cfg: DictConfig) -> None:
    print(recipe_line(cfg))
    from sve.runs.preflight import check_sources
    from sve.runs.validate import check_values

    if cfg.get("plan"):  # the memory a run would take per device, on fake tensors: nothing trained or downloaded
        with one_line_errors():
            check_values(cfg)
            from sve.runs.plan import print_plan

            print_plan(cfg)
        return
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        with one_line_errors():  # a user error is one line naming what to change; a bug keeps its traceback
            check_values(cfg)  # a bad value answers before torch is imported
            check_sources(cfg)  # and so does a download that cannot happen (no network)
            from sve.runs.run import run  # torch and Lightning: only once there is a run to do

            run(cfg)
        return
    from sve.errors import RunInterrupted
    from sve.runs.multirun import record_failure
    from sve.runs.run import run

    try:
        run(cfg)
    except RunInterrupted as err:
        # A stop from outside (a scheduler's SIGTERM, `kill`, Ctrl-C) is meant for the whole sweep: going on
        # would start the next run only to be stopped in it. SystemExit passes through Hydra's job loop, which
        # catches Exception; this run is left without failed.json (incomplete), so a rerun resumes it.
        import sys

        sweep_dir = HydraConfig.get().sweep.dir
        print(f"error: {err}. The sweep stops here; to finish it, run the same command again with "
              f"hydra.sweep.dir={sweep_dir} (finished runs are skipped)", file=sys.stderr, flush=True)
        raise SystemExit(128 + err.signal_number) from None
    except Exception as err:  # one failing run does not stop the sweep; sve.runs.multirun lists it at the end
        if user_error(err) is not None and not debugging():  # what to change, in one line; a bug keeps its trace
            log.error("run failed; the sweep goes on: %s", user_error(err))
        else:
            log.exception("run failed; the sweep goes on")
        record_failure(Path(cfg.paths.output_dir), err)


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
