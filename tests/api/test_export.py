"""``Ensemble.merge``: member k as a plain model of the user's class gives member k's logits, for SVE and
LoRA-Ensemble (and BatchEnsemble, SVF) on a tiny MLP, a tiny CNN and a tiny BERT classifier; ``mean=True`` is
the model whose weights are the members' mean, rebuilt here from the factors themselves (U diag(mean s) V^T,
W_0 + mean B A); methods without weights per member are refused by name."""

import copy

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertForSequenceClassification

import sve
from sve.errors import InputError
from sve.layers.member import MemberLayer

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:SVE. the head is pretrained")


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 12), nn.Tanh(), nn.Linear(12, 3))


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(6, 3),
    )


def bert() -> nn.Module:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=3,
    )
    return BertForSequenceClassification(config).eval()


def trained(model: nn.Module, method: str, x, **options):
    """A few steps at a high rate, so every member's weights, biases and head leave their start."""
    ensemble = sve.wrap(model, method, ensemble_size=3, example_input=x, **options)
    optimizer = torch.optim.AdamW(ensemble.parameter_groups(lr=0.05))
    batch = x if isinstance(x, dict) else {"_arg0": x}
    y = torch.tensor([0, 1, 2, 0])
    for _ in range(4):
        loss = ensemble.loss(ensemble(batch), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return ensemble.eval()


def logits(model, x):
    with torch.no_grad():
        out = model(**x) if isinstance(x, dict) else model(x)
    return getattr(out, "logits", out)


CASES = {
    "sve-mlp": (mlp, "sve", lambda: torch.randn(4, 6)),
    "lora_ensemble-mlp": (mlp, "lora_ensemble", lambda: torch.randn(4, 6)),
    "sve-cnn": (cnn, "sve", lambda: torch.randn(4, 3, 8, 8)),
    "lora_ensemble-cnn": (cnn, "lora_ensemble", lambda: torch.randn(4, 3, 8, 8)),
    "batch_ensemble-mlp": (mlp, "batch_ensemble", lambda: torch.randn(4, 6)),
    "sve-bert": (bert, "sve", lambda: {"input_ids": torch.randint(1, 40, (4, 7)), "attention_mask": torch.ones(4, 7)}),
    "lora_ensemble-bert": (
        bert,
        "lora_ensemble",
        lambda: {"input_ids": torch.randint(1, 40, (4, 7)), "attention_mask": torch.ones(4, 7, dtype=torch.long)},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_merged_member_computes_that_members_logits(case):
    build, method, inputs = CASES[case]
    torch.manual_seed(1)
    x = inputs()
    noise = {"sve": {"sigma_init": 0.1}, "batch_ensemble": {"init_std": 0.1}}.get(method, {})  # members differ
    ensemble = trained(build(), method, x, **noise)
    with torch.no_grad():
        members = ensemble(x if isinstance(x, dict) else {"_arg0": x})
    for k in range(3):
        plain = ensemble.merge(member=k)
        assert type(plain) is type(build()) and not [m for m in plain.modules() if isinstance(m, MemberLayer)]
        assert all(p.requires_grad for p in plain.parameters())
        torch.testing.assert_close(logits(plain.eval(), x), members[k], atol=2e-5, rtol=1e-5)
    assert not torch.allclose(members[0], members[1], atol=1e-3)  # the members differ: each export is its own
    assert isinstance(ensemble.method.backbone.model, type(build()))  # the wrapped model is left as it was
    assert [m for m in ensemble.method.backbone.model.modules() if isinstance(m, MemberLayer)]


def test_the_mean_merge_is_the_model_of_the_mean_weights():
    x = torch.randn(4, 6)
    for method in ("sve", "lora_ensemble"):
        ensemble = trained(mlp(), method, x, **({"sigma_init": 0.1} if method == "sve" else {}))
        expected = mlp()  # the same base weights: rebuilt by hand from the member layers' own factors
        with torch.no_grad():
            for index in (0, 2):
                layer = ensemble.method.backbone.model[index]
                if method == "sve":
                    weight = layer.U @ torch.diag(layer.singular_values.mean(0)) @ layer.Vh
                    expected[index].bias.copy_(layer.biases.mean(0))
                else:
                    update = torch.stack([B @ A for A, B in zip(layer.lora_A, layer.lora_B)]).mean(0)
                    weight = expected[index].weight + layer.scaling * update
                expected[index].weight.copy_(weight)
            heads = ensemble.method.heads
            expected[4].weight.copy_(heads.weight.mean(0))
            expected[4].bias.copy_(heads.bias.mean(0))
        mean = ensemble.merge(mean=True).eval()
        torch.testing.assert_close(logits(mean, x), logits(expected, x), atol=2e-5, rtol=1e-5)
        # One network, not the ensemble: its softmax is not the predictive (the mean of the members' softmax).
        assert not torch.allclose(logits(mean, x).softmax(-1).double(), ensemble.predict(x).probs, atol=1e-4)


def test_merge_refuses_what_has_no_weights_per_member():
    x = torch.randn(4, 6)
    with pytest.raises(InputError, match="method='mc_dropout' cannot be merged.*samples"):
        dropout = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Dropout(0.1), nn.Linear(12, 3))
        sve.wrap(dropout, "mc_dropout", ensemble_size=1, example_input=x).merge(member=0)
    with pytest.raises(InputError, match="method='deep_ensemble' cannot be merged.*whole copies"):
        sve.wrap(mlp(), "deep_ensemble", ensemble_size=2, num_classes=3, example_input=x).merge(member=0)
    ensemble = sve.wrap(mlp(), "sve", ensemble_size=2, example_input=x)
    for bad in ({}, {"member": 0, "mean": True}):
        with pytest.raises(InputError, match="one of member=k"):
            ensemble.merge(**bad)
    with pytest.raises(InputError, match="member=2 is not one of the 2 members"):
        ensemble.merge(member=2)
    features = sve.wrap(copy.deepcopy(mlp()), "sve", ensemble_size=2, num_classes=3, head=None, example_input=x)
    with pytest.raises(InputError, match="no head of its own"):
        features.merge(member=0)
