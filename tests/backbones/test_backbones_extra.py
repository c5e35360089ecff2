"""The added backbones: CIFAR ResNets, random ViT-S, LLaMA-2-7B settings (bf16 + checkpointing, on a tiny
config), SmolLM2 from its converted cache, and the bf16 cost of SVE's factors."""

import pytest
import torch

from sve.backbones.resnet_cifar import ResNetCIFAR, ResNetCIFARBackbone
from sve.errors import InputError
from sve.layers import SVLinear
from sve.layers.recompute import is_checkpointing
from sve.methods.sve import SVE
from sve.runs.run import instantiate
from tests.conftest import compose_cfg, installed, shared_path

TINY_LLAMA = "{model_type: llama, vocab_size: 193, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 1, intermediate_size: 64, max_position_embeddings: 256, pad_token_id: 0}"  # noqa: E501


@pytest.mark.parametrize("depth, params", [(20, 269_722), (56, 853_018)])
def test_resnet_sizes_match_the_release(depth, params):
    assert sum(p.numel() for p in ResNetCIFAR(depth).parameters()) == params  # 0.27M and 0.85M


def test_resnet_option_a_shortcut_and_features():
    backbone = ResNetCIFARBackbone(20, ["conv1", "conv2"], pretrained=False).eval()
    block = backbone.model.layer2[0]
    x = torch.randn(2, 16, 8, 8)
    short = block.shortcut(x)
    assert short.shape == (2, 32, 4, 4)
    assert torch.equal(short[:, 8:24], x[:, :, ::2, ::2]) and not short[:, :8].any() and not short[:, 24:].any()
    assert backbone({"pixel_values": torch.randn(3, 3, 32, 32)}).shape == (3, 64)
    assert backbone.initial_head("cifar10", 10) is None  # random weights: nothing pretrained to reuse


def test_pretrained_resnet_head_is_reused_only_for_its_own_task():
    """The CIFAR-10 classifier starts the heads on CIFAR-10 only: Fashion-MNIST also has 10 classes, but its
    members must not start from airplane/car/... weights (and not all from the same head)."""
    path = shared_path("models", "resnet_cifar10")
    backbone = ResNetCIFARBackbone(20, ["conv1", "conv2"], checkpoint_path=str(next(path.glob("resnet20-*.th"))))
    assert backbone.initial_head("fashion_mnist", 10) is None and backbone.initial_head("cifar100", 100) is None
    torch.testing.assert_close(backbone.initial_head("cifar10", 10)[0], backbone.model.linear.weight)
    fresh = SVE(backbone, ensemble_size=3, num_classes=10, task="fashion_mnist")
    assert fresh.head_init == "random" and not torch.allclose(fresh.heads.weight[0], fresh.heads.weight[1])
    reused = SVE(
        ResNetCIFARBackbone(20, ["conv1", "conv2"], checkpoint_path=str(next(path.glob("resnet20-*.th")))),
        ensemble_size=3,
        num_classes=10,
        task="cifar10",
    )
    assert reused.head_init.startswith("pretrained")
    torch.testing.assert_close(reused.heads.weight[1], backbone.model.linear.weight)


def test_resnet_missing_checkpoint_names_key_and_layout():
    with pytest.raises(
        InputError,
        match=r"resnet20_cifar: backbone.checkpoint_path=/nonexistent/resnet20.th: no file "
        r"at /nonexistent/resnet20.th; set .*module.conv1.weight",
    ):
        ResNetCIFARBackbone(20, ["conv1"], checkpoint_path="/nonexistent/resnet20.th")


def test_resnet_configs_compose_with_conv_targets():
    for name, depth in (("resnet20_cifar", 20), ("resnet56_cifar", 56)):
        cfg = compose_cfg([f"backbone={name}", "backbone.pretrained=false"])
        backbone = instantiate(cfg.backbone)
        assert backbone.depth == depth and backbone.image_size == 32
        method = SVE(backbone, ensemble_size=2, num_classes=10)
        assert len(method.wrapped) == depth - 1  # every convolution; the linear head is never adapted


def test_vit_small_random_is_dino_architecture_untrained():
    cfg = compose_cfg(["backbone=vit_small_random"])
    assert cfg.backbone.pretrained is False and cfg.backbone.model_name == "vit_small_patch16_224.dino"
    backbone = instantiate(cfg.backbone)
    assert backbone.feature_dim == 384 and backbone.image_size == 224
    assert backbone.mean == pytest.approx((0.485, 0.456, 0.406))


def test_llama2_7b_settings_bf16_frozen_checkpointed_float32_singular_values():
    """The llama2_7b config on a tiny random LLaMA: bf16 weights, gradient checkpointing, SVE keeps the
    singular values float32 while U and V stay bf16; one training step runs and reaches them."""
    cfg = compose_cfg(
        [
            "backbone=llama2_7b",
            "backbone.pretrained=false",
            "backbone.tokenizer=char",
            "backbone.name_or_path=null",
            f"+backbone.config={TINY_LLAMA}",
        ]
    )
    assert cfg.backbone.torch_dtype == "bfloat16" and cfg.backbone.gradient_checkpointing
    backbone = instantiate(cfg.backbone)
    assert is_checkpointing(backbone.model) and backbone.model.dtype == torch.bfloat16
    backbone.answer_tokens = list("ABCDE")
    method = SVE(backbone, ensemble_size=2, num_classes=5).train()
    layer = next(m for m in method.modules() if isinstance(m, SVLinear))
    assert layer.U.dtype == torch.bfloat16 and layer.singular_values.dtype == torch.float32
    enc = backbone.tokenizer(["question one answer:", "two answer:"], padding=True, return_tensors="pt")
    batch = {**enc, "labels": torch.tensor([0, 3])}
    loss = method.loss(method(batch), batch["labels"])
    loss.backward()
    assert layer.singular_values.grad is not None and torch.isfinite(layer.singular_values.grad).all()


def test_bf16_factor_reconstruction_error_is_about_bf16_precision():
    """What scripts/sv_bf16_error.py reports at scale: bf16 U, V cost a relative error of a few 1e-3,
    the same order as storing W itself in bf16 (float32 factors: ~1e-7)."""
    from scripts.sv_bf16_error import errors

    torch.manual_seed(0)
    e = errors(torch.randn(512, 384) / 384**0.5)
    assert 1e-3 < e["weight_sv_bf16"] < 1e-2 and e["weight_plain_bf16"] < 5e-3
    assert e["output_sv_bf16"] < 1e-2


def test_smollm2_missing_cache_names_the_script():
    with pytest.raises(Exception, match="backbone.name_or_path.*convert_smollm2.py"):  # hydra wraps the error
        instantiate(compose_cfg(["backbone=smollm2_135m", "backbone.name_or_path=/nonexistent/smollm2"]).backbone)


@pytest.mark.slow
def test_smollm2_loads_from_the_converted_cache_without_gguf(monkeypatch):
    installed("smollm2_135m", "config.json")
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)  # importing gguf would now fail
    backbone = instantiate(compose_cfg(["backbone=smollm2_135m"]).backbone)
    assert backbone.feature_dim == 576 and len(backbone.model.model.layers) == 30
    assert 134e6 < sum(p.numel() for p in backbone.model.parameters()) < 135e6
