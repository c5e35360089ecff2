"""``sve.wrap`` on a headless Hugging Face encoder (``BertModel``: its output is an object with
``last_hidden_state``, no ``logits``): ``head=None, pooling=...`` reads ``last_hidden_state`` and pools it over
the attention mask, so the features are the encoder's own hidden states, pooled."""

import copy

import pytest
import torch
from transformers import BertConfig, BertModel

import sve

torch.set_num_threads(1)


def tiny_encoder() -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    return BertModel(config).eval()


def test_pooling_reads_the_last_hidden_state_of_a_headless_encoder():
    model = tiny_encoder()
    original = copy.deepcopy(model)
    ids = torch.randint(1, 40, (3, 7))
    mask = torch.ones_like(ids)
    mask[0, 4:] = 0  # padding: the mean is over the tokens the mask keeps
    ensemble = sve.wrap(model, "sve", ensemble_size=2, head=None, pooling="mean", num_classes=2, sigma_init=0.0)
    with torch.no_grad():
        logits = ensemble(input_ids=ids, attention_mask=mask)  # (M, B, C)
        hidden = original(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, T, D)
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)  # (B, D)
        heads = ensemble.method.heads
        expected = torch.einsum("bd,mcd->mbc", pooled, heads.weight) + heads.bias[:, None]
    assert logits.shape == (2, 3, 2)
    # Zero init noise: every adapted layer computes the model's own weights (up to the float32 SVD), so each
    # member's logits are its head on the encoder's mean-pooled hidden states.
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    # The pooler's dense layer does not reach last_hidden_state: it is not adapted.
    assert not any("pooler" in pattern for pattern in ensemble.method.backbone.target_modules)


def test_a_headless_encoder_without_pooling_is_told_to_give_one():
    with pytest.raises(ValueError, match=r"not \(N, D\) features; give pooling="):
        sve.wrap(tiny_encoder(), "sve", ensemble_size=2, head=None, num_classes=2)
