"""SVE + LoRA's own learning rate for the singular values (``method.sv_lr``), and the run-config rule that lets
runs started before an option existed continue (a key absent then, null now, is no change)."""

from __future__ import annotations

import pytest
import torch

from sve.layers.sv_linear import SVLinear
from sve.runs.run import build
from sve.runs.rundir import config_changes
from tests.conftest import compose_cfg

BASE = ["backbone=tiny_vit", "dataset=synthetic_image", "ensemble_size=2"]


def hybrid(*extra: str):
    """(method, training module, a training batch) of SVE + LoRA on the tiny ViT."""
    _, datamodule, method, module = build(compose_cfg([*BASE, "method=sve_lora", *extra]))
    module.scheduler_factory = None
    datamodule.setup()
    return method, module, next(iter(datamodule.train_dataloader()))


def test_the_singular_values_train_at_their_own_rate_and_nothing_else_does():
    method, module, _ = hybrid("method.lr=0.001", "method.sv_lr=0.05")
    groups = module.configure_optimizers().param_groups
    layers = [m for m in method.modules() if isinstance(m, SVLinear)]
    assert layers and [g["lr"] for g in groups] == [pytest.approx(0.05), pytest.approx(0.001)]
    assert {id(p) for p in groups[0]["params"]} == {id(m.singular_values) for m in layers}
    trainable = {id(p) for p in method.trainable_parameters()}
    assert {id(p) for g in groups for p in g["params"]} == trainable  # every trainable tensor, each once
    assert sum(len(g["params"]) for g in groups) == len(trainable)
    # One SGD step at method.lr = 0: exactly the singular values move, by sv_lr times their gradient.
    method, _, batch = hybrid("method.sv_lr=0.05")
    optimizer = torch.optim.SGD(method.parameter_groups(), lr=0.0)
    before = {n: p.detach().clone() for n, p in method.named_parameters()}
    method.loss(method(batch), batch["labels"]).backward()
    optimizer.step()
    moved = {n for n, p in method.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all(n.endswith("singular_values") for n in moved)
    for n, p in method.named_parameters():
        if n in moved:
            torch.testing.assert_close(p, before[n] - 0.05 * p.grad, rtol=0, atol=1e-7)


def test_without_sv_lr_there_is_one_group_and_bad_values_are_refused():
    method, module, _ = hybrid("method.lr=0.001")
    (group,) = module.configure_optimizers().param_groups
    assert group["lr"] == pytest.approx(0.001) and len(group["params"]) == len(method.trainable_parameters())
    for bad, shown in (("0", "0"), ("-0.5", "-0.5"), ("fast", "'fast'")):
        with pytest.raises(Exception, match=rf"method\.sv_lr={shown}: the singular values' learning rate must be"):
            hybrid(f"method.sv_lr={bad}")


def test_an_option_added_later_at_null_is_no_change_of_a_runs_config():
    saved = {"method": {"name": "sve_lora", "lr": 0.001}}
    assert config_changes(saved, {"method": {"name": "sve_lora", "lr": 0.001, "sv_lr": None}}) == []
    assert config_changes(saved, {"method": {"name": "sve_lora", "lr": 0.001, "sv_lr": 0.01}}) == [
        ("method.sv_lr", "<absent>", 0.01)
    ]
    assert config_changes({"method": {"sv_lr": None, "lr": 1}}, {"method": {"lr": 1}}) == []
    assert config_changes({"t": [1, 2], "a": 1}, {"a": 1}) == [("t", [1, 2], "<absent>")]  # lists compare, never hash


def test_wrap_hands_the_optimizer_the_groups():
    from torch import nn

    import sve

    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3)), torch.randn(4, 6)
    ensemble = sve.wrap(model, "sve_lora", ensemble_size=2, num_classes=3, example_input=x, sv_lr=0.02)
    first, rest = torch.optim.AdamW(ensemble.parameter_groups(lr=1e-4)).param_groups
    assert (first["lr"], rest["lr"]) == (0.02, 1e-4)
    assert len(first["params"]) + len(rest["params"]) == len(ensemble.trainable_parameters())
    assert all(p.dim() == 2 and p.shape[0] == 2 for p in first["params"])  # (M, r) singular values
