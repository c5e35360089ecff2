"""``sve.wrap`` on models users already have: a plain PyTorch model, timm CNNs and ViTs, Hugging Face encoders
and causal LMs. Facts checked: every member computes the model's own output at init (zero noise, the model's
head), every method of the framework builds and trains through the same call, the defaults adapt exactly the
layers on the feature path, and BatchNorm statistics never mix members."""

import copy
import re

import numpy as np
import pytest
import timm
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
)

import sve
from sve.api.options import method_names
from sve.errors import InputError
from sve.layers.member import MemberLayer
from sve.metrics.collapse import COLLAPSED_BELOW

torch.set_num_threads(1)
# Zero init noise on the model's own head is what makes the members equal the model (the warning says so).
pytestmark = pytest.mark.filterwarnings("ignore:SVE. the head is pretrained")


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 12), nn.Tanh(), nn.Linear(12, 3))


def tiny_bert() -> nn.Module:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=3,
    )
    return BertForSequenceClassification(config).eval()


def tiny_llama() -> nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(config).eval()


def tiny_llama_classifier() -> nn.Module:
    """LLaMA's sequence classifier: it scores every token with ``score``, then keeps the last real one."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=3,
        pad_token_id=0,
    )
    return LlamaForSequenceClassification(config).eval()


def members_equal_the_model(ensemble, expected: torch.Tensor, *args, **kwargs) -> None:
    ensemble.eval()
    with torch.no_grad():
        logits = ensemble(*args, **kwargs)
    assert logits.shape == (ensemble.ensemble_size, *expected.shape)
    torch.testing.assert_close(logits, expected.expand_as(logits), atol=2e-5, rtol=1e-4)


def test_a_plain_model_keeps_its_output_at_init_and_its_head_is_found():
    model, x = mlp(), torch.randn(5, 6)
    with torch.no_grad():
        expected = model(x)
    ensemble = sve.wrap(model, "sve", ensemble_size=3, example_input=x, sigma_init=0.0)
    assert ensemble.config["head"] == "4" and ensemble.config["target_modules"] == ["^0", "^2"]
    members_equal_the_model(ensemble, expected, x)
    # The layers on the feature path, and only they, became SV layers; the head is the members' heads.
    assert [n for n, m in ensemble.method.backbone.model.named_modules() if isinstance(m, MemberLayer)] == ["0", "2"]
    assert ensemble.method.heads.weight.shape == (3, 3, 12)


def test_fresh_heads_give_the_asked_classes_and_members_differ():
    model, x = mlp(), torch.randn(5, 6)
    ensemble = sve.wrap(model, "sve", ensemble_size=4, num_classes=7, example_input=x)
    logits = ensemble(x)
    assert logits.shape == (4, 5, 7)
    assert not torch.allclose(logits[0], logits[1])  # own random heads and own noise per member


@pytest.mark.parametrize("name", ["resnet18", "efficientnet_b0"])
def test_a_timm_cnn_keeps_its_output_and_batchnorm_never_mixes_members(name):
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=5).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
    ensemble = sve.wrap(model, "sve", ensemble_size=2, sigma_init=0.0)
    members_equal_the_model(ensemble, expected, x)
    # Depthwise convolutions (EfficientNet) are not targets; every other convolution and linear on the path is.
    wrapped = ensemble.method.wrapped
    convs = {n: m for n, m in ensemble.method.backbone.model.named_modules() if isinstance(m, nn.Conv2d)}
    assert all(m.groups > 1 for m in convs.values())  # what is left unwrapped is only depthwise
    assert wrapped
    # Training mode: BatchNorm keeps its running statistics, so member k's output does not depend on member j.
    ensemble.train()
    stats = [m.running_mean.clone() for m in ensemble.modules() if isinstance(m, nn.BatchNorm2d)]
    both = ensemble(x)
    alone = ensemble.method.member_logits({"_arg0": x}, [1])
    torch.testing.assert_close(both[1], alone[0], atol=1e-5, rtol=1e-4)
    after = [m.running_mean for m in ensemble.modules() if isinstance(m, nn.BatchNorm2d)]
    assert all(torch.equal(a, b) for a, b in zip(stats, after))


def test_a_bf16_model_is_probed_in_its_own_dtype():
    # The probe input a timm model describes must take the model's dtype: a float32 probe fails on bf16 weights.
    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=3).eval().to(torch.bfloat16)
    x = torch.randn(2, 3, 32, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = model(x)
    ensemble = sve.wrap(model, "sve", ensemble_size=2, sigma_init=0.0)  # no example_input: pretrained_cfg's
    assert ensemble.config["head"] == "fc"
    with torch.no_grad():
        out = ensemble.eval()(x)
    for member in out.float():  # bf16 has 8 bits of mantissa: the SVD's rounding shows at about 1e-2 of the logits
        torch.testing.assert_close(member, expected.float(), atol=0.05, rtol=0.05)


def test_a_timm_vit_keeps_its_output():
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, num_classes=4, depth=2).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
    ensemble = sve.wrap(model, "sve", ensemble_size=2, sigma_init=0.0)  # input size read from the model
    assert ensemble.config["head"] == "head"
    members_equal_the_model(ensemble, expected, x)


def test_a_timm_model_built_at_another_size_is_probed_at_that_size():
    # MaxViT and CoAtNet keep the size they were built at as their own img_size, not in patch_embed as a ViT does;
    # their pretrained_cfg still says 224, on which a model built for 32 fails (its windows no longer fit).
    from timm.models.maxxvit import MaxxVit, MaxxVitCfg, _rw_max_cfg

    torch.manual_seed(0)
    cfg = MaxxVitCfg(
        embed_dim=(8, 16), depths=(1, 1), block_type=("M", "M"), stem_width=8, **_rw_max_cfg(window_size=4, dim_head=8)
    )
    model = MaxxVit(cfg, img_size=32, num_classes=3).eval()
    model.pretrained_cfg = {"input_size": (3, 224, 224)}  # as timm.create_model sets it
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
    ensemble = sve.wrap(model, "sve", ensemble_size=2, sigma_init=0.0)  # no example_input
    assert ensemble.method.backbone.example["_arg0"].shape == (1, 3, 32, 32)
    members_equal_the_model(ensemble, expected, x)


def test_a_model_that_fails_on_the_input_it_describes_is_told_to_give_one_and_is_left_as_it_was():
    # LeViT built at 64 keeps no record of its size: the 224 of its pretrained_cfg fails deep inside attention.
    torch.manual_seed(0)
    model = timm.create_model("levit_128s", pretrained=False, img_size=64, num_classes=3, distilled=False).eval()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(InputError, match=r"fails on the input it describes \(input \(1, 3, 224, 224\).*example_input="):
        sve.wrap(model, "sve", ensemble_size=2)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = model(x)
    # What the error asks; the head is a BatchNorm and a linear, whose linear the members start from.
    ensemble = sve.wrap(model, "sve", ensemble_size=2, sigma_init=0.0, example_input=x[:1], head="head.linear")
    members_equal_the_model(ensemble, expected, x)


def test_a_model_that_combines_two_heads_reads_the_first_heads_input():
    # timm's distilled DeiT averages a class head (class token) and a distillation head (distillation token).
    def deit():
        torch.manual_seed(0)
        return timm.create_model(
            "deit_tiny_distilled_patch16_224", pretrained=False, img_size=32, depth=1, num_classes=5
        ).eval()

    model, x = deit(), torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        class_token = model.forward_features(x)[:, 0]
        own_head = model.head(class_token)
    with pytest.raises(ValueError, match=r"combines 2 heads \('head', 'head_dist'\).*give num_classes"):
        sve.wrap(model, "sve", ensemble_size=2)
    fresh = sve.wrap(model, "sve", ensemble_size=2, num_classes=3, sigma_init=0.0)
    with torch.no_grad():
        torch.testing.assert_close(fresh.method.backbone({"_arg0": x}), class_token)
    assert not any("head_dist" in name for name in fresh.method.wrapped)  # it never reaches the features
    # Naming one head keeps it: at zero noise every member is that head on the class token (the code after the
    # head, the average with the other head's logits, cannot run on features and is not needed).
    kept = sve.wrap(deit(), "sve", ensemble_size=2, sigma_init=0.0, head="head")
    members_equal_the_model(kept, own_head, x)


def test_a_model_ending_in_a_softmax_is_told_which_layer_is_its_head(caplog):
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4), nn.Softmax(-1)), torch.randn(3, 6)
    with torch.no_grad():
        logits = model[:3](x)
    with pytest.raises(ValueError, match=r"its head is likely its last layer '2'.*pass head='2'"):
        sve.wrap(model, "sve", ensemble_size=2, example_input=x)
    with caplog.at_level("WARNING"):  # fresh heads on the probabilities would be allowed, but not silently
        sve.wrap(copy.deepcopy(model), "sve", ensemble_size=2, num_classes=3, example_input=x)
    assert "the output is the features (if the output is class scores" in caplog.text
    kept = sve.wrap(model, "sve", ensemble_size=2, sigma_init=0.0, head="2", example_input=x)
    members_equal_the_model(kept, logits, x)  # the head's logits, before the softmax


class WithSharedArguments(nn.Module):
    """A forward with arguments every example shares: a vector (not batch-first) and a 0-d scale."""

    def __init__(self):
        super().__init__()
        self.a, self.head = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x, offset, scale):
        return self.head(torch.relu(self.a(x) + offset)) * scale


def test_arguments_the_examples_share_are_not_stacked_per_member():
    def model():
        torch.manual_seed(0)
        return WithSharedArguments().eval()

    x, offset, scale = torch.randn(5, 4), torch.randn(8), torch.tensor(2.0)
    with torch.no_grad():
        logits = model().head(torch.relu(model().a(x) + offset))
    # The output is head(...) * scale, so no layer's output is the model's. The head's own output is freed
    # before the model's is made; the probe must not take the new tensor for it (a reused id made the first
    # layer the head, before).
    with pytest.raises(ValueError, match="its head is likely its last layer 'head'"):
        sve.wrap(model(), "sve", ensemble_size=3, example_input=(x, offset, scale))
    kept = sve.wrap(model(), "sve", ensemble_size=3, sigma_init=0.0, head="head", example_input=(x, offset, scale))
    members_equal_the_model(kept, logits, x, offset, scale)  # the offset is added, not stacked 3 times
    assert kept.predict(x[:1], offset, scale).probs.shape == (1, 3)


class SharedLayer(nn.Module):
    """One linear registered under two names and applied twice (a weight-shared block, as in ALBERT-like nets)."""

    def __init__(self):
        super().__init__()
        self.first = self.second = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(torch.relu(self.second(torch.relu(self.first(x)))))


@pytest.mark.parametrize("method", ["sve", "lora_ensemble", "batch_ensemble"])
def test_a_layer_registered_twice_is_a_member_layer_at_both_places(method):
    torch.manual_seed(0)
    model, x = SharedLayer().eval(), torch.randn(4, 8)
    head = copy.deepcopy(model.head)  # the members start from it; wrap makes model.head a feature tap
    with torch.no_grad():
        expected = model(x)
    options = {"sigma_init": 0.0} if method == "sve" else {}
    ensemble = sve.wrap(model, method, ensemble_size=2, example_input=x, **options)
    assert isinstance(model.first, MemberLayer) and model.second is model.first  # not the base layer at one place
    if method == "sve":
        members_equal_the_model(ensemble, expected, x)
        layer = model.first
        with torch.no_grad():  # member 1's singular values doubled: both applications change
            layer.singular_values[1] *= 2
            base = layer.merge(1)
            doubled = head(torch.relu(base(torch.relu(base(x)))))
            torch.testing.assert_close(ensemble.eval()(x)[1], doubled, atol=1e-5, rtol=1e-4)


def structure(model: nn.Module) -> list:
    return [(name, type(m).__name__, m.training) for name, m in model.named_modules()] + [
        (name, p.requires_grad, p.data_ptr()) for name, p in model.named_parameters()
    ]


@pytest.mark.parametrize(
    "method, options, error",
    [
        ("sve", {"num_classes": None, "bogus": 1}, "unknown option"),  # refused after the head became a feature tap
        ("lora_ensemble", {"rank": 0}, "rank"),  # refused by the first layer the method builds
        ("batch_ensemble", {"init_std": -1.0}, "init_std"),
    ],
)
def test_a_wrap_that_fails_leaves_the_model_as_it_was(method, options, error):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))
    x = torch.randn(3, 6)
    before, expected = structure(model), model(x).detach()
    with pytest.raises((TypeError, ValueError), match=error):
        sve.wrap(model, method, ensemble_size=2, example_input=x, **{"num_classes": 3, **options})
    assert structure(model) == before
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    assert sve.wrap(model, method, ensemble_size=2, num_classes=3, example_input=x)  # and it can be wrapped


def test_a_hugging_face_classifier_keeps_its_output_with_keyword_inputs():
    model = tiny_bert()
    ids = torch.randint(1, 40, (3, 7))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
    ensemble = sve.wrap(model, "sve", ensemble_size=2, sigma_init=0.0)
    assert ensemble.config["head"] == "classifier"
    members_equal_the_model(ensemble, expected, input_ids=ids, attention_mask=mask)
    assert not any("pooler" in n for n in ensemble.method.wrapped) or "bert.pooler.dense" in ensemble.method.wrapped


def test_a_causal_lm_needs_a_pooling_and_then_reads_the_last_token():
    model, ids = tiny_llama(), torch.randint(1, 40, (2, 6))
    with pytest.raises(ValueError, match=r"shape \(1, 4, 16\).*pooling= one of \['cls', 'mean', 'last'\]"):
        sve.wrap(tiny_llama(), "sve", ensemble_size=2, num_classes=3)
    with torch.no_grad():
        expected = model(input_ids=ids).logits[:, -1]  # no padding: the last token is the last position
    ensemble = sve.wrap(model, "sve", ensemble_size=2, pooling="last", sigma_init=0.0)
    assert ensemble.config["head"] == "lm_head"
    members_equal_the_model(ensemble, expected, input_ids=ids, attention_mask=torch.ones_like(ids))


def test_a_model_returning_a_plain_dict_of_logits_keeps_its_output_and_its_head_is_found():
    class DictOutput(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head = nn.Linear(6, 8), nn.Linear(8, 3)

        def forward(self, x):
            return {"logits": self.head(torch.tanh(self.body(x))), "steps": 1}

    torch.manual_seed(0)
    model, x = DictOutput().eval(), torch.randn(4, 6)
    with torch.no_grad():
        expected = model(x)["logits"]
    ensemble = sve.wrap(model, "sve", ensemble_size=2, example_input=x, sigma_init=0.0)
    assert ensemble.config["head"] == "head"
    members_equal_the_model(ensemble, expected, x)


def test_a_classifier_that_picks_a_token_after_its_head_is_told_how_to_keep_it():
    # LLaMA's (and GPT-2's) sequence classifier scores every token, then keeps the last non-padding one: no
    # layer's output is the model's output, so the error names the layer and the arguments that keep it.
    model = tiny_llama_classifier()
    ids = torch.randint(1, 40, (3, 7))
    ids[1, 4:] = 0  # padding on the right, as the model's own token choice assumes
    mask = (ids != 0).long()
    with pytest.raises(ValueError, match=r"layer 'score' gives \(1, 4, 3\).*head='score' and pooling="):
        sve.wrap(model, "sve", ensemble_size=2)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
    ensemble = sve.wrap(model, "sve", ensemble_size=2, head="score", pooling="last", sigma_init=0.0)
    members_equal_the_model(ensemble, expected, input_ids=ids, attention_mask=mask)


@pytest.mark.parametrize("pooling", ["cls", "mean", "last"])
def test_pooling_reads_the_same_tokens_whichever_side_the_padding_is(pooling):
    from sve.backbones.hf import pool

    torch.manual_seed(0)
    tokens = torch.randn(3, 5, 4)  # real tokens: 5, 3 and 1 of them
    lengths = [5, 3, 1]
    right, left = torch.zeros(3, 7, 4), torch.zeros(3, 7, 4)
    right_mask, left_mask = torch.zeros(3, 7, dtype=torch.long), torch.zeros(3, 7, dtype=torch.long)
    for i, n in enumerate(lengths):
        right[i, :n], right_mask[i, :n] = tokens[i, :n], 1
        left[i, 7 - n :], left_mask[i, 7 - n :] = tokens[i, :n], 1
    expected = {
        "cls": tokens[:, 0],
        "last": torch.stack([tokens[i, n - 1] for i, n in enumerate(lengths)]),
        "mean": torch.stack([tokens[i, :n].mean(0) for i, n in enumerate(lengths)]),
    }[pooling]
    torch.testing.assert_close(pool(right, right_mask, pooling), expected)
    torch.testing.assert_close(pool(left, left_mask, pooling), expected)


def test_a_llama_classifier_with_left_padding_keeps_its_output():
    # A LLaMA tokenizer pads on the left; the model reads its last real token, and so must pooling="last".
    model = tiny_llama_classifier()
    ids = torch.randint(1, 40, (3, 7))
    ids[1, :3] = 0  # padding on the left
    mask = (ids != 0).long()
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
    ensemble = sve.wrap(model, "sve", ensemble_size=2, head="score", pooling="last", sigma_init=0.0)
    members_equal_the_model(ensemble, expected, input_ids=ids, attention_mask=mask)


@pytest.mark.parametrize("method", method_names())
def test_every_method_trains_and_predicts_through_wrap(method):
    torch.manual_seed(0)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    model = mlp()
    if method == "mc_dropout":  # it needs dropout sites, and says so (last test)
        model.insert(3, nn.Dropout(0.1))
    ensemble = sve.wrap(model, method, ensemble_size=2, num_classes=3, example_input=x)
    params = ensemble.trainable_parameters()
    assert params and all(p.requires_grad for p in params)
    optimizer = torch.optim.SGD(params, lr=0.1)
    before = [p.detach().clone() for p in params]
    ensemble.train()
    for _ in range(2):
        loss = ensemble.loss(ensemble(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ensemble.end_epoch()
    assert any(not torch.equal(a, b) for a, b in zip(before, params))
    ensemble.finish_training([(x[:8], y[:8]), (x[8:], y[8:])], batch_size=8)
    prediction = ensemble.predict(x)
    torch.testing.assert_close(prediction.probs.sum(-1), torch.ones(16, dtype=torch.float64))
    assert prediction.member_probs.shape[1:] == (16, 3)
    assert (prediction.mutual_information >= -1e-12).all()


def test_a_loader_is_predicted_and_scored_as_its_examples_are_together():
    torch.manual_seed(0)
    x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    ensemble = sve.wrap(mlp(), "sve", ensemble_size=3, num_classes=3, example_input=x)  # noise: members differ
    whole = ensemble.predict(x)
    ensemble.train()  # each call evaluates and gives the mode back
    loaders = {
        "tensors": [x[:4], x[4:]],
        "1-tuples": [(x[:4],), (x[4:],)],
        "pairs": DataLoader(TensorDataset(x, y), batch_size=4),
        "dicts": [{"input": x[:6]}, {"input": x[6:]}],
    }
    for form, loader in loaders.items():
        got = ensemble.predict_loader(loader, progress=False)
        for field in ("probs", "member_probs", "mutual_information", "disagreement"):
            torch.testing.assert_close(getattr(got, field), getattr(whole, field), atol=1e-6, rtol=1e-6, msg=form)
    assert ensemble.training
    metrics = ensemble.evaluate(DataLoader(TensorDataset(x, y), batch_size=3), progress=False)
    probs = whole.probs  # the predictive's accuracy and NLL, computed here by hand
    assert metrics["acc"] == pytest.approx(float((probs.argmax(-1) == y).double().mean()))
    assert metrics["nll"] == pytest.approx(float(-probs[torch.arange(10), y].log().mean()), rel=1e-5)
    assert len(metrics["member_acc"]) == 3 and 0 <= metrics["ece"] <= 1
    with pytest.raises(InputError, match="evaluate needs labelled batches"):
        ensemble.evaluate([x[:4]], progress=False)
    with pytest.raises(InputError, match=r"a batch of tuple of 3 is not one of the forms taken"):
        ensemble.predict_loader([(x, y, y)], progress=False)


def test_evaluate_reports_ood_detection_and_selective_prediction_as_the_cli_does():
    from tests.metrics.test_ood_metrics import reference
    from tests.metrics.test_selective import reference_curve

    torch.manual_seed(0)
    x, y, far = torch.randn(40, 6), torch.randint(0, 3, (40,)), 4 * torch.randn(30, 6)
    ensemble = sve.wrap(mlp(), "sve", ensemble_size=3, num_classes=3, example_input=x)
    inside, outside = ensemble.predict(x), ensemble.predict(far)
    metrics = ensemble.evaluate(
        DataLoader(TensorDataset(x, y), batch_size=16), ood=[far[:20], far[20:]], progress=False
    )
    by_confidence = reference(inside.confidence.numpy(), outside.confidence.numpy())
    by_mi = reference(-inside.mutual_information.numpy(), -outside.mutual_information.numpy())
    for key in by_confidence:  # torchmetrics' float32 areas
        assert metrics[f"ood_{key}"] == pytest.approx(by_confidence[key], abs=1e-6), key
        assert metrics[f"ood_{key}_mi"] == pytest.approx(by_mi[key], abs=1e-6), key
    risk = reference_curve(inside.confidence.numpy(), (inside.label == y).numpy())
    assert metrics["aurc"] == pytest.approx(risk.mean(), abs=1e-9)
    assert metrics["risk_coverage"]["risk"] == pytest.approx(risk, abs=1e-9)
    assert "ood_auroc" not in ensemble.evaluate([(x, y)], progress=False)


def test_the_reliability_diagram_draws_the_bins_of_the_predictions_and_writes_files(tmp_path):
    import matplotlib.figure

    from sve.metrics.plots import reliability_bins

    torch.manual_seed(0)
    x, y = torch.randn(200, 6), torch.randint(0, 3, (200,))
    ensemble = sve.wrap(mlp(), "sve", ensemble_size=3, num_classes=3, example_input=x)
    probs = ensemble.predict(x).probs.numpy()
    fig = ensemble.reliability_diagram(DataLoader(TensorDataset(x, y), batch_size=64), progress=False)
    assert isinstance(fig, matplotlib.figure.Figure)
    bins = reliability_bins(probs, y.numpy())
    filled = bins["count"] > 0
    top, bottom = fig.axes[:2]
    accuracy_bars = top.containers[0]  # then the gap to the confidence, stacked on them
    np.testing.assert_allclose([b.get_height() for b in accuracy_bars], bins["accuracy"][filled], atol=1e-12)
    np.testing.assert_allclose([b.get_x() for b in accuracy_bars], np.flatnonzero(filled) / 15, atol=1e-12)
    gap = [b.get_height() for b in top.containers[1]]
    np.testing.assert_allclose(gap, bins["confidence"][filled] - bins["accuracy"][filled], atol=1e-12)
    share = [b.get_height() for b in bottom.containers[0]]
    np.testing.assert_allclose(share, bins["count"] / 200, atol=1e-12)
    written = ensemble.reliability_diagram([(x, y)], path=tmp_path / "figs" / "reliability", progress=False)
    assert isinstance(written, matplotlib.figure.Figure)
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["reliability.pdf", "reliability.png"]
    ensemble.reliability_diagram([(x, y)], path=tmp_path / "one.svg", progress=False)
    assert (tmp_path / "one.svg").is_file() and not (tmp_path / "one.svg.png").exists()
    with pytest.raises(InputError, match="reliability_diagram needs labelled batches"):
        ensemble.reliability_diagram([x], progress=False)


def test_evaluate_names_a_collapsed_member_as_a_run_does():
    # Member 1's head reads nothing (zero weights): its logits are its bias whatever the input, as a member that
    # collapsed in training gives; the others answer per input.
    x, y = torch.randn(30, 6), torch.randint(0, 3, (30,))
    ensemble = sve.wrap(mlp(), "sve", ensemble_size=3, num_classes=3, example_input=x[:1])
    with torch.no_grad():
        ensemble.method.heads.weight[1].zero_()
        ensemble.eval()
        z = ensemble(x).double().numpy()
    spread = (z - z.mean(-1, keepdims=True)).std(axis=1).max(axis=-1)  # per member: its most input-dependent class
    assert [m for m, s in enumerate(spread) if s < COLLAPSED_BELOW] == [1]
    with pytest.warns(UserWarning, match=r"member\(s\) \[1\] of 3 give nearly the same output"):
        metrics = ensemble.evaluate([(x, y)], progress=False)
    assert metrics["collapsed_members"] == [1]


def test_default_targets_are_the_layers_of_the_methods_types(tmp_path):
    # A CNN with a linear bottleneck: SVE takes the convolution and the linear, Bayes-LoRA (LA) (linears only)
    # takes the linear, instead of refusing the default targets for holding a convolution.
    def cnn():
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Conv2d(3, 4, 3),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(4, 8),
            nn.ReLU(),
            nn.Linear(8, 3),
        )

    x = torch.randn(2, 3, 8, 8)
    assert sve.wrap(cnn(), "sve", ensemble_size=2, example_input=x).method.wrapped == ["0", "4"]
    laplace = sve.wrap(cnn(), "bayes_lora_la", ensemble_size=2, example_input=x)
    assert laplace.method.wrapped == ["4"] and laplace.config["target_modules"] == ["^4"]
    laplace.save_pretrained(tmp_path)  # the resolved targets are recorded, so the adapter loads again
    assert sve.from_pretrained(cnn(), tmp_path).method.wrapped == ["4"]
    plain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    with pytest.raises(ValueError, match=r"Sequential has no layer of the types this method adapts \(\['Linear'"):
        sve.wrap(plain, "bayes_lora_la", ensemble_size=2, example_input=x)


def test_a_one_output_head_is_refused_not_read_as_a_certain_classifier():
    # One logit (a regression, or a binary classifier read with a sigmoid): a softmax over it is 1 everywhere.
    x = torch.randn(4, 6)
    one = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
    with pytest.raises(InputError, match=r"head '2' has 1 output: a regression or a one-logit binary classifier"):
        sve.wrap(one, "sve", ensemble_size=2, example_input=x)
    with pytest.raises(InputError, match=r"num_classes=1 is not valid: .* a binary task is num_classes=2"):
        sve.wrap(one, "sve", ensemble_size=2, example_input=x, num_classes=1)
    assert sve.wrap(one, "sve", ensemble_size=2, example_input=x, num_classes=2)(x).shape == (2, 4, 2)


def test_mc_dropout_says_when_it_changes_the_models_dropout_rate(caplog):
    x = torch.randn(4, 6)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))
    with caplog.at_level("INFO", logger="sve.methods.mc_dropout"):
        sve.wrap(model, "mc_dropout", example_input=x, num_classes=3)
    assert model[2].p == 0.05  # the method's rate (C.3), not the model's
    assert "1 dropout site(s) set to method.dropout=0.05 (the model had 0.5)" in caplog.text


def swin_with_stochastic_depth() -> nn.Module:
    from torchvision.models.swin_transformer import SwinTransformer

    return SwinTransformer(
        patch_size=[4, 4],
        embed_dim=8,
        depths=[1, 1],
        num_heads=[1, 2],
        window_size=[2, 2],
        stochastic_depth_prob=0.5,
        num_classes=3,
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: timm.create_model(
            "vit_tiny_patch16_224", pretrained=False, img_size=32, depth=2, num_classes=3, drop_path_rate=0.5
        ),  # timm's DropPath
        swin_with_stochastic_depth,  # torchvision's StochasticDepth
    ],
    ids=["timm_drop_path", "torchvision_stochastic_depth"],
)
def test_mc_dropout_passes_draw_dropout_only_not_stochastic_depth(make):
    # Stochastic depth skips whole residual branches in training mode; it is not a dropout site, so at
    # method.dropout=0 every pass is the model itself, and with dropout the passes still differ.
    torch.manual_seed(0)
    model, x = make().eval(), torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
    off = sve.wrap(copy.deepcopy(model), "mc_dropout", ensemble_size=1, dropout=0.0, example_input=x[:1]).eval()
    with torch.no_grad():
        passes = off(x)
    assert passes.shape == (10, 2, 3)
    torch.testing.assert_close(passes, expected.expand_as(passes), atol=1e-5, rtol=1e-4)
    on = sve.wrap(model, "mc_dropout", ensemble_size=1, dropout=0.3, example_input=x[:1]).eval()
    with torch.no_grad():
        passes = on(x)
    assert not torch.allclose(passes[0], passes[1])


def test_unknown_options_and_methods_name_the_valid_choices():
    with pytest.raises(ValueError, match=r"method='sv' is not valid; choose one of \[.*'sve'"):
        sve.wrap(mlp(), "sv", example_input=torch.randn(1, 6))
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['sigma'\]; valid options are \[.*'sigma_init'"):
        sve.wrap(mlp(), "sve", example_input=torch.randn(1, 6), sigma=0.1)
    with pytest.raises(ValueError, match="pass example_input="):
        sve.wrap(mlp(), "sve")
    with pytest.raises(ValueError, match=r"head='fc' is not a module of Sequential; its linear layers are: 0, 2, 4"):
        sve.wrap(mlp(), "sve", head="fc", example_input=torch.randn(1, 6))
    with pytest.raises(ValueError, match="Sequential has no dropout site"):
        sve.wrap(mlp(), "mc_dropout", num_classes=3, example_input=torch.randn(1, 6))


@pytest.mark.parametrize(
    "key, value",
    [
        ("ensemble_size", 0),
        ("ensemble_size", -1),
        ("ensemble_size", 2.5),
        ("ensemble_size", True),
        ("ensemble_size", None),
        ("num_classes", 0),
        ("num_classes", "3"),
    ],
)
def test_bad_sizes_and_methods_are_named_before_the_model_is_probed(key, value):
    # No example_input: were the model probed first, its "pass example_input=" would hide the bad argument.
    with pytest.raises(ValueError, match=re.escape(f"{key}={value!r} is not valid; expected a positive integer")):
        sve.wrap(mlp(), "sve", **{key: value})
    with pytest.raises(ValueError, match=r"method='sv' is not valid"):
        sve.wrap(mlp(), "sv")
    numpy_size = sve.wrap(mlp(), "sve", ensemble_size=np.int64(2), example_input=torch.randn(1, 6))
    assert numpy_size(torch.randn(3, 6)).shape[0] == 2  # numpy's integers are integers


def test_a_model_with_no_adaptable_layer_names_its_layers_and_what_can_be_adapted():
    class Recurrent(nn.Module):
        def __init__(self):
            super().__init__()
            # a grouped convolution (4 groups) and a GRU: neither is a layer the methods adapt
            self.conv, self.rnn = nn.Conv1d(4, 8, 3, groups=4), nn.GRU(8, 16, batch_first=True)
            self.fc = nn.Linear(16, 5)

        def forward(self, x):
            out, _ = self.rnn(self.conv(x).transpose(1, 2))
            return self.fc(out[:, -1])

    with pytest.raises(
        ValueError,
        match=r"Recurrent has no layer the methods can adapt on the way to its features: "
        r"they adapt nn\.Linear .* its layers are conv \(Conv1d\), rnn \(GRU\)$",
    ):
        sve.wrap(Recurrent(), "sve", ensemble_size=2, example_input=torch.randn(2, 4, 10))
    # its only linear is the head, which fresh heads replace: nothing left (before: StopIteration, no message)
    with pytest.raises(ValueError, match=r"Sequential has no layer .* its only layer is its head '0'$"):
        sve.wrap(
            nn.Sequential(nn.Linear(8, 3)),
            "lora_ensemble",
            ensemble_size=2,
            num_classes=3,
            example_input=torch.randn(1, 8),
        )


def bart_with_layerdrop() -> tuple[nn.Module, dict]:
    from transformers import BartConfig, BartForSequenceClassification

    config = BartConfig(
        vocab_size=40,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
        num_labels=3,
        encoder_layerdrop=0.5,
        decoder_layerdrop=0.5,
        dropout=0.1,
    )
    ids = torch.tensor([[0, 7, 9, 11, 2], [0, 5, 6, 8, 2]])
    return BartForSequenceClassification(config), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def wav2vec2_with_spec_augment() -> tuple[nn.Module, dict]:
    from transformers import Wav2Vec2Config, Wav2Vec2ForSequenceClassification

    config = Wav2Vec2Config(
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        conv_dim=(8, 8),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=2,
        num_labels=3,
        layerdrop=0.5,
        mask_time_prob=0.5,
        mask_time_length=2,
        mask_feature_prob=0.5,
        mask_feature_length=2,
    )
    return Wav2Vec2ForSequenceClassification(config), {"input_values": torch.randn(2, 400)}


@pytest.mark.parametrize("make", [bart_with_layerdrop, wav2vec2_with_spec_augment], ids=["layerdrop", "spec_augment"])
def test_mc_dropout_passes_draw_no_layerdrop_or_spec_augment(make):
    # LayerDrop and SpecAugment act in training mode, like dropout, but are not dropout sites: at
    # method.dropout=0 every pass must be the model itself, and training gets them back as the config set them.
    torch.manual_seed(0)
    model, batch = make()
    model.eval()
    with torch.no_grad():
        expected = model(**batch).logits
    first = {k: v[:1] for k, v in batch.items()}
    ensemble = sve.wrap(model, "mc_dropout", ensemble_size=1, dropout=0.0, example_input=first).eval()
    with torch.no_grad():
        passes = ensemble(**batch)
    torch.testing.assert_close(passes, expected.expand_as(passes), atol=1e-5, rtol=1e-4)
    ensemble.train()
    keys = ("layerdrop", "encoder_layerdrop", "decoder_layerdrop", "apply_spec_augment")
    assert {k: getattr(model.config, k) for k in keys if hasattr(model.config, k)} == (
        {"encoder_layerdrop": 0.5, "decoder_layerdrop": 0.5}
        if "input_ids" in batch
        else {"layerdrop": 0.5, "apply_spec_augment": True}
    )
    assert {m.layerdrop for m in model.modules() if isinstance(getattr(m, "layerdrop", None), float)} <= {0.5}


def test_a_pad_id_inside_the_mask_is_named_because_the_model_reads_another_token(caplog):
    # GPT-2's classifier reads the last token that is not the pad id; pooling="last" the last one the mask keeps.
    from transformers import GPT2Config, GPT2ForSequenceClassification

    torch.manual_seed(0)
    model = GPT2ForSequenceClassification(
        GPT2Config(vocab_size=30, n_embd=16, n_layer=1, n_head=2, n_positions=16, num_labels=3, pad_token_id=0)
    ).eval()
    clean = {
        "input_ids": torch.tensor([[5, 6, 7, 8], [9, 10, 11, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
    }  # right padding with the pad id, which no text holds
    ending = {"input_ids": torch.tensor([[5, 6, 7, 0]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    for batch, warned in ((clean, False), (ending, True)):
        caplog.clear()
        with torch.no_grad(), caplog.at_level("WARNING", logger="sve.api.module_backbone"):
            expected = model(**batch).logits
            ensemble = sve.wrap(
                copy.deepcopy(model),
                "sve",
                ensemble_size=2,
                sigma_init=0.0,
                head="score",
                pooling="last",
                example_input=batch,
            ).eval()
            same = torch.allclose(ensemble(**batch), expected.expand(2, -1, -1), atol=1e-5)
        assert ("hold the pad id 0 at 1 position(s) the attention mask keeps" in caplog.text) is warned
        assert same is not warned  # the warning is said exactly where the ensemble and the model differ


# ----- inputs and models the library must refuse clearly, or handle -------------------------------------------------
def test_predict_names_the_rows_that_hold_nan_or_inf():
    # The members would give NaN for those rows, and the NaN predictive's label is class 0, without a word.
    x = torch.randn(5, 6)
    ensemble = sve.wrap(mlp(), "sve", ensemble_size=2, num_classes=3, example_input=x)
    bad = x.clone()
    bad[1, 3], bad[4, 0] = float("nan"), float("-inf")
    with pytest.raises(InputError, match=r"predict got NaN or inf values: input 0 in row\(s\) \[1, 4\]"):
        ensemble.predict(bad)
    loader = DataLoader(TensorDataset(torch.cat([x, bad])), batch_size=5)  # rows counted over the loader
    with pytest.raises(InputError, match=r"predicting got NaN or inf values: input 0 in row\(s\) \[6, 9\]"):
        ensemble.predict_loader(loader, progress=False)
    assert ensemble.predict(x).probs.isfinite().all()


def test_predict_names_an_input_of_another_shape_than_the_example():
    ensemble = sve.wrap(mlp(), "sve", ensemble_size=2, num_classes=3, example_input=torch.randn(5, 6))
    with pytest.raises(
        InputError,
        match=r"input 0 of shape \(5, 7\), where the example it was wrapped with has "
        r"\(1, 6\): 7 in dimension 1, not 6",
    ):
        ensemble.predict(torch.randn(5, 7))


def test_an_empty_batch_gives_an_empty_prediction():
    ensemble = sve.wrap(mlp(), "sve", ensemble_size=2, num_classes=3, example_input=torch.randn(5, 6))
    prediction = ensemble.predict(torch.randn(0, 6))
    assert prediction.probs.shape == (0, 3) and prediction.label.shape == (0,)
    assert ensemble(torch.randn(0, 6)).shape == (2, 0, 3)


def test_a_model_on_the_meta_device_is_refused_by_name():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))
    with pytest.raises(InputError, match=r"Sequential has tensors on the meta device \(e.g. 0.weight\)"):
        sve.wrap(model, "sve", ensemble_size=2, num_classes=3, example_input=torch.randn(2, 6))


def merged_member_logits(ensemble, member: int, *args) -> torch.Tensor:
    """Member ``member``'s logits from a copy of the backbone whose member layers are their plain merged layers."""
    backbone = copy.deepcopy(ensemble.method.backbone).eval()
    for name in ensemble.method.wrapped:
        parent, _, child = name.rpartition(".")
        owner = backbone.model.get_submodule(parent) if parent else backbone.model
        setattr(owner, child, getattr(owner, child).merge(member))
    assert not [m for m in backbone.modules() if isinstance(m, MemberLayer)]
    heads = ensemble.method.heads
    with torch.no_grad():
        return backbone(sve.api.module_backbone.to_batch(args, {})) @ heads.weight[member].T + heads.bias[member]


def test_sve_on_torchvision_vit_trains_in_member_chunks_and_its_members_are_their_merged_layers(caplog):
    # nn.MultiheadAttention reads out_proj.weight itself: no member-major stacking. The probe at build time finds
    # it, and the members run one at a time, said once; before, chunked training (members_at_once=2) refused.
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(
        image_size=32, patch_size=16, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32, num_classes=3
    )
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])
    with caplog.at_level("WARNING", logger="sve"):
        ensemble = sve.wrap(
            model, "sve", ensemble_size=3, num_classes=3, example_input=x[:1], sigma_init=0.1, members_at_once=2
        )
    assert [r.getMessage() for r in caplog.records if "one at a time" in r.getMessage()] == [
        next(r.getMessage() for r in caplog.records if "self_attention.out_proj" in r.getMessage())
    ]
    assert "encoder.layers.encoder_layer_0.self_attention.out_proj" in ensemble.method.wrapped
    method, before = ensemble.method, ensemble.method.state_dict()["backbone.model.conv_proj.singular_values"].clone()
    optimizer = torch.optim.AdamW(ensemble.parameter_groups(lr=1e-2))
    ensemble.train()
    for _ in range(3):  # as sve.training.module.chunked_step trains members_at_once=k: chunk by chunk
        for members in method.training_chunks():
            method.loss(method.chunk_logits({"_arg0": x, "labels": y}, members), y, ensemble_size=3).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert not torch.equal(before, method.state_dict()["backbone.model.conv_proj.singular_values"])
    prediction = ensemble.predict(x)
    assert prediction.probs.shape == (4, 3) and torch.allclose(prediction.probs.sum(1), torch.ones(4, dtype=float))
    ensemble.eval()
    with torch.no_grad():
        logits = ensemble(x)
    for k in range(3):
        torch.testing.assert_close(logits[k], merged_member_logits(ensemble, k, x), atol=2e-5, rtol=1e-4)
    assert not torch.allclose(logits[0], logits[1])


def test_a_time_major_layer_is_found_even_where_its_length_equals_the_member_rows(caplog):
    # XLNet's feed-forward sees (T, N, D). With 2 members of 3 examples, T = 6 equals the 6 member-major rows: the
    # layer's check on the leading dimension passed, and it split the time axis among the members, without a word.
    from transformers import XLNetConfig, XLNetForSequenceClassification

    torch.manual_seed(0)
    model = XLNetForSequenceClassification(
        XLNetConfig(vocab_size=40, d_model=16, n_layer=1, n_head=2, d_inner=32, num_labels=3)
    ).eval()
    ids = torch.randint(1, 40, (3, 6))
    with caplog.at_level("WARNING", logger="sve"):
        ensemble = sve.wrap(
            model, "sve", ensemble_size=2, num_classes=3, example_input={"input_ids": ids[:1]}, sigma_init=0.4
        ).eval()
    assert ensemble.method.fallback == "transformer.layer.0.ff.layer_1" and "one at a time" in caplog.text
    with torch.no_grad():
        logits = ensemble(input_ids=ids)  # the first call: T = 6 = 2 x 3 rows
        for k in range(2):  # member k alone, which no layout can mix
            torch.testing.assert_close(logits[k], ensemble.method.member_logits({"input_ids": ids}, [k])[0])
    assert not torch.allclose(logits[0], logits[1])
