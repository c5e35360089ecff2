"""SVConv: exact algebra of the kernel-as-matrix decomposition, and SVE on a CNN (beyond the paper); the same
for 1-D and 3-D convolutions and every layer that adapts one."""

import copy

import pytest
import torch
from torch import nn

from sve.backbones.resnet_cifar import ResNetCIFARBackbone
from sve.layers import SVConv, SVConv2d, SVLinear
from sve.members import repeat_members
from sve.methods.sve import SVE, SVF


@pytest.mark.parametrize(
    "conv",
    [
        dict(in_channels=3, out_channels=8, kernel_size=3, padding=1),
        dict(in_channels=8, out_channels=4, kernel_size=3, stride=2, padding=1, bias=False),  # rank 4 < 72
        dict(in_channels=2, out_channels=6, kernel_size=(1, 3), dilation=2),
    ],
)
def test_equals_original_conv_at_init(conv):
    torch.manual_seed(0)
    layer = nn.Conv2d(**conv)
    sv = SVConv2d.from_conv(layer, ensemble_size=3, sigma_init=0.0)
    x = torch.randn(2, conv["in_channels"], 9, 9)
    expected = layer(x)
    out = sv(repeat_members(x, 3)).reshape(3, *expected.shape)
    for m in range(3):
        torch.testing.assert_close(out[m], expected, atol=1e-5, rtol=1e-5)


def test_members_differ_and_merge_reproduces_each_member():
    torch.manual_seed(0)
    layer = nn.Conv2d(4, 6, 3, padding=1)
    sv = SVConv2d.from_conv(layer, ensemble_size=2, sigma_init=0.1)
    with torch.no_grad():
        sv.biases[1] += 0.5  # member biases differ too
    x = torch.randn(3, 4, 5, 5)
    out = sv(repeat_members(x, 2)).reshape(2, 3, 6, 5, 5)
    assert not torch.allclose(out[0], out[1])
    for m in range(2):
        torch.testing.assert_close(sv.merge(m)(x), out[m], atol=1e-5, rtol=1e-5)


def test_matrix_is_the_unfolded_kernel():
    """W = U diag(s) V^T with W the (out, in*kh*kw) reshaped kernel; rank = min(out, in*kh*kw)."""
    layer = nn.Conv2d(5, 7, 3)
    sv = SVConv2d.from_conv(layer, ensemble_size=1)
    assert sv.rank == 7 and sv.Vh.shape == (7, 45)
    torch.testing.assert_close(sv.member_weight(0).reshape_as(layer.weight), layer.weight.detach(), atol=1e-6, rtol=0)


def test_rejects_grouped_convolutions():
    with pytest.raises(ValueError, match=r"cannot take this layer: groups=2 \(need 1\)"):
        SVConv2d.from_conv(nn.Conv2d(4, 4, 3, groups=2), ensemble_size=2)


def _resnet():
    return ResNetCIFARBackbone(depth=8, target_modules=["conv1", "conv2"], pretrained=False)


def test_sve_wraps_every_conv_and_keeps_the_output_at_init():
    torch.manual_seed(0)
    backbone = _resnet().eval()
    x = {"pixel_values": torch.randn(2, 3, 32, 32)}
    with torch.no_grad():
        expected = backbone(x)
    method = SVE(backbone, ensemble_size=3, num_classes=10, sigma_init=0.0).eval()
    convs = [m for m in backbone.model.modules() if isinstance(m, SVConv2d)]
    assert len(convs) == 1 + 2 * 3  # stem + two per block, depth 8 = 3 blocks
    assert not any(isinstance(m, nn.Conv2d) for m in backbone.model.modules())
    with torch.no_grad():
        feats = method.backbone({"pixel_values": repeat_members(x["pixel_values"], 3)})
    torch.testing.assert_close(feats.reshape(3, 2, -1)[1], expected, atol=1e-4, rtol=1e-4)
    assert all(isinstance(m, SVLinear) for m in method.sv_layers())  # constrain_ reaches the conv layers too


def test_sve_on_a_cnn_trains_only_singular_values_biases_and_heads():
    torch.manual_seed(0)
    method = SVE(_resnet(), ensemble_size=2, num_classes=10).train()
    before = {k: v.clone() for k, v in method.state_dict().items()}
    opt = torch.optim.SGD(method.trainable_parameters(), lr=0.1)
    batch = {"pixel_values": torch.randn(4, 3, 32, 32), "labels": torch.tensor([0, 1, 2, 3])}
    method.loss(method(batch), batch["labels"]).backward()
    opt.step()
    changed = {k for k, v in method.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and all(k.endswith(("singular_values", "heads.weight", "heads.bias")) for k in changed), changed
    # BatchNorm stays in eval mode: the running statistics of the frozen backbone never move.
    assert not any("running" in k for k in changed)


def test_svf_applies_to_convs():
    method = SVF(_resnet(), ensemble_size=1, num_classes=10)
    assert all(layer.ensemble_size == 1 for layer in method.sv_layers())


# --- convolutions of 1 and 3 spatial dimensions: the same reading of the kernel ---------------------------------

CONVS = {1: nn.Conv1d, 3: nn.Conv3d}
SIZES = {1: (11,), 3: (5, 6, 4)}


def member_layer(kind: str, conv: nn.Module, members: int):
    from sve.layers import BatchEnsembleLayer, LoRALayer
    from sve.layers.sv_lora import SVLoRAConv
    from sve.layers.sv_top import SVTopConv

    if kind == "sve":
        return SVConv.from_conv(conv, ensemble_size=members, sigma_init=0.2)
    if kind == "sve_top":
        return SVTopConv.from_conv_top(conv, rank=3, ensemble_size=members, sigma_init=0.2)
    if kind.startswith("sve_lora"):
        layer = SVLoRAConv.from_conv(conv, ensemble_size=members, sigma_init=0.2)
        layer.add_lora(rank=2, alpha=2.0, space=kind.rpartition("_")[2])
        with torch.no_grad():
            layer.lora_B.normal_()  # a non-zero update, so that it is tested
        return layer
    if kind == "lora":
        layer = LoRALayer(conv, ensemble_size=members, rank=2)
        with torch.no_grad():
            layer.lora_B.normal_()
        return layer
    return BatchEnsembleLayer(conv, ensemble_size=members, init_std=0.3)


@pytest.mark.parametrize("dims", [1, 3])
@pytest.mark.parametrize("kind", ["sve", "sve_top", "sve_lora_weight", "sve_lora_basis", "lora", "batch_ensemble"])
def test_1d_and_3d_convolutions_are_member_layers_whose_members_are_their_merged_convolutions(dims, kind):
    torch.manual_seed(0)
    conv = CONVS[dims](4, 6, 3, stride=2, padding=1, dilation=1 if dims == 3 else 2)
    x = torch.randn(2, 4, *SIZES[dims])
    with torch.no_grad():
        expected = conv(x)
    layer = member_layer(kind, copy.deepcopy(conv), members=3)
    assert layer.kind == "conv" and layer.conv_dims == dims
    with torch.no_grad():
        train = layer.train()(repeat_members(x, 3)).reshape(3, *expected.shape)  # the factored path
        merged = layer.eval()(repeat_members(x, 3)).reshape(3, *expected.shape)  # merged kernels (SV layers)
        for m in range(3):
            plain = layer.merge(m)
            assert type(plain) is CONVS[dims]
            torch.testing.assert_close(train[m], plain(x), atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(merged[m], plain(x), atol=1e-5, rtol=1e-4)
    assert not torch.allclose(train[0], train[1])  # the members differ


@pytest.mark.parametrize("dims", [1, 3])
def test_sve_on_a_1d_or_3d_cnn_keeps_its_output_at_init(dims):
    import sve

    torch.manual_seed(0)
    model = nn.Sequential(
        CONVS[dims](2, 8, 3, padding=1),
        nn.ReLU(),
        CONVS[dims](8, 8, 3, stride=2),
        nn.ReLU(),
        nn.Flatten(2),
        nn.AdaptiveAvgPool1d(1),
        nn.Flatten(),
        nn.Linear(8, 3),
    ).eval()
    x = torch.randn(4, 2, *SIZES[dims])
    with torch.no_grad():
        expected = model(x)
    ensemble = sve.wrap(model, "sve", ensemble_size=2, sigma_init=0.0, example_input=x).eval()
    assert ensemble.method.wrapped == ["0", "2"]  # both convolutions, by default
    with torch.no_grad():
        torch.testing.assert_close(ensemble(x), expected.expand(2, -1, -1), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["sve", "sve_top", "sve_lora_weight", "lora", "batch_ensemble"])
def test_padding_same_and_valid_are_read_as_the_numbers_pytorch_pads_with(kind):
    from sve.layers.inject import adaptable

    torch.manual_seed(0)
    for conv, x in (
        (nn.Conv1d(3, 5, 5, padding="same", dilation=2), torch.randn(2, 3, 13)),
        (nn.Conv2d(3, 5, 3, padding="valid"), torch.randn(2, 3, 7, 7)),
        # Even kernels: PyTorch pads one side more than the other (1 left, 2 right; per axis in 2-D).
        (nn.Conv1d(3, 5, 4, padding="same"), torch.randn(2, 3, 9)),
        (nn.Conv2d(3, 5, (2, 4), padding="same", dilation=(1, 2)), torch.randn(2, 3, 6, 7)),
    ):
        assert adaptable(conv)
        with torch.no_grad():
            expected = conv(x)
        layer = member_layer(kind, copy.deepcopy(conv), members=2)
        with torch.no_grad():
            out = layer.train()(repeat_members(x, 2)).reshape(2, *expected.shape)
            for m in range(2):
                torch.testing.assert_close(out[m], layer.merge(m)(x), atol=1e-5, rtol=1e-4)
            if kind == "sve":  # every inference path computes the same members, and unperturbed ones are the layer
                for inference in ("factored", "merged", "cached"):
                    layer.inference = inference
                    evaluated = layer.eval()(repeat_members(x, 2)).reshape(2, *expected.shape)
                    torch.testing.assert_close(evaluated, out, atol=1e-5, rtol=1e-4)
                plain = SVConv.from_conv(copy.deepcopy(conv), ensemble_size=2, sigma_init=0.0)
                same = plain(repeat_members(x, 2)).reshape(2, *expected.shape)
                torch.testing.assert_close(same, expected.expand_as(same), atol=1e-5, rtol=1e-4)
