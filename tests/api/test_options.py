"""``Ensemble.parameter_groups``: each group carries the library's measured default rate (``sve.methods.rates``,
checked against its sources in ``test_rates.py``), the singular values' own ``sv_lr`` included; an explicit rate,
or one given to ``wrap``, wins; a method with no row takes the rate its config trains at."""

import pytest
import torch
from torch import nn

import sve
from sve.api import options
from sve.methods import rates

torch.set_num_threads(1)


def wrapped(method: str, **settings):
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3)), torch.randn(4, 6)
    return sve.wrap(model, method, ensemble_size=2, num_classes=3, example_input=x, **settings)


@pytest.mark.parametrize(("method", "rate"), [("sve", 1e-2), ("lora_ensemble", 3e-4), ("batch_ensemble", 3e-5)])
def test_the_groups_carry_the_methods_measured_rate(method, rate):
    ensemble = wrapped(method)
    groups = ensemble.parameter_groups()
    assert [g["lr"] for g in groups] == [rate] == [rates.RATES[method].lr]
    assert groups[0]["params"] == ensemble.trainable_parameters()
    optimizer = torch.optim.AdamW(groups)  # no lr needed: the groups name theirs
    assert optimizer.param_groups[0]["lr"] == rate
    assert [g["lr"] for g in ensemble.parameter_groups(lr=0.02)] == [0.02]
    assert [g["lr"] for g in wrapped(method, lr=5e-4).parameter_groups()] == [5e-4]


def test_the_singular_values_train_at_their_own_rate():
    ensemble = wrapped("sve_lora_rates")
    values, rest = ensemble.parameter_groups(lr=0.05)
    assert values["lr"] == rates.RATES["sve_lora_rates"].sv_lr == 1e-2 and rest["lr"] == 0.05
    assert all(p.dim() == 2 and p.shape[0] == 2 for p in values["params"])  # (M, r) singular values
    assert len(values["params"]) + len(rest["params"]) == len(ensemble.trainable_parameters())
    values, rest = wrapped("sve_lora_rates", sv_lr=0.3).parameter_groups()
    assert (values["lr"], rest["lr"]) == (0.3, 3e-4)  # the option wins; the adapters at sve_lora's tuned rate


def test_a_method_without_a_measured_rate_takes_its_configs(monkeypatch):
    ensemble = wrapped("batch_ensemble")
    monkeypatch.delitem(rates.RATES, "batch_ensemble")  # as a method of one's own config folder
    assert [g["lr"] for g in ensemble.parameter_groups()] == [options.registry.learning_rates("batch_ensemble")["lr"]]
    assert options.registry.learning_rates("batch_ensemble")["lr"] == 1e-4  # C.3's rate in its config
