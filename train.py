"""Entry point: ``python train.py method=sve dataset=sst2 backbone=bert_base ensemble_size=8``.

See README.md for the config groups; ``python train.py --help`` lists them.
"""

import hydra
from omegaconf import DictConfig

from sve.run import run


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> None:
    print(recipe_line(cfg))
    run(cfg)


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
