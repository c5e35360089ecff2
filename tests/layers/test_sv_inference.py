"""Merged-weight evaluation of the SV layers (sve.layers.sv_inference): the same numbers as the factored
path, a cache that follows every change of the singular values, and no merged copy while training."""

import gc
import weakref

import pytest
import torch
from torch import nn

from sve.errors import InputError
from sve.layers import SVConv2d, SVLinear
from sve.layers.sv_inference import merged_is_faster
from sve.runs.run import instantiate
from sve.runs.validate import check_config
from tests.conftest import compose_cfg

MODES = ("cached", "merged")


def _linear_layer(in_f=12, out_f=7, M=4, member_bias=True):
    torch.manual_seed(0)
    sv = SVLinear.from_linear(nn.Linear(in_f, out_f), ensemble_size=M, sigma_init=0.2, member_bias=member_bias)
    with torch.no_grad():
        if sv.biases is not None:
            sv.biases.add_(torch.randn_like(sv.biases))
    return sv.eval()


def _conv_layer(M=3, **conv):
    torch.manual_seed(0)
    sv = SVConv2d.from_conv(nn.Conv2d(**conv), ensemble_size=M, sigma_init=0.2)
    with torch.no_grad():
        if sv.biases is not None:
            sv.biases.add_(torch.randn_like(sv.biases))
    return sv.eval()


def _run(sv, x, mode, members=None):
    sv.inference = mode
    with torch.no_grad():
        if members is None:
            return sv(x)
        with sv.select(members):
            return sv(x)


@pytest.mark.parametrize("shape", [(12, 7), (7, 12), (9, 9)])
@pytest.mark.parametrize("members", [None, [1, 2], [3, 0], [2]])
@pytest.mark.parametrize("member_bias", [True, False])
def test_linear_merged_equals_factored(shape, members, member_bias):
    sv = _linear_layer(*shape, member_bias=member_bias)
    K = 4 if members is None else len(members)
    x = torch.randn(K * 3, 5, shape[0])  # (K*B, T, in), member-major
    expected = _run(sv, x, "factored", members)
    for mode in MODES:
        torch.testing.assert_close(_run(sv, x, mode, members), expected, atol=1e-5, rtol=1e-5)


def test_merged_weights_follow_autocast():
    sv = _linear_layer(16, 16)
    x = torch.randn(4 * 8, 16)
    expected = _run(sv, x, "factored")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _run(sv, x, "cached")
    assert sv._merged[1].dtype == torch.bfloat16 and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=5e-2, rtol=2e-2)


def test_one_member_accepts_any_input_shape():
    sv = _linear_layer()
    x = torch.randn(2, 3, 5, 12)
    for mode in MODES:
        torch.testing.assert_close(_run(sv, x, mode, [2]), _run(sv, x, "factored", [2]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "conv",
    [
        dict(in_channels=3, out_channels=8, kernel_size=3, padding=1),
        dict(in_channels=8, out_channels=4, kernel_size=3, stride=2, padding=1, bias=False),
        dict(in_channels=2, out_channels=6, kernel_size=(1, 3), dilation=2),
    ],
)
@pytest.mark.parametrize("members", [None, [0, 2], [1]])
def test_conv_merged_equals_factored(conv, members):
    sv = _conv_layer(**conv)
    K = 3 if members is None else len(members)
    x = torch.randn(K * 2, conv["in_channels"], 9, 9)
    expected = _run(sv, x, "factored", members)
    for mode in MODES:
        torch.testing.assert_close(_run(sv, x, mode, members), expected, atol=1e-5, rtol=1e-5)
    if members is not None and len(members) == 1:  # unbatched (C, H, W)
        torch.testing.assert_close(
            _run(sv, x[0], "cached", members), _run(sv, x[0], "factored", members), atol=1e-5, rtol=1e-5
        )


def test_cache_holds_all_members_and_is_reused():
    sv = _linear_layer()
    x = torch.randn(4 * 2, 12)
    _run(sv, x, "cached")
    assert sv.cache_bytes() == 4 * 7 * 12 * 4
    first = sv._merged[1]
    _run(sv, x, "cached", [1, 2])
    assert sv._merged[1] is first  # a chunk of members reads the same cache
    sv.inference = "merged"
    assert sv.cache_bytes() == 0  # merged per call keeps nothing
    _run(sv, x, "merged")
    assert sv.cache_bytes() == 0


def _fresh_factored(sv, x):
    with torch.no_grad():
        sv.inference = "factored"
        out = sv(x)
        sv.inference = "cached"
    return out


def test_cache_follows_an_in_place_edit_of_a_singular_value():
    sv = _linear_layer()
    x = torch.randn(4 * 2, 12)
    before = _run(sv, x, "cached")
    with torch.no_grad():
        sv.singular_values[1, 0] += 1.0
    after = _run(sv, x, "cached")
    assert not torch.allclose(before[2:4], after[2:4])  # member 1's rows changed
    torch.testing.assert_close(before[:2], after[:2])  # member 0's did not
    torch.testing.assert_close(after, _fresh_factored(sv, x), atol=1e-5, rtol=1e-5)


def test_cache_follows_load_state_dict_and_bias_changes():
    sv, other = _linear_layer(), _linear_layer()
    with torch.no_grad():
        other.singular_values.mul_(1.5)
    x = torch.randn(4 * 2, 12)
    before = _run(sv, x, "cached")
    sv.load_state_dict(other.state_dict())
    after = _run(sv, x, "cached")
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, _run(other, x, "factored"), atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        sv.biases[0] += 3.0
    torch.testing.assert_close(_run(sv, x, "cached"), _fresh_factored(sv, x), atol=1e-5, rtol=1e-5)


def test_cache_follows_an_optimizer_step():
    sv = _linear_layer()
    x = torch.randn(4 * 2, 12)
    before = _run(sv, x, "cached")
    opt = torch.optim.Adam([sv.singular_values], lr=0.1)
    sv(x).square().sum().backward()  # still in eval mode: under autograd the path is factored
    opt.step()
    after = _run(sv, x, "cached")
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, _fresh_factored(sv, x), atol=1e-5, rtol=1e-5)


def test_cache_follows_dtype_moves_banks_and_an_explicit_clear():
    sv = _linear_layer()
    x = torch.randn(4 * 2, 12)
    _run(sv, x, "cached")
    sv.double()
    assert sv.cache_bytes() == 0
    out = _run(sv, x.double(), "cached")
    assert out.dtype == torch.float64 and sv._merged[1].dtype == torch.float64
    sv.float()
    bank = sv.singular_values.detach() * 2
    with sv.use_bank(singular_values=bank):
        torch.testing.assert_close(_run(sv, x, "cached"), _fresh_factored(sv, x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(_run(sv, x, "cached"), _fresh_factored(sv, x), atol=1e-5, rtol=1e-5)
    # A write through .data is the one change PyTorch's version counter misses (documented): clear_cache().
    _run(sv, x, "cached")
    sv.singular_values.data.mul_(3)
    stale = _run(sv, x, "cached")
    sv.clear_cache()
    assert not torch.allclose(stale, _run(sv, x, "cached"))
    torch.testing.assert_close(_run(sv, x, "cached"), _fresh_factored(sv, x), atol=1e-4, rtol=1e-5)


def test_no_merged_weights_in_training_or_under_autograd():
    sv = _linear_layer()
    x = torch.randn(4 * 64, 12)
    sv.inference = "cached"
    sv.train()
    with torch.no_grad():
        assert sv.path(x, 4) == "factored"
        sv(x)
    assert sv.cache_bytes() == 0
    sv.eval()
    assert sv.path(x, 4) == "factored"  # grad mode on: an autograd graph would hold the merged weights
    sv(x).sum().backward()
    assert sv.cache_bytes() == 0 and sv.singular_values.grad is not None
    with torch.no_grad():
        sv(x)
    assert sv.cache_bytes() > 0
    sv.train()
    assert sv.cache_bytes() == 0  # entering training drops the cache


def test_auto_rule_follows_tokens_per_member_and_width():
    d = 256
    assert not merged_is_faster(15, d, d, d, cached=True) and merged_is_faster(16, d, d, d, cached=True)
    assert not merged_is_faster(39, d, 4 * d, d, cached=True) and merged_is_faster(40, d, 4 * d, d, cached=True)
    assert not merged_is_faster(1.25 * d, d, d, d, cached=False)  # merging per call pays beyond 1.25 d tokens
    assert merged_is_faster(1.25 * d + 1, d, d, d, cached=False)
    for cached in (True, False):  # low rank: factored is cheaper per token, whatever the tokens
        assert not merged_is_faster(10**6, 4 * d, d, 8, cached=cached)
    sv = _linear_layer(64, 64)
    with torch.no_grad():
        sv.inference = "auto"
        assert sv.path(torch.randn(4 * 2, 64), 4) == "factored"
        assert sv.path(torch.randn(4 * 32, 64), 4) == "cached"
        sv.auto_cache = False
        assert sv.path(torch.randn(4 * 32, 64), 4) == "factored"
        assert sv.path(torch.randn(4 * 128, 64), 4) == "merged"


def test_inference_values_are_validated_with_the_choices_named():
    sv = _linear_layer()
    with pytest.raises(ValueError, match=r"inference='fast' is not valid; expected one of \['auto', 'factored'"):
        sv.inference = "fast"
    with pytest.raises(InputError, match=r"method.inference='fast' is not valid; expected one of \['auto'"):
        check_config(compose_cfg(["method=sve", "method.inference=fast"]))
    with pytest.raises(InputError, match="method.factor_dtype='bf16'"):
        check_config(compose_cfg(["method=svf", "method.factor_dtype=bf16"]))


def _tiny_sve(*overrides, backbone="tiny_vit", dataset="synthetic_image"):
    cfg = compose_cfg(
        [
            "method=sve",
            f"backbone={backbone}",
            f"dataset={dataset}",
            "ensemble_size=3",
            "dataset.batch_size=4",
            *overrides,
        ]
    )
    torch.manual_seed(0)
    bb = instantiate(cfg.backbone)
    dm = instantiate(cfg.dataset)
    dm.attach(bb)
    dm.setup()
    method = instantiate(cfg.method, backbone=bb, ensemble_size=3, num_classes=dm.num_classes)
    with torch.no_grad():
        for layer in method.sv_layers():
            layer.singular_values.mul_(1 + 0.1 * torch.randn_like(layer.singular_values))
    return method, next(iter(dm.train_dataloader()))


@pytest.mark.parametrize(
    "backbone, dataset",
    [("tiny_vit", "synthetic_image"), ("tiny_bert", "synthetic_text"), ("resnet20_cifar", "synthetic_image")],
)
def test_whole_model_predictions_agree_across_modes_and_chunks(backbone, dataset):
    extra = ["backbone.pretrained=false", "backbone.depth=8"] if backbone == "resnet20_cifar" else []
    method, batch = _tiny_sve(*extra, backbone=backbone, dataset=dataset)
    method.eval()
    outputs = {}
    for chunk in ("all", 2, 1):
        method.members_at_once = None if chunk == "all" else chunk
        for mode in ("factored", "cached", "merged", "auto") if chunk == "all" else ("cached", "merged"):
            for layer in method.sv_layers():
                layer.inference = mode
            with torch.no_grad():
                outputs[chunk, mode] = method(batch)
    reference = outputs["all", "factored"]
    for key, out in outputs.items():
        torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-5, msg=lambda e, key=key: f"{key}: {e}")


def test_auto_caches_all_members_only_when_they_fit_in_memory(monkeypatch):
    method, batch = _tiny_sve()
    method.eval()
    assert method.merged_cache is True and all(layer.auto_cache for layer in method.sv_layers())
    with torch.no_grad():
        method(batch)
    method.train()
    assert sum(layer.cache_bytes() for layer in method.sv_layers()) == 0
    need = method.merged_bytes()
    assert need == sum(3 * layer.out_features * layer.in_features * 4 for layer in method.sv_layers())
    monkeypatch.setattr("sve.methods.sve.free_memory", lambda device: 2 * need - 1)  # M copies would not fit
    method.members_at_once = 1
    method.eval()
    assert method.merged_cache is False and not any(layer.auto_cache for layer in method.sv_layers())
    with torch.no_grad():
        method(batch)
    assert sum(layer.cache_bytes() for layer in method.sv_layers()) == 0  # chunks never hold M copies
    report = method.report()
    assert report["inference"] == "auto" and report["merged_cache"] is False and report["merged_cache_bytes"] == need


def test_members_at_once_auto_runs_few_examples_per_pass_in_cpu_evaluation():
    method, batch = _tiny_sve()  # batch of 4
    assert method.members_at_once == "auto"
    method.train()
    assert method.members_per_pass(batch, 3) == 3  # training: all members at once
    method.eval()
    assert method.members_per_pass(batch, 3) == 2  # 8 examples per pass: 2 members of 4
    one = {k: v[:1] for k, v in batch.items() if isinstance(v, torch.Tensor)}
    assert method.members_per_pass(one, 3) == 3
    with pytest.raises(ValueError, match="choose 'all', 'auto' or a positive integer"):
        type(method)(method.backbone, 2, 2, members_at_once="some")


def test_no_pretrained_weight_is_kept_beside_its_factors():
    """After injection the wrapped nn.Linear objects are gone (nothing refers to them) and every SV layer
    holds exactly U, Vh, the singular values and the biases."""
    cfg = compose_cfg(["method=sve", "backbone=tiny_bert", "dataset=synthetic_text"])
    bb = instantiate(cfg.backbone)
    originals = [weakref.ref(m) for m in bb.model.modules() if isinstance(m, nn.Linear)]
    method = instantiate(cfg.method, backbone=bb, ensemble_size=2, num_classes=2)
    gc.collect()
    alive = [r() for r in originals if r() is not None]
    wrapped = set(method.wrapped)
    assert len(alive) == len(originals) - len(wrapped)  # only unwrapped layers (e.g. the pooler) remain
    for layer in method.sv_layers():
        names = {n for n, _ in layer.named_parameters()} | {n for n, _ in layer.named_buffers()}
        assert names == {"U", "Vh", "singular_values", "biases", "pretrained_singular_values"}
