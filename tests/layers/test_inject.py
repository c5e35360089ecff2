"""Injection selects exactly the target layers and nothing else (Sec. 4, "Implementation")."""

import re

import pytest
import torch
from torch import nn

from sve.errors import InputError
from sve.layers import SVLinear
from sve.layers.inject import find_targets, inject
from sve.methods import SVE
from sve.runs.run import instantiate
from tests.conftest import compose_cfg


def to_sv(layer):
    return SVLinear.from_linear(layer, ensemble_size=2)


class Flat(nn.Module):
    def __init__(self):
        super().__init__()
        self.query = nn.Linear(4, 4)
        self.query_proj = nn.Linear(4, 4)
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(4, 2)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.ModuleDict({"qkv": nn.Linear(8, 24), "proj": nn.Linear(8, 8)})
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch_embed = nn.ModuleDict({"proj": nn.Conv2d(3, 8, 4)})
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 5)


def test_flat_suffix_is_whole_component():
    model = Flat()
    names = inject(model, ["query"], to_sv)
    assert names == ["query"]
    assert isinstance(model.query, SVLinear) and isinstance(model.query_proj, nn.Linear)


def test_nested_regex_and_type_filter():
    model = Nested()
    names = inject(model, [r"attn\.(qkv|proj)", r"mlp\.(0|2)", "proj"], to_sv)
    assert names == [f"blocks.{i}.{s}" for i in (0, 1) for s in ("attn.qkv", "attn.proj", "mlp.0", "mlp.2")]
    assert isinstance(model.patch_embed["proj"], nn.Conv2d)  # 'proj' matched it by name, but it is a Conv2d
    assert type(model.head) is nn.Linear


def test_head_is_never_wrapped_even_if_pattern_matches():
    model = Nested()
    assert "head" not in find_targets(model, [".*"])


def test_no_match_raises_naming_patterns():
    with pytest.raises(ValueError, match=re.escape("['nonexistent']")):
        inject(Nested(), ["nonexistent"], to_sv)


def _backbone(name):
    return instantiate(compose_cfg([f"backbone={name}"]).backbone)


def test_tiny_vit_targets():
    backbone = _backbone("tiny_vit")
    names = find_targets(backbone.model, backbone.target_modules)
    expected = [f"blocks.{i}.{s}" for i in range(2) for s in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")]
    assert names == expected
    assert isinstance(backbone.model.patch_embed.proj, nn.Conv2d)


def test_tiny_bert_targets():
    backbone = _backbone("tiny_bert")
    names = find_targets(backbone.model, backbone.target_modules)
    per_layer = [
        "attention.self.query",
        "attention.self.key",
        "attention.self.value",
        "attention.output.dense",
        "intermediate.dense",
        "output.dense",
    ]
    assert names == [f"encoder.layer.{i}.{s}" for i in range(2) for s in per_layer]
    assert all("pooler" not in n for n in names)


def test_tiny_llama_targets_leave_lm_head():
    backbone = _backbone("tiny_llama")
    names = find_targets(backbone.model, backbone.target_modules)
    per_layer = [
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ]
    assert names == [f"model.layers.{i}.{s}" for i in range(2) for s in per_layer]
    assert "lm_head" not in find_targets(backbone.model, [".*"])


@pytest.mark.parametrize("name", ["tiny_vit", "tiny_bert", "tiny_llama"])
def test_sve_at_init_without_noise_equals_base_backbone(name):
    """With sigma_init=0 every member of the wrapped backbone computes the pretrained function."""
    from sve.members import repeat_batch, split_members
    from sve.methods import SVE

    backbone = _backbone(name)
    backbone.eval()
    batch = _batch(backbone)
    with torch.no_grad():
        base = backbone(batch)
        method = SVE(backbone, ensemble_size=3, num_classes=2, sigma_init=0.0).eval()
        wrapped = split_members(method.backbone(repeat_batch(batch, 3)), 3)
    for m in range(3):
        torch.testing.assert_close(wrapped[m], base, atol=1e-4, rtol=1e-4)


def _batch(backbone):
    if backbone.modality == "image":
        return {"pixel_values": torch.randn(2, 3, backbone.image_size, backbone.image_size)}
    enc = backbone.tokenizer(["a good movie", "bad"], padding=True, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


class WithClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.ModuleDict({"dense": nn.Linear(4, 4), "query": nn.Linear(4, 4)})
        self.pre_classifier = nn.Linear(4, 4)
        self.classifier = nn.ModuleDict({"dense": nn.Linear(4, 4), "out_proj": nn.Linear(4, 2)})
        self.lm_head = nn.ModuleDict({"dense": nn.Linear(4, 4)})


def test_head_sub_layers_are_protected_without_a_probe():
    assert find_targets(WithClassifier(), ["dense", "out_proj|query"]) == ["encoder.dense", "encoder.query"]


def test_every_pattern_must_match_and_the_error_names_the_one_that_did_not():
    with pytest.raises(ValueError, match=r"'missing' matched no module") as err:
        find_targets(Nested(), [r"attn\.qkv", "missing"])
    assert "blocks.0.attn.qkv" in str(err.value)  # candidates are listed


def test_a_pattern_naming_a_layer_of_another_type_says_so():
    # Bayes-LoRA (LA) adapts linears only: on a CNN every default target is a convolution.
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"'\^0' matched 0 \(Conv2d\), not a type this method adapts"):
        find_targets(model, ["^0"], types=(nn.Linear,))
    blocks = nn.ModuleDict({"ffn": nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))})
    with pytest.raises(InputError, match=r"'ffn' matched only blocks that hold layers.*'ffn\\\..\*' takes every"):
        find_targets(blocks, ["ffn"])  # a block's name, not a layer's
    assert find_targets(blocks, [r"ffn\..*"]) == ["ffn.0", "ffn.1"]  # the advice works
    many = [f"^{i}" for i in range(8)]
    with pytest.raises(ValueError, match=r"\.\.\. \(8 in all\).*'\^1' matched no module.*\(7 patterns in all\)"):
        find_targets(model, many, types=(nn.Linear,))  # a long list is cut, with its length; '^2' is the linear


def test_a_pattern_naming_only_heads_says_so_and_heads_are_not_candidates():
    with pytest.raises(ValueError, match=r"'head' matched only heads") as err:
        find_targets(Nested(), ["head"])
    assert "Adaptable modules are: blocks.0.attn.qkv" in str(err.value) and ", head" not in str(err.value)


def test_a_bare_string_is_one_pattern_and_bad_patterns_are_named():
    assert find_targets(Flat(), "query") == ["query"]
    with pytest.raises(ValueError, match=r"\['nothing'\]"):  # the pattern, not its characters
        find_targets(Flat(), "nothing")
    with pytest.raises(ValueError, match=r"'attn\(' is not a valid regular expression"):
        find_targets(Flat(), ["attn("])
    with pytest.raises(InputError, match="patterns are strings"):  # a user error: one line from the command line
        find_targets(Flat(), [3])


def test_structural_probe_excludes_what_does_not_reach_the_features():
    """BERT's pooler (executed, output unused) and an LM's lm_head (never called) are outside the feature path,
    whatever the patterns say; their parameters are reported unused so methods freeze them."""
    for name, outside in (("tiny_bert", "pooler.dense"), ("tiny_llama", "lm_head")):
        backbone = _backbone(name)
        usage = backbone.probe_usage()
        assert outside in usage.unused_modules
        with pytest.raises(ValueError, match="matched only heads"):
            find_targets(backbone.model, [outside.replace(".", r"\.")], outside=usage.unused_modules)
        unused = {id(p) for p in usage.unused_parameters}
        assert id(backbone.model.get_submodule(outside).weight) in unused or name == "tiny_llama"
    method = SVE(_backbone("tiny_bert"), ensemble_size=2, num_classes=2)
    assert all("pooler" not in n for n in method.wrapped)


def test_a_layer_fed_a_shared_leading_dimension_raises_a_layout_error_naming_it():
    from sve.members import MemberLayoutError

    model = Flat()
    inject(model, ["query"], to_sv)
    rows = model.query.expect_rows(2 * 3)  # as the method says it: 2 members x 3 examples
    with rows, pytest.raises(MemberLayoutError, match=r"^query got an input of shape \(1, 5, 4\)"):
        model.query(torch.randn(1, 5, 4))  # e.g. relative-position embeddings shared by the batch
    with model.query.expect_rows(2 * 3), pytest.raises(MemberLayoutError, match="leading dimension"):
        model.query(torch.randn(5, 6, 4))  # time-major (T, K*B, D): T is not the member-major batch
    assert model.query(torch.randn(6, 5, 4)).shape == (6, 5, 4)


def test_a_bare_string_from_the_command_line_is_one_pattern_not_its_characters():
    cfg = compose_cfg(["backbone=tiny_bert", "backbone.target_modules=query"])
    backbone = instantiate(cfg.backbone)
    assert backbone.target_modules == ["query"]
    method = SVE(backbone, ensemble_size=2, num_classes=2, target_modules="value")
    assert method.wrapped == [f"encoder.layer.{i}.attention.self.value" for i in range(2)]


@pytest.mark.parametrize(
    "name, layers",
    [
        # BERT: every linear of the encoder (the pooler's output is unused: outside the feature path).
        (
            "tiny_bert",
            [
                f"encoder.layer.{i}.{s}"
                for i in range(2)
                for s in (
                    "attention.self.query",
                    "attention.self.key",
                    "attention.self.value",
                    "attention.output.dense",
                    "intermediate.dense",
                    "output.dense",
                )
            ],
        ),
        # ViT: the patch embedding too (a convolution with groups = 1), and no head.
        (
            "tiny_vit",
            ["patch_embed.proj"]
            + [f"blocks.{i}.{s}" for i in range(2) for s in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")],
        ),
    ],
)
def test_target_modules_all_takes_every_layer_on_the_feature_path_and_equals_the_base_at_init(name, layers):
    backbone = _backbone(name)
    backbone.target_modules = ["all"]
    backbone.eval()
    batch = _batch(backbone)
    with torch.no_grad():
        base = backbone(batch)
    method = SVE(backbone, ensemble_size=2, num_classes=2, sigma_init=0.0).eval()
    assert method.wrapped == layers
    assert method.target_modules == [f"^{re.escape(n)}" for n in layers]  # recorded as exact names
    from sve.members import repeat_batch, split_members

    with torch.no_grad():
        wrapped = split_members(method.backbone(repeat_batch(batch, 2)), 2)
    torch.testing.assert_close(wrapped[1], base, atol=1e-4, rtol=1e-4)


def test_the_wrapped_modules_log_groups_names_by_block_index():
    from sve.layers.inject import grouped_names

    names = [f"model.layers.{i}.attn.{x}" for i in range(32) for x in ("q", "k")] + ["head", "b.0.c", "b.2.c"]
    assert grouped_names(names) == (
        "model.layers.{0..31}.attn.q (32), model.layers.{0..31}.attn.k (32), head, b.{0,2}.c (2)"
    )
    # Two numeric parts: each part's values, and the count of modules, so nothing is hidden.
    assert grouped_names(["s.0.b.1.c", "s.1.b.0.c", "s.1.b.1.c"]) == "s.{0..1}.b.{0..1}.c (3)"
    assert grouped_names(["encoder.layer.3.output.dense"]) == "encoder.layer.3.output.dense"


def test_a_slow_wrap_shows_a_bar_of_the_layers_it_decomposes(monkeypatch, capsys):
    import sve
    from sve.layers import inject as injection

    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Linear(8, 3))

    x = torch.randn(2, 6)
    sve.wrap(mlp(), "sve", ensemble_size=2, example_input=x, svd_cache=None)
    assert "SVD of" not in capsys.readouterr().err  # a wrap faster than PROGRESS_DELAY says nothing

    monkeypatch.setattr(injection, "PROGRESS_DELAY", 0.0)  # as a slow wrap shows it
    ensemble = sve.wrap(mlp(), "sve", ensemble_size=2, example_input=x, svd_cache=None)
    decomposed = sum(isinstance(m, SVLinear) for m in ensemble.modules())
    assert decomposed == len(ensemble.method.wrapped) == 3  # the three linears before the head
    shown = capsys.readouterr().err.split("\r")[-1]  # the bar as it was left, after its last update
    assert shown.startswith("SVE: SVD of the target layers: 100%") and f" {decomposed}/{decomposed} " in shown
