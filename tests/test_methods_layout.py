"""Every baseline x every backbone family: member layout, backward, which parameters train, and the trainable
count against a closed form from the wrapped layers' shapes."""

from __future__ import annotations

import pytest
import torch

from sve.layers import BatchEnsembleLayer, BLoBLayer, LoRALayer
from sve.run import build
from tests.conftest import compose_cfg

BASELINES = [
    "single_lora", "lora_ensemble", "mc_dropout", "deep_ensemble", "batch_ensemble", "bayes_lora_llla",
    "bayes_lora_la", "blob", "last_layer_ensemble", "checkpoint_ensemble",
]
FAMILIES = {"tiny_vit": "synthetic_image", "tiny_bert": "synthetic_text", "tiny_llama": "synthetic_text"}
M = 3
# Members at training / evaluation time before after_fit (stochastic methods evaluate num_samples passes).
TRAIN_MEMBERS = {"single_lora": 1, "mc_dropout": 1, "bayes_lora_llla": 1, "bayes_lora_la": 1, "blob": 1,
                 "checkpoint_ensemble": 1}
EVAL_MEMBERS = {**TRAIN_MEMBERS, "mc_dropout": 10, "blob": 10}


def make(method: str, backbone: str):
    cfg = compose_cfg([f"method={method}", f"backbone={backbone}", f"dataset={FAMILIES[backbone]}",
                       f"ensemble_size={M}", "dataset.batch_size=4"])
    _, datamodule, method_, _ = build(cfg)
    datamodule.setup()
    return method_, next(iter(datamodule.train_dataloader()))


@pytest.mark.parametrize("backbone", list(FAMILIES))
@pytest.mark.parametrize("method", BASELINES)
def test_layout_backward_and_only_trainable_parameters_change(method, backbone):
    m, batch = make(method, backbone)
    B, C = batch["labels"].shape[0], m.num_classes
    m.train()
    logits = m(batch)
    assert logits.shape == (TRAIN_MEMBERS.get(method, M), B, C)
    loss = m.loss(logits, batch["labels"])
    assert torch.isfinite(loss)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    opt = torch.optim.SGD(m.trainable_parameters(), lr=0.1)
    loss.backward()
    opt.step()
    changed = {n for n, p in m.named_parameters() if not torch.equal(p, before[n])}
    assert changed, "one step changed nothing"
    assert changed <= trainable, f"frozen parameters changed: {sorted(changed - trainable)[:5]}"
    m.eval()
    with torch.no_grad():
        out = m(batch)
    assert out.shape == (EVAL_MEMBERS.get(method, M), B, C)
    assert torch.isfinite(out).all()
    assert m.parameter_counts()["trainable"] == expected_trainable(method, m)


def _heads(m) -> int:
    return m.heads.weight.numel() + m.heads.bias.numel()


def _targets(m, kind):
    return [x for x in m.backbone.modules() if isinstance(x, kind)]


def expected_trainable(method: str, m) -> int:
    """Closed-form trainable counts from the wrapped layers' shapes (Table 5's quantities)."""
    lora = sum(l.ensemble_size * l.rank * (l.in_features + l.out_features) for l in _targets(m, LoRALayer))
    if method in ("single_lora", "lora_ensemble", "last_layer_ensemble", "checkpoint_ensemble",
                  "bayes_lora_llla", "bayes_lora_la"):
        return lora + _heads(m)
    if method == "blob":  # mean and G of A, and B
        return sum(l.rank * (2 * l.in_features + l.out_features) for l in _targets(m, BLoBLayer)) + _heads(m)
    if method == "mc_dropout":
        return m.base_parameter_count + _heads(m)
    if method == "deep_ensemble":
        return m.ensemble_size * m.base_parameter_count + _heads(m)
    if method == "batch_ensemble":
        layers = _targets(m, BatchEnsembleLayer)
        biased = [l for l in layers if l.bias is not None]  # LLaMA's linears have no bias
        fast = sum(l.ensemble_size * (l.in_features + l.out_features) for l in layers)  # r, s
        fast += sum(l.ensemble_size * l.out_features for l in biased)  # member biases
        moved_biases = sum(l.out_features for l in biased)  # pretrained biases became member biases
        return m.base_parameter_count - moved_biases + fast + _heads(m)
    raise KeyError(method)


def test_closed_form_lora_count_for_tiny_bert_by_hand():
    """Independent of the layer attributes: tiny BERT has 2 layers x (4 of 32x32, 32->64, 64->32)."""
    m, _ = make("lora_ensemble", "tiny_bert")
    per_layer = 4 * 8 * (32 + 32) + 8 * (32 + 64) + 8 * (64 + 32)
    assert m.parameter_counts()["trainable"] == M * 2 * per_layer + M * (2 * 32 + 2)
