"""Every method in configs/method x every tiny backbone family, generated from the config options: adding a
method (one class, one YAML) puts it in this table with no edit here.

Each row asserts: the member layout; every trainable parameter receives a gradient (so DDP never meets an
unused parameter) and only trainable parameters change in a step; members equal the base model at init
where the method promises it (``equals_base_at_init``, init noise off); for every member layer, on the
activations it really sees, ``merge(m)`` == ``select(m)`` == block m of the batched forward, and ``weight``
is the merged weight; the whole model with ``members_at_once=1`` equals the batched model; layers with a
choice of evaluation path (SV layers: factored, cached or merged weights) give the same predictions on each.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

from sve.layers import MemberLayer
from sve.runs.run import instantiate
from tests.conftest import compose_cfg, config_options, method_on

FAMILIES = {
    "tiny_vit": ["dataset=synthetic_image"],
    "tiny_bert": ["dataset=synthetic_text"],
    "tiny_llama": ["dataset=synthetic_text"],
    "resnet20_cifar": ["dataset=synthetic_image", "backbone.pretrained=false", "backbone.depth=8"],  # Conv2d
}
M = 3


def method_class(method: str):
    module, _, name = compose_cfg([f"method={method}"]).method._target_.rpartition(".")
    return getattr(importlib.import_module(module), name)


def runs_on(method: str, family: str) -> bool:
    """The CIFAR ResNet's targets are convolutions (and it has no dropout site)."""
    if family != "resnet20_cifar":
        return True
    cls = method_class(method)
    return method != "mc_dropout" and (
        not cls.make_layer.__qualname__.startswith("EnsembleMethod")
        and nn.Conv2d in cls.layer_types
        or cls.train_backbone
    )


# A method's variants that change its layers' algebra (not just a number) also get rows, on a linear and a
# convolutional family: the default variant runs on every family above.
VARIANTS = {"sve_lora": [["method.lora_space=basis"]], "sve_lora_shared": [["method.lora_space=basis"]]}
VARIANT_FAMILIES = ("tiny_vit", "resnet20_cifar")


# Options that only change a number of another option (a rank) run that option's algebra: not again here.
SAME_ALGEBRA = {"sve_top32": "sve_top"}
# Options that are a variant of another (sve_lora_shared of sve_lora): on the variant families only, like
# VARIANTS (the test-time budget).
VARIANT_OPTIONS = {"sve_lora_shared"}


def rows():
    for method in config_options("method"):
        if method in SAME_ALGEBRA:
            continue
        for family in VARIANT_FAMILIES if method in VARIANT_OPTIONS else FAMILIES:
            if runs_on(method, family):
                yield pytest.param(method, family, [], id=f"{method}-{family}")
        for variant in VARIANTS.get(method, []):
            for family in VARIANT_FAMILIES:
                name = "+".join(o.split(".")[-1] for o in variant)
                yield pytest.param(method, family, variant, id=f"{method}[{name}]-{family}")


def build(method: str, family: str, *extra: str, seed: int = 0):
    """(method, a training batch, datamodule, the unwrapped backbone built from the same seed)."""
    cfg = compose_cfg(
        [
            f"method={method}",
            f"backbone={family}",
            *FAMILIES[family],
            f"ensemble_size={M}",
            "dataset.batch_size=4",
            *extra,
        ]
    )
    torch.manual_seed(seed)
    reference = instantiate(cfg.backbone).eval()
    torch.manual_seed(seed)
    backbone = instantiate(cfg.backbone)
    m, datamodule = method_on(cfg, backbone, M)
    return m, next(iter(datamodule.train_dataloader())), datamodule, reference


def noise_off(method: str) -> list[str]:
    keys = compose_cfg([f"method={method}"]).method
    return [f"method.{k}=0.0" for k in ("sigma_init", "dropout") if k in keys]


@pytest.mark.parametrize("method, family, variant", rows())
def test_method_row(method, family, variant):
    """All of the module docstring's checks on one (method, backbone family) pair."""
    m, batch, datamodule, reference = build(method, family, *variant, *noise_off(method), *bayes_steps(method))
    check_equal_to_base_at_init(m, batch, reference, method)
    check_layout_and_training_step(m, batch, datamodule)
    perturb(m)
    check_layers_merge_select_weight(m, batch)
    check_one_at_a_time_equals_batched(m, batch, method)
    check_inference_paths_agree(m, batch, method)


def bayes_steps(method: str) -> list[str]:
    return ["method.marglik_steps=3"] if "marglik_steps" in compose_cfg([f"method={method}"]).method else []


def check_equal_to_base_at_init(m, batch, reference, method) -> None:
    if not m.equals_base_at_init:
        return
    m.eval()
    with torch.no_grad():
        base = reference(batch)
        features = m.member_features(batch, list(range(m.num_members())))  # (K, B, D)
    for k, f in enumerate(features):
        torch.testing.assert_close(f, base, atol=2e-4, rtol=2e-4, msg=lambda e, k=k: f"{method} member {k}: {e}")


def check_layout_and_training_step(m, batch, datamodule) -> None:
    B, C = batch["labels"].shape[0], m.num_classes
    m.train()
    logits = m(batch)
    assert logits.shape == (m.num_members(), B, C)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert trainable, "nothing trains"
    m.loss(logits, batch["labels"]).backward()
    missing = sorted(n for n, p in m.named_parameters() if p.requires_grad and p.grad is None)
    assert not missing, f"trainable parameters without a gradient (DDP would stop): {missing[:6]}"
    torch.optim.SGD(m.trainable_parameters(), lr=0.1).step()
    m.constrain_()
    changed = {n for n, p in m.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable, f"frozen parameters changed: {sorted(changed - trainable)[:5]}"
    finish_training(m, datamodule)
    m.eval()
    with torch.no_grad():
        out = m(batch)
    assert out.shape == (m.num_members(), B, C) and torch.isfinite(out).all()


def finish_training(m, datamodule) -> None:
    """The after-training hooks a run calls, so evaluation uses snapshots / posterior samples."""
    for _ in range(2):
        m.on_train_epoch_end(None)
    while m.next_round():
        pass
    m.after_fit(datamodule)


def perturb(m) -> None:
    """Moves every trainable parameter so that members differ (B of LoRA is zero at init, for one)."""
    with torch.no_grad():
        for p in m.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p) * (p.abs().mean() + 0.1))
    m.constrain_()


def check_layers_merge_select_weight(m, batch) -> None:
    """Inside a real forward (so banks of samples or snapshots are installed), for every member layer and
    member k of what it ran: ``select(k)`` on block k == block k of the batched output == ``merge(k)``."""
    checked = []

    def check(layer, inputs, output) -> None:  # returns None: the output is left as it is
        if layer in checked:
            return
        checked.append(layer)
        members = layer.active_members()
        K, x = len(members), inputs[0]
        xs, ys = x.reshape(K, -1, *x.shape[1:]), output.reshape(K, -1, *output.shape[1:])
        for k, member in enumerate(members):
            with layer.select([member]):
                selected = layer.forward(xs[k])  # .forward: no hooks again
                weight = layer.weight
            merged = layer.merge(member)
            assert_near(selected, ys[k], f"{layer.module_name}: select({member}) vs the batched block")
            assert_near(merged(xs[k]), selected, f"{layer.module_name}: merge({member}) vs select({member})")
            expected = merged.weight.t() if layer.kind == "conv1d" else merged.weight
            torch.testing.assert_close(weight, expected)

    layers = [x for x in m.modules() if isinstance(x, MemberLayer)]
    hooks = [x.register_forward_hook(check) for x in layers]
    m.eval()
    # Bayes-LoRA's GLM predictive runs one MAP pass under torch.func transforms, where these checks cannot
    # run (they build layers and read .data); its sampled-network predictive runs the posterior samples as
    # the layers' members, which is what is checked here. The GLM has its own test (test_methods_facts).
    predictive = getattr(m, "predictive", None)
    if predictive is not None:
        m.predictive = "nn"
    try:
        with torch.no_grad():
            m(batch)
    finally:
        for h in hooks:
            h.remove()
        if predictive is not None:
            m.predictive = predictive
    assert len(checked) == len(layers), "a member layer did not run"


def assert_near(a, b, what: str, tol: float = 1e-5) -> None:
    """Equal up to float32 rounding relative to the tensor's scale (posterior samples can be large)."""
    err = float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12))
    assert err < tol, f"{what}: relative error {err:.2e}"


def check_one_at_a_time_equals_batched(m, batch, method) -> None:
    if m.stochastic:  # dropout masks follow the RNG order; the passes are tested with dropout off instead
        return
    m.eval()
    with torch.no_grad():
        torch.manual_seed(1)
        batched = m(batch)
        m.members_at_once = 1
        torch.manual_seed(1)
        one_by_one = m(batch)
    torch.testing.assert_close(one_by_one, batched, atol=1e-4, rtol=1e-4, msg=lambda e: f"{method}: {e}")


def check_inference_paths_agree(m, batch, method) -> None:
    layers = [x for x in m.modules() if isinstance(x, MemberLayer) and hasattr(x, "inference")]
    if not layers:
        return
    m.eval()
    outputs = {}
    with torch.no_grad():
        for mode in ("factored", "cached", "merged", "auto"):
            for layer in layers:
                layer.inference = mode
            outputs[mode] = m(batch)
    for mode, out in outputs.items():
        torch.testing.assert_close(
            out, outputs["factored"], atol=1e-5, rtol=1e-5, msg=lambda e, mode=mode: f"{method} {mode}: {e}"
        )


def test_options_left_out_as_the_same_algebra_differ_only_by_numbers():
    """SAME_ALGEBRA may skip an option only when its config is another's with some numbers changed."""
    for option, same in SAME_ALGEBRA.items():
        a, b = compose_cfg([f"method={option}"]).method, compose_cfg([f"method={same}"]).method
        differ = {k for k in set(a) | set(b) if k != "name" and a.get(k) != b.get(k)}
        assert differ and all(
            isinstance(a.get(k), (int, float)) and isinstance(b.get(k), (int, float)) for k in differ
        ), (option, differ)
