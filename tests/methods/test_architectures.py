"""SVE on Hugging Face and timm architectures beyond the configs: encoders, decoders (Conv1D GPT-2, OPT with a
projection), encoder-decoders, vision transformers with fused qkv read as ``.weight`` by their owner, and a
time-major PyTorch transformer. For each, random tiny weights:

- at ``sigma_init=0`` every member computes the unwrapped model's features (function preservation);
- with noise, member k equals the model with every SV layer replaced by ``merge(k)``, whichever path ran
  (batched, or one member at a time after a layout fallback, which must name the module).
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch import nn

from sve.backbones.base import Backbone
from sve.backbones.hf import HFBackbone, HFCausalLMBackbone
from sve.backbones.timm_vit import TimmBackbone
from sve.layers import MemberLayer
from sve.methods import SVE

V = 160  # the character tokenizer has 141 tokens
SIZES = dict(num_hidden_layers=2, num_attention_heads=2)
HF = {
    "bert": (
        HFBackbone,
        dict(model_type="bert", vocab_size=V, hidden_size=32, intermediate_size=64, **SIZES),
        ["query", "key", "value", "dense"],
        "cls",
    ),
    "roberta": (
        HFBackbone,
        dict(
            model_type="roberta",
            vocab_size=V,
            hidden_size=32,
            intermediate_size=64,
            max_position_embeddings=300,
            pad_token_id=0,
            **SIZES,
        ),
        ["query", "value", "dense"],
        "cls",
    ),
    "distilbert": (
        HFBackbone,
        dict(model_type="distilbert", vocab_size=V, dim=32, n_layers=2, n_heads=2, hidden_dim=64),
        ["q_lin", "k_lin", "v_lin", "out_lin", "lin1", "lin2"],
        "cls",
    ),
    "deberta_v2": (
        HFBackbone,
        dict(
            model_type="deberta-v2",
            vocab_size=V,
            hidden_size=32,
            intermediate_size=64,
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            max_relative_positions=16,
            position_buckets=8,
            **SIZES,
        ),
        ["query_proj", "key_proj", "value_proj", "dense"],
        "cls",
    ),
    "gpt2_conv1d": (
        HFCausalLMBackbone,
        dict(model_type="gpt2", vocab_size=V, n_embd=32, n_layer=2, n_head=2),
        ["c_attn", "c_proj", "c_fc"],
        "last",
    ),
    "llama": (
        HFCausalLMBackbone,
        dict(model_type="llama", vocab_size=V, hidden_size=32, intermediate_size=64, num_key_value_heads=1, **SIZES),
        [r"(q|k|v|o)_proj", r"(gate|up|down)_proj"],
        "last",
    ),
    "opt_projected": (
        HFCausalLMBackbone,
        dict(
            model_type="opt",
            vocab_size=V,
            hidden_size=32,
            ffn_dim=64,
            word_embed_proj_dim=16,
            max_position_embeddings=300,
            **SIZES,
        ),
        [r"(q|k|v|out)_proj", "fc1", "fc2"],
        "last",
    ),
    "t5": (
        HFBackbone,
        dict(
            model_type="t5",
            vocab_size=V,
            d_model=32,
            d_kv=16,
            num_layers=2,
            num_heads=2,
            d_ff=64,
            decoder_start_token_id=0,
        ),
        ["q", "k", "v", "o", "wi", "wo"],
        "last",
    ),
    "bart": (
        HFBackbone,
        dict(
            model_type="bart",
            vocab_size=V,
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=300,
        ),
        [r"(q|k|v|out)_proj", "fc1", "fc2"],
        "last",
    ),
    "hf_vit": (
        HFBackbone,
        dict(model_type="vit", hidden_size=32, intermediate_size=64, image_size=32, patch_size=8, **SIZES),
        [r"(q|k|v|o)_proj", "fc1", "fc2"],
        "cls",
    ),
    # CNNs: (N, C, H, W) maps, read through the pooled output their own classifiers take
    "hf_convnext": (
        HFBackbone,
        dict(model_type="convnext", hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], image_size=32),
        ["pwconv1", "pwconv2"],
        "cls",
    ),
    "hf_resnet": (
        HFBackbone,
        dict(
            model_type="resnet",
            hidden_sizes=[8, 16, 32, 64],
            depths=[1, 1, 1, 1],
            embedding_size=8,
            layer_type="basic",
            image_size=32,
        ),
        [r"convolution"],
        "cls",
    ),
}
TINY_VIT = dict(patch_size=8, embed_dim=32, depth=2, num_heads=2)
TIMM = {
    "vit_tiny_patch16_224": [r"attn\.(qkv|proj)", r"mlp\.fc(1|2)"],
    "deit_tiny_distilled_patch16_224": [r"attn\.(qkv|proj)", r"mlp\.fc(1|2)"],
    "beit_base_patch16_224": [r"attn\.(qkv|proj)", r"mlp\.fc(1|2)"],  # qkv.weight read by the owner
    "eva02_tiny_patch14_224": [r"attn\.(qkv|proj)", r"mlp\.fc(1|2)"],  # idem
}


class TimeMajorEncoder(Backbone):
    """nn.TransformerEncoder with batch_first=False: linears see (T, N, D), and MultiheadAttention reads
    ``out_proj.weight`` itself."""

    modality = "image"

    def __init__(self):
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=False)
        super().__init__(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), [r"out_proj", r"linear(1|2)"])
        self.feature_dim = 16

    def probe_batch(self) -> dict:
        return {"pixel_values": torch.zeros(1, 5, 16)}

    def forward(self, batch: dict) -> torch.Tensor:
        return self.model(batch["pixel_values"].transpose(0, 1)).mean(0)  # (N, T, D) -> (T, N, D) -> (N, D)


def hf_backbone(name):
    cls, config, targets, pooling = HF[name]
    return cls(targets, pretrained=False, config=config, tokenizer="char", pooling=pooling)


def timm_backbone(name):
    return TimmBackbone(name, TIMM[name], pretrained=False, image_size=32, model_kwargs=TINY_VIT)


CASES = (
    [pytest.param(hf_backbone, n, id=f"hf-{n}") for n in HF]
    + [pytest.param(timm_backbone, n, id=f"timm-{n}") for n in TIMM]
    + [pytest.param(lambda _: TimeMajorEncoder(), "time_major", id="torch-time_major")]
)


def batch_for(backbone) -> dict:
    if isinstance(backbone, TimeMajorEncoder):
        return {"pixel_values": torch.randn(2, 5, 16)}
    if backbone.modality == "image":
        return {"pixel_values": torch.randn(2, 3, backbone.image_size, backbone.image_size)}
    enc = backbone.tokenizer(["a good movie", "bad"], padding=True, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def merged_copy(method: SVE, member: int) -> nn.Module:
    """The backbone with every SV layer replaced by its plain merged layer for ``member``."""
    backbone = copy.deepcopy(method.backbone)
    for name in method.wrapped:
        parent, _, child = name.rpartition(".")
        owner = backbone.model.get_submodule(parent) if parent else backbone.model
        setattr(owner, child, getattr(owner, child).merge(member))
    return backbone.eval()


@pytest.mark.parametrize("make, name", CASES)
def test_sve_preserves_the_function_and_members_equal_their_merged_models(make, name, caplog):
    torch.manual_seed(0)
    backbone = make(name).eval()
    batch = batch_for(backbone)
    with torch.no_grad():
        base = backbone(batch)
    assert base.shape == (2, backbone.feature_dim)  # the width the model really outputs (OPT: 16)
    for sigma in (0.0, 0.2):
        torch.manual_seed(1)
        caplog.clear()
        with caplog.at_level("WARNING", logger="sve"):
            method = SVE(copy.deepcopy(backbone), ensemble_size=3, num_classes=2, sigma_init=sigma).eval()
            with torch.no_grad():
                method(batch)  # the full path, with any layout fallback
                features = torch.cat([method.member_features(batch, [k]) for k in range(3)])  # (3, B, D)
        assert method.wrapped and all(
            isinstance(method.backbone.model.get_submodule(n), MemberLayer) for n in method.wrapped
        )
        if method.fallback:  # the fallback names the module and says so, once
            said = [r.getMessage() for r in caplog.records if "one at a time" in r.getMessage()]
            assert len(said) == 1 and method.fallback in said[0]
        for k in range(3):
            expected = base if sigma == 0 else merged_copy(method, k)(batch)
            torch.testing.assert_close(features[k], expected, atol=2e-5, rtol=2e-5)
        if sigma > 0:
            assert not torch.allclose(features[0], features[1])
        if method.fallback is None:  # the batched path ran: it must agree with one member at a time
            with torch.no_grad():
                batched = method.member_features(batch, [0, 1, 2])
            torch.testing.assert_close(batched, features, atol=2e-5, rtol=2e-5)


def test_time_major_and_weight_reading_owners_fall_back_naming_the_module(caplog):
    torch.manual_seed(0)
    with caplog.at_level("WARNING", logger="sve"):  # found when the method is built, before any batch
        method = SVE(TimeMajorEncoder(), ensemble_size=2, num_classes=2, sigma_init=0.1).eval()
    assert re.search(r"one at a time.*layers\.0\.(self_attn\.out_proj|linear1)", caplog.text)
    assert method.fallback.startswith("layers.0.")
    with torch.no_grad():
        method({"pixel_values": torch.randn(3, 5, 16)})


def test_an_encoder_only_checkpoint_of_an_encoder_decoder_family_loads_as_itself(tmp_path):
    # AutoModel maps every T5 config to the encoder-decoder T5Model: an encoder-only checkpoint (T5EncoderModel,
    # as sentence encoders ship) would get a decoder of random weights and no decoder inputs.
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    encoder = T5EncoderModel(T5Config(vocab_size=V, d_model=32, d_kv=16, num_layers=2, num_heads=2, d_ff=64)).eval()
    encoder.save_pretrained(tmp_path)
    backbone = HFBackbone(["q", "v"], name_or_path=str(tmp_path), tokenizer="char", pooling="mean").eval()
    assert type(backbone.model) is T5EncoderModel and not backbone.is_encoder_decoder
    batch = batch_for(backbone)
    with torch.no_grad():
        states = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        mask = batch["attention_mask"][..., None].float()
        torch.testing.assert_close(backbone(batch), (states * mask).sum(1) / mask.sum(1))


@pytest.mark.parametrize("name", ["hf_convnext", "hf_resnet"])
def test_a_hugging_face_cnn_gives_the_pooled_features_its_classifier_reads(name):
    # Its last hidden state is a (N, C, H, W) map, which no token pooling reads: the features are its pooler
    # output, the vector its own ...ForImageClassification head takes.
    torch.manual_seed(0)
    backbone = hf_backbone(name).eval()
    batch = batch_for(backbone)
    with torch.no_grad():
        pooled = backbone.model(pixel_values=batch["pixel_values"]).pooler_output.flatten(1)
        torch.testing.assert_close(backbone(batch), pooled)
    assert backbone.feature_dim == 64


def test_an_image_model_is_normalised_with_its_own_processors_mean_and_std(tmp_path, monkeypatch):
    # Google's ViTs use 0.5, not ImageNet's statistics: a local directory's preprocessor_config.json, and a Hub
    # id's (downloaded or cached; here the Hub is replaced by a file), give the mean and std.
    import json

    import transformers.utils

    from sve.backbones import hf

    config = dict(HF["hf_vit"][1])
    settings = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
    hub_file = tmp_path / "hub" / "preprocessor_config.json"
    hub_file.parent.mkdir()
    hub_file.write_text(json.dumps(settings))
    asked = []
    monkeypatch.setattr(
        transformers.utils, "cached_file", lambda repo, name, **_: asked.append((repo, name)) or str(hub_file)
    )
    monkeypatch.setattr(hf, "hub_reachable", lambda: False)
    assert hf.preprocessor_config("google/vit-base-patch16-224") == settings
    assert asked == [("google/vit-base-patch16-224", "preprocessor_config.json")]
    local = tmp_path / "local"
    local.mkdir()
    (local / "preprocessor_config.json").write_text(json.dumps({**settings, "image_mean": [0.4, 0.4, 0.4]}))
    backbone = HFBackbone(["query"], pretrained=False, config=config, tokenizer=str(local))
    assert backbone.mean == (0.4, 0.4, 0.4) and backbone.std == (0.5, 0.5, 0.5)
    (tmp_path / "no-processor-here").mkdir()
    assert hf.preprocessor_config(str(tmp_path / "no-processor-here")) is None  # a directory without one


def test_cls_pooling_on_a_tokenizer_without_a_summary_token_is_warned_of(tmp_path, caplog):
    # T5's and most sentence encoders' tokenizers put no [CLS] first: "cls" would read the first word.
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "a": 2, "good": 3, "movie": 4}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(tmp_path)
    config = dict(model_type="bert", vocab_size=V, hidden_size=16, intermediate_size=32, **SIZES)
    with caplog.at_level("WARNING"):
        HFBackbone(["query"], pretrained=False, config=config, tokenizer=str(tmp_path), pooling="cls")
    assert (
        f"the tokenizer of '{tmp_path}' starts a text with no [CLS]-like token (it starts with 'a'); "
        "backbone.pooling=mean" in caplog.text
    )
    caplog.clear()
    with caplog.at_level("WARNING"):
        HFBackbone(["query"], pretrained=False, config=config, tokenizer=str(tmp_path), pooling="mean")
        HFBackbone(["query"], pretrained=False, config=config, tokenizer="char", pooling="cls")  # [CLS] first
    assert "CLS" not in caplog.text


def test_a_stochastic_method_that_falls_back_draws_as_a_later_call_from_the_same_seed(caplog):
    # BLoB samples its weights as it runs: the batched pass that fails on the time-major layout has drawn
    # already, so the retry must start from the generator state the call began with.
    from sve.methods.blob import BLoB

    torch.manual_seed(0)
    method = BLoB(TimeMajorEncoder(), ensemble_size=1, num_classes=2, init_std=0.5, num_samples=3).eval()
    with torch.no_grad():  # LoRA's B starts at zero, where every sample is the same function
        for name, p in method.named_parameters():
            if name.endswith("lora_B"):
                p.normal_()
    x = {"pixel_values": torch.randn(3, 5, 16)}
    with torch.no_grad(), caplog.at_level("WARNING", logger="sve"):
        torch.manual_seed(7)
        first = method(x)  # falls back
    assert "one at a time" in caplog.text
    with torch.no_grad():
        torch.manual_seed(7)
        later = method(x)
        torch.manual_seed(8)
        other = method(x)
    assert method.fallback and torch.equal(first, later)
    assert not torch.equal(first, other)  # the method does draw: the equality is not trivial


def test_blob_training_on_a_time_major_model_decides_before_it_stacks_its_samples(caplog):
    # In training each example is a member with its own sample (B members of one row each). On layers that are not
    # called batch-first the samples cannot be stacked: the probe finds it before the pass, and the batch runs with
    # one sample, drawn after the B that the step draws first, from the generator as the step left it.
    from sve.methods.blob import BLoB

    torch.manual_seed(0)
    method = BLoB(TimeMajorEncoder(), ensemble_size=1, num_classes=2, init_std=0.5).train()
    assert not method.layout_known  # no layer had two members when it was built: samples come per pass
    with torch.no_grad():
        for name, p in method.named_parameters():
            if name.endswith("lora_B"):
                p.normal_()
    x = {"pixel_values": torch.randn(3, 5, 16)}
    with torch.no_grad(), caplog.at_level("WARNING", logger="sve"):
        torch.manual_seed(7)
        logits = method(x)
    assert method.layout_known and method.fallback.startswith("layers.") and "one at a time" in caplog.text
    with torch.no_grad():
        torch.manual_seed(7)
        with method.samples(3), method.samples(1):  # what the step draws, then the one sample the batch runs
            expected = method.heads(method.backbone(x).unsqueeze(0), [0])
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)


def test_samples_installed_per_pass_are_probed_once_on_the_first_batch_that_stacks_them(monkeypatch):
    # BLoB's evaluation samples exist only inside its forward: the first call that stacks them probes their layout
    # (on its first example, the random state left as it was), and no later call probes again.
    from sve.methods.base import EnsembleMethod
    from sve.methods.blob import BLoB

    torch.manual_seed(0)
    method = BLoB(hf_backbone("bert"), ensemble_size=1, num_classes=2, num_samples=3).eval()
    assert not method.layout_known and method.fallback is None
    probed = []
    probe = EnsembleMethod.probe_member_layout
    monkeypatch.setattr(
        EnsembleMethod, "probe_member_layout", lambda self, batch=None: probed.append(batch) or probe(self, batch)
    )
    batch = batch_for(method.backbone)
    with torch.no_grad():
        torch.manual_seed(5)
        first = method(batch)
        assert method.layout_known and method.fallback is None
        torch.manual_seed(5)
        again = method(batch)
    torch.testing.assert_close(first, again, rtol=0, atol=0)  # the probe drew nothing that the pass then missed
    assert len(probed) == 2  # asked by each call; decided by the first (layout_known), returning at once after
