"""Entry point: ``python train.py method=sve dataset=sst2 backbone=bert_base ensemble_size=8``.

See README.md for the config groups; ``python train.py --help`` lists them.
"""

import hydra
from omegaconf import DictConfig

from sve.run import run


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
