"""Entry point: ``python train.py method=sve dataset=sst2 backbone=bert_base ensemble_size=8``.

See README.md for the config groups; ``python train.py --help`` lists them.
"""

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from sve.errors import InputError
from sve.run import run
from sve.multirun import record_failure

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> None:
    print(recipe_line(cfg))
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        try:
            run(cfg)
        except InputError as err:  # says what to change: no traceback needed
            raise SystemExit(f"error: {err}") from None
        return
    try:
        run(cfg)
    except Exception as err:  # one failing run does not stop the sweep; sve.multirun lists it at the end
        log.exception("run failed; the sweep goes on")
        record_failure(Path(cfg.paths.output_dir), err)


def recipe_line(cfg: DictConfig) -> str:
    """Which Table 7 recipe the run uses (configs/recipe/; a paper dataset selects its own), and its values."""
    max_steps = cfg.trainer.get("max_steps", -1)
    length = f"{max_steps} steps" if max_steps > 0 else f"{cfg.trainer.max_epochs} epochs"
    return (
        f"recipe: {cfg.recipe} (backbone {cfg.backbone.name}, lr {cfg.optimizer.lr}, weight decay "
        f"{cfg.optimizer.weight_decay}, {cfg.scheduler.kind} schedule, {length}, batch {cfg.dataset.batch_size}, "
        f"ensemble_size {cfg.ensemble_size}, sigma_init {cfg.sigma_init})"
    )


if __name__ == "__main__":
    main()
