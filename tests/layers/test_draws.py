"""Training draws that do not depend on the device layout (sve.layers.draws): a micro-batch's dropout masks are its
rows of the global batch's, and training with accumulation equals training without it."""

from __future__ import annotations

import tempfile

import pytest
import torch
from torch import nn

from sve.layers.draws import rows_to_draw, seeded_draws, unfuse_attention_dropout
from sve.runs.run import build, run
from tests.conftest import compose_cfg


def test_a_micro_batch_gets_its_rows_of_the_global_batch_mask():
    x = torch.randn(8, 5, 3)
    drop = nn.Dropout(0.3).train()
    with seeded_draws(123, (0, 8), 8):
        whole = drop(x)
    with seeded_draws(123, (0, 8), 5):
        first = drop(x[:5])
    with seeded_draws(123, (5, 8), 3):
        second = drop(x[5:])
    assert torch.equal(whole, torch.cat([first, second]))
    torch.manual_seed(123)  # on the CPU the global-batch mask is exactly F.dropout's
    assert torch.equal(whole, nn.functional.dropout(x, 0.3, True))
    # Members stacked member-major (K copies of the micro-batch): member k's rows are its rows of the global mask.
    stacked = torch.cat([x, x + 1])  # K = 2 members of 8 examples
    with seeded_draws(7, (0, 8), 8):
        both = drop(stacked)
    with seeded_draws(7, (5, 8), 3):
        part = drop(torch.cat([x[5:], x[5:] + 1]))
    assert torch.equal(part, torch.cat([both[5:8], both[13:16]]))
    assert nn.functional.dropout is torch.nn.functional.dropout  # restored after the context


def test_a_draw_that_is_not_batch_first_falls_back_with_a_warning():
    with seeded_draws(0, (0, 8), 8), pytest.warns(UserWarning, match=r"not batch-first.*drawn per process"):
        nn.Dropout(0.5).train()(torch.randn(3, 4))
    assert rows_to_draw(4) == (4, slice(None))  # outside the context: this micro-batch only
    with seeded_draws(0, (4, 10), 4):
        assert rows_to_draw(4) == (10, slice(4, 8))


def test_training_with_accumulation_equals_training_without_it():
    overrides = [
        "backbone=tiny_vit",
        "trainer=cpu",
        "trainer.max_epochs=1",
        "dataset.num_train=16",
        "dataset.num_val=8",
        "dataset.num_test=8",
        "method=mc_dropout",
        "callbacks=default",
    ]

    def trained(*extra: str) -> dict:
        out = tempfile.mkdtemp()
        run(compose_cfg([*overrides, *extra], out))
        state = torch.load(f"{out}/checkpoints/final.ckpt", weights_only=True)["state_dict"]
        return {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}

    one, two = trained(), trained("trainer.accumulate_grad_batches=2")
    for name, tensor in one.items():  # the same masks per example: equal up to the order of float sums
        torch.testing.assert_close(two[name], tensor, rtol=1e-5, atol=1e-6)
    # Drawn per micro-batch instead, the masks (and so the training) differ.
    plain = trained("trainer.accumulate_grad_batches=2", "exact_draws=false")
    assert max(float((plain[k] - one[k]).abs().max()) for k in one) > 1e-4


@pytest.mark.parametrize("backbone", ["tiny_vit", "tiny_bert"])
def test_attention_with_dropout_runs_unfused(backbone):
    dataset = "synthetic_image" if backbone == "tiny_vit" else "synthetic_text"
    overrides = [f"backbone={backbone}", f"dataset={dataset}", "method=mc_dropout"]

    def unfused(model) -> bool:
        if backbone == "tiny_vit":
            return not any(getattr(m, "fused_attn", False) for m in model.modules())
        return model.config._attn_implementation == "eager"

    # Without exact draws the backbone keeps its fused attention; unfusing it says what it changed.
    _, _, method, _ = build(compose_cfg([*overrides, "exact_draws=false"]))
    assert not unfused(method.backbone.model)
    assert unfuse_attention_dropout(method.backbone) and unfused(method.backbone.model)
    assert unfuse_attention_dropout(method.backbone) == []  # nothing left to change
    # With them (the default) the model is unfused as it is built, before any fit: evaluate.py's model too.
    _, _, method, _ = build(compose_cfg(overrides))
    assert unfused(method.backbone.model)
