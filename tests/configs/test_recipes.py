"""A paper dataset selects its Table 7 recipe; the command line and `recipe=none` win over it."""

import pytest

from tests.conftest import compose_cfg, config_options

# Table 7, one column per dataset: backbone, lr, weight decay, scheduler, warmup, epochs (or steps), batch,
# M, sigma_init. Warmup is in epochs for the vision recipes and a fraction of the steps for the NLP ones.
TABLE7 = {
    "flowers102": ("dino_vits16", 1e-3, 0.05, "cosine", 5, 10, 16, 4, 0.005),
    "cifar100": ("dino_vits16", 1e-4, 0.05, "cosine", 5, 10, 32, 4, 0.005),
    "dtd": ("dinov2_vits14", 1e-3, 0.05, "cosine", 5, 10, 16, 4, 0.005),
    "oxford_pets": ("dinov2_vits14", 1e-3, 0.05, "cosine", 0, "200 steps", 16, 4, 0.01),
    "arc_easy": ("llama2_7b", 3e-4, 0.01, "linear", 0.03, 5, 1, 16, 0.01),
    "sst2": ("bert_base", 3e-4, 0.01, "cosine", 0.05, 3, 16, 8, 0.01),
}


def _table7_row(cfg):
    warmup = cfg.scheduler.warmup_epochs or cfg.scheduler.warmup_fraction
    length = f"{cfg.trainer.max_steps} steps" if cfg.trainer.get("max_steps", -1) > 0 else cfg.trainer.max_epochs
    return (
        cfg.backbone.name,
        cfg.optimizer.lr,
        cfg.optimizer.weight_decay,
        cfg.scheduler.kind,
        warmup,
        length,
        cfg.dataset.batch_size,
        cfg.ensemble_size,
        cfg.sigma_init,
    )


@pytest.mark.parametrize("dataset", sorted(TABLE7))
def test_a_paper_dataset_selects_its_table7_recipe(dataset):
    cfg = compose_cfg([f"dataset={dataset}"])
    assert cfg.recipe == dataset
    assert _table7_row(cfg) == TABLE7[dataset]


def test_cifar100_c_trains_with_the_cifar100_recipe():
    assert _table7_row(compose_cfg(["dataset=cifar100_c"])) == TABLE7["cifar100"]


def test_the_command_line_wins_over_the_recipe():
    cfg = compose_cfg(["dataset=flowers102", "backbone=tiny_vit", "optimizer.lr=0.5", "ensemble_size=2"])
    assert (cfg.backbone.name, cfg.optimizer.lr, cfg.ensemble_size, cfg.sigma_init) == ("tiny_vit", 0.5, 2, 0.005)


def test_recipe_none_keeps_the_tiny_defaults():
    cfg = compose_cfg(["dataset=flowers102", "recipe=none"])
    plain = compose_cfg([])
    assert cfg.recipe == "none" and cfg.backbone.name == "tiny_vit"
    for key in ("ensemble_size", "sigma_init", "optimizer", "scheduler"):
        assert cfg[key] == plain[key], key


@pytest.mark.parametrize("dataset", ["synthetic_image", "synthetic_text", "cifar10", "fashion_mnist"])
def test_datasets_outside_the_paper_have_no_recipe(dataset):
    assert compose_cfg([f"dataset={dataset}"]).recipe == "none"


def test_every_recipe_and_experiment_names_itself():
    for recipe in config_options("recipe"):
        assert compose_cfg([f"recipe={recipe}"]).recipe == recipe
    for experiment in config_options("experiment"):
        assert compose_cfg([f"experiment={experiment}"]).experiment_name == experiment
    assert compose_cfg([]).experiment_name is None


def test_an_experiment_keeps_its_own_backbone_over_the_recipes():
    assert compose_cfg(["experiment=cifar100_dinov2"]).backbone.name == "dinov2_vits14"
    assert compose_cfg(["experiment=cifar100_random"]).backbone.name == "vit_small_random"
    assert compose_cfg(["experiment=sst2_minilm_cpu"]).backbone.name == "minilm_l6"


def test_train_prints_the_recipe():
    from sve.cli.train import recipe_line

    line = recipe_line(compose_cfg(["dataset=oxford_pets"]))
    assert line.startswith("recipe: oxford_pets (backbone dinov2_vits14, lr 0.001")
    assert "200 steps" in line and "ensemble_size 4, sigma_init 0.01)" in line
    # A method's own rate replaces the recipe's in training, so the line names it.
    line = recipe_line(compose_cfg(["dataset=oxford_pets", "method=sve", "method.lr=0.03"]))
    assert ", lr 0.03 (method.lr; the recipe's is 0.001" in line
