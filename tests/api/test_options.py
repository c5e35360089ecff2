"""``Ensemble.parameter_groups``: each group carries the learning rate the method's config recommends, read here
from the YAML files themselves (the method's ``lr``, else the default optimizer's), the singular values' own
``sv_lr`` included; an explicit rate, or one given to ``wrap``, wins."""

import pytest
import torch
import yaml
from torch import nn

import sve
from sve.paths import CONFIGS

torch.set_num_threads(1)


def config(group: str, name: str) -> dict:
    return yaml.safe_load((CONFIGS / group / f"{name}.yaml").read_text())


def recommended(method: str) -> float:
    """The rate train.py trains ``method`` at without a recipe: its config's lr, else the optimizer's (train.yaml's
    default optimizer is AdamW)."""
    lr = config("method", method).get("lr")
    return lr if lr is not None else config("optimizer", "adamw")["lr"]


def wrapped(method: str, **options):
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3)), torch.randn(4, 6)
    return sve.wrap(model, method, ensemble_size=2, num_classes=3, example_input=x, **options)


@pytest.mark.parametrize("method", ["sve", "lora_ensemble", "batch_ensemble"])
def test_the_groups_carry_the_rate_of_the_methods_config(method):
    ensemble = wrapped(method)
    groups = ensemble.parameter_groups()
    assert [g["lr"] for g in groups] == [recommended(method)]
    assert groups[0]["params"] == ensemble.trainable_parameters()
    optimizer = torch.optim.AdamW(groups)  # no lr needed: the groups name theirs
    assert optimizer.param_groups[0]["lr"] == recommended(method)
    assert [g["lr"] for g in ensemble.parameter_groups(lr=0.02)] == [0.02]
    assert [g["lr"] for g in wrapped(method, lr=5e-4).parameter_groups()] == [5e-4]
    assert recommended("batch_ensemble") == 1e-4 and recommended("sve") == 1e-3  # C.3's rate; the recipe's default


def test_the_singular_values_train_at_their_own_configured_rate():
    assert config("method", "sve_lora_rates")["sv_lr"] == 1e-3
    ensemble = wrapped("sve_lora_rates")
    values, rest = ensemble.parameter_groups(lr=0.05)
    assert values["lr"] == config("method", "sve_lora_rates")["sv_lr"] and rest["lr"] == 0.05
    assert all(p.dim() == 2 and p.shape[0] == 2 for p in values["params"])  # (M, r) singular values
    assert len(values["params"]) + len(rest["params"]) == len(ensemble.trainable_parameters())
    values, rest = wrapped("sve_lora_rates", sv_lr=0.3).parameter_groups()
    assert (values["lr"], rest["lr"]) == (0.3, recommended("sve"))  # sve_lora's lr is sve's: null, the recipe's
