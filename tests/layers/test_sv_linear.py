"""Exact algebra of the singular-value layer (Eq. 3-5)."""

import pytest
import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from sve.layers import SVLinear
from sve.members import repeat_members


def _linear(in_f=12, out_f=7, bias=True):
    torch.manual_seed(1)
    return nn.Linear(in_f, out_f, bias=bias)


@pytest.mark.parametrize("shape", [(12, 7), (7, 12), (9, 9)])
def test_equals_original_at_init_without_noise(shape):
    layer = _linear(*shape)
    sv = SVLinear.from_linear(layer, ensemble_size=3, sigma_init=0.0)
    x = torch.randn(5, 4, shape[0])
    expected = layer(x)
    out = sv(repeat_members(x, 3)).reshape(3, 5, 4, shape[1])
    for m in range(3):
        torch.testing.assert_close(out[m], expected, atol=1e-5, rtol=1e-5)


def test_svd_precision_float64_then_float32():
    """The stated precision: SVD in float64, factors cast to float32, relative error < 1e-6."""
    layer = nn.Linear(256, 384)
    sv = SVLinear.from_linear(layer, ensemble_size=1)
    assert sv.U.dtype == torch.float32 and sv.Vh.dtype == torch.float32
    err = (sv.member_weight(0) - layer.weight).norm() / layer.weight.norm()
    assert err < 1e-6, err


def test_bfloat16_factors_cost_about_1e_2():
    layer = nn.Linear(256, 384)
    sv = SVLinear.from_linear(layer, ensemble_size=1, factor_dtype=torch.bfloat16)
    assert sv.singular_values.dtype == torch.float32  # trainable values stay float32
    err = (sv.member_weight(0) - layer.weight).norm() / layer.weight.norm()
    assert 1e-4 < err < 3e-2, err


def test_member_forward_is_u_diag_s_vt_plus_bias():
    layer = _linear()
    sv = SVLinear.from_linear(layer, ensemble_size=4, sigma_init=0.0)
    with torch.no_grad():
        sv.singular_values.copy_(torch.rand(4, sv.rank) * 3)
        sv.biases.copy_(torch.randn(4, 7))
    x = torch.randn(6, 12)
    out = sv(repeat_members(x, 4)).reshape(4, 6, 7)
    U, Vh = sv.U.double(), sv.Vh.double()
    for m in range(4):
        W = U @ torch.diag(sv.singular_values[m].double()) @ Vh
        ref = x.double() @ W.T + sv.biases[m].double()
        torch.testing.assert_close(out[m].double(), ref, atol=1e-5, rtol=1e-5)


def test_init_noise_is_multiplicative_with_given_std():
    layer = nn.Linear(512, 512)
    torch.manual_seed(0)
    sv = SVLinear.from_linear(layer, ensemble_size=8, sigma_init=0.01)
    ratio = sv.singular_values / sv.pretrained_singular_values - 1  # = eps
    assert abs(ratio.std().item() - 0.01) < 0.001
    assert abs(ratio.mean().item()) < 0.001
    assert not torch.allclose(sv.singular_values[0], sv.singular_values[1])


def test_merge_equals_member_forward():
    layer = _linear()
    sv = SVLinear.from_linear(layer, ensemble_size=3, sigma_init=0.1)
    x = torch.randn(5, 12)
    out = sv(repeat_members(x, 3)).reshape(3, 5, 7)
    for m in range(3):
        merged = sv.merge(m)
        assert type(merged) is nn.Linear
        torch.testing.assert_close(merged(x), out[m], atol=1e-5, rtol=1e-5)
    with pytest.raises(IndexError):
        sv.merge(3)


def test_shared_frozen_bias_switch():
    layer = _linear()
    sv = SVLinear.from_linear(layer, ensemble_size=2, member_bias=False)
    assert sv.shared_bias.shape == (7,) and not sv.shared_bias.requires_grad and sv.biases is None
    trainable = {n for n, p in sv.named_parameters() if p.requires_grad}
    assert trainable == {"singular_values"}


def test_no_bias_layer():
    sv = SVLinear.from_linear(_linear(bias=False), ensemble_size=2, sigma_init=0.0)
    assert sv.biases is None and sv.shared_bias is None
    with sv.select(0):
        assert sv.bias is None  # what an owner reading .bias sees
    x = torch.randn(3, 12)
    torch.testing.assert_close(sv(repeat_members(x, 2))[:3], _linear(bias=False)(x), atol=1e-5, rtol=1e-5)


def test_hf_conv1d_weight_is_transposed():
    conv = Conv1D(7, 12)  # (nf=out, nx=in); weight (in, out)
    nn.init.normal_(conv.weight)
    sv = SVLinear.from_linear(conv, ensemble_size=2, sigma_init=0.0)
    x = torch.randn(4, 12)
    torch.testing.assert_close(sv(repeat_members(x, 2))[:4], conv(x), atol=1e-5, rtol=1e-5)


def test_frozen_factors_are_parameters_without_grad():
    sv = SVLinear.from_linear(_linear(), ensemble_size=2)
    params = dict(sv.named_parameters())
    assert not params["U"].requires_grad and not params["Vh"].requires_grad
    assert params["singular_values"].requires_grad and params["biases"].requires_grad
    assert "U" in sv.state_dict() and "Vh" in sv.state_dict()
    assert not any(name in {"U", "Vh"} for name, _ in sv.named_buffers())  # never re-broadcast by DDP


def test_constrain_clamps_negative_values():
    sv = SVLinear.from_linear(_linear(), ensemble_size=2)
    with torch.no_grad():
        sv.singular_values[0, 0] = -3.0
    sv.constrain_()
    assert sv.singular_values.min() >= 0


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.AdamW])
def test_any_optimiser_step_keeps_the_singular_values_non_negative(optimizer):
    # A plain PyTorch loop: no constrain_() after the step, the projection comes with the step itself.
    sv = SVLinear.from_linear(_linear(), ensemble_size=2)
    other = nn.Parameter(torch.full((3,), 5.0))  # not an SV layer's: left as the step makes it
    opt = optimizer([sv.singular_values, other], lr=100.0)
    (sv.singular_values.sum() + other.sum()).backward()  # every value pushed far below zero
    opt.step()
    assert sv.singular_values.min() == 0 and (sv.singular_values == 0).all()
    assert (other < 0).all()
    # An optimiser over other parameters only does not touch the layer.
    with torch.no_grad():
        sv.singular_values[0, 0] = -1.0
    unrelated = torch.optim.SGD([other], lr=0.1)
    other.grad = torch.ones(3)
    unrelated.step()
    assert sv.singular_values[0, 0] == -1.0


def test_rejects_batch_not_multiple_of_ensemble_size():
    sv = SVLinear.from_linear(_linear(), ensemble_size=3)
    with pytest.raises(ValueError, match="member-major"):
        sv(torch.randn(4, 12))


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="ensemble_size"):
        SVLinear.from_linear(_linear(), ensemble_size=0)
    with pytest.raises(ValueError, match="sigma_init"):
        SVLinear.from_linear(_linear(), ensemble_size=2, sigma_init=-1)
    with pytest.raises(TypeError, match="nn.Linear"):
        SVLinear.from_linear(nn.Embedding(3, 4), ensemble_size=2)
    with pytest.raises(TypeError, match="use SVConv.from_conv for an nn.Conv1d"):
        SVLinear.from_linear(nn.Conv1d(3, 4, 3), ensemble_size=2)


def test_the_report_says_how_far_the_singular_values_moved():
    """SVE's report (results.json method_report) carries ``movement``: exact algebra on set values, and at init
    a member spread of about sigma_init (the diagnostic of a run whose members differ by their init noise only)."""
    import sve
    from sve.layers.singular_values import movement

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    still = sve.wrap(mlp, "sve", ensemble_size=4, sigma_init=0.0, example_input=torch.randn(1, 64))
    assert still.method.report()["singular_values"] == {"member_spread": 0.0, "mean_shift": 0.0}
    noisy = sve.wrap(
        nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 3)),
        "sve",
        ensemble_size=64,
        sigma_init=0.05,
        example_input=torch.randn(1, 256),
    )
    found = movement(noisy.method)
    assert found["member_spread"] == pytest.approx(0.05, rel=0.05) and found["mean_shift"] < 0.05 / 4
    layers = [m for m in still.method.modules() if isinstance(m, SVLinear)]
    with torch.no_grad():
        for layer in layers:  # every member scaled by 1.1; then one member by 1.3 instead
            layer.singular_values.copy_(1.1 * layer.pretrained_singular_values.expand_as(layer.singular_values))
    assert movement(still.method)["mean_shift"] == pytest.approx(0.1, abs=1e-6)
    assert movement(still.method)["member_spread"] == pytest.approx(0.0, abs=1e-7)
    with torch.no_grad():
        for layer in layers:
            layer.singular_values[0] = 1.3 * layer.pretrained_singular_values
    # members 1.3, 1.1, 1.1, 1.1: mean 1.15; RMS distance sqrt((0.15^2 + 3 * 0.05^2) / 4) = 0.0866 of 1.15
    assert movement(still.method) == pytest.approx({"member_spread": 0.0866025 / 1.15, "mean_shift": 0.15}, abs=1e-6)
    with pytest.raises(ValueError, match=r"Sequential is already wrapped \(its layer '0' is a member layer\)"):
        sve.wrap(mlp, "lora_ensemble", ensemble_size=2, example_input=torch.randn(1, 64))  # wrap works in place
    lora = sve.wrap(
        nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 3)),
        "lora_ensemble",
        ensemble_size=2,
        num_classes=3,
        example_input=torch.randn(1, 8),
    )
    assert movement(lora.method) is None  # no singular values to speak of
