"""Member-free layers that read the batch compute once per batch when members run one per pass
(sve/layers/shared_inputs.py): same logits as computing them in every pass, fewer calls, never when stochastic."""

import pytest
import torch
from torch import nn

from sve.layers.shared_inputs import member_free_modules, share_inputs
from sve.runs.run import instantiate
from tests.conftest import compose_cfg


def method(overrides: list[str]):
    cfg = compose_cfg(overrides)
    torch.manual_seed(0)
    backbone = instantiate(cfg.backbone)
    return instantiate(cfg.method, backbone=backbone, ensemble_size=3, num_classes=4).eval()


def batch_for(m, modality: str) -> dict:
    g = torch.Generator().manual_seed(1)
    if modality == "image":
        return {"pixel_values": torch.randn(5, 3, 32, 32, generator=g), "labels": torch.zeros(5, dtype=torch.long)}
    ids = torch.randint(1, 100, (5, 12), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.zeros(5, dtype=torch.long)}


def count_calls(module: nn.Module) -> list:
    """Calls of ``module`` that compute (a hook on a module inside the shared one: the shared module's own
    hooks fire on every call, the cached ones included)."""
    calls = []
    module.register_forward_hook(lambda *_: calls.append(1))
    return calls


CASES = [
    (
        ["backbone=tiny_vit", "dataset=synthetic_image", "method=sve", "method.sigma_init=0.1"],
        "image",
        lambda m: m.backbone.model.patch_embed.proj,
    ),
    (
        ["backbone=tiny_bert", "dataset=synthetic_text", "method=sve", "method.sigma_init=0.1"],
        "text",
        lambda m: m.backbone.model.embeddings.word_embeddings,
    ),
    (
        ["backbone=tiny_vit", "dataset=synthetic_image", "method=lora_ensemble"],
        "image",
        lambda m: m.backbone.model.patch_embed.proj,
    ),
]


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
@pytest.mark.parametrize("overrides, modality, stem", CASES)
def test_one_member_per_pass_runs_the_stem_once_with_the_same_logits(overrides, modality, stem, context):
    m = method(overrides)
    batch = batch_for(m, modality)
    calls = count_calls(stem(m))
    with context():
        m.members_at_once = None  # all members in one pass
        reference = m(batch)
        calls.clear()
        m.members_at_once = 1
        shared = m(batch)
    assert len(calls) == 1  # not once per member
    torch.testing.assert_close(shared, reference, rtol=1e-5, atol=1e-5)
    assert not any("forward" in mod.__dict__ for mod in m.modules())  # every wrapper removed


def test_nothing_is_shared_in_training_with_autograd_or_for_stochastic_layers():
    m = method(CASES[0][0])
    batch = batch_for(m, "image")
    m.members_at_once = 1
    calls = count_calls(m.backbone.model.patch_embed.proj)
    m(batch)  # eval mode, autograd on
    assert len(calls) == 3
    calls.clear()
    with torch.no_grad():
        m.backbone.model.patch_embed.proj.train()  # e.g. MC dropout keeps layers training in evaluation
        m(batch)
    assert len(calls) == 3


def test_other_weights_loaded_into_a_module_compute_afresh_and_in_place_writes_stay_in_their_pass():
    class Backbone(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.bump = nn.Linear(4, 4), 0

        def forward(self, batch):
            out = self.stem(batch["x"])
            self.bump += 1.0
            with torch.no_grad():
                self.stem.weight.add_(self.bump)  # a member's own weights loaded into the shared module
            return out

    net = Backbone().eval()
    batch = {"x": torch.randn(2, 4)}
    with torch.no_grad():
        expected = []
        clone = Backbone().eval()
        clone.load_state_dict(net.state_dict())
        expected = [clone(batch) for _ in range(3)]
        with share_inputs(net, batch):
            got = [net(batch) for _ in range(3)]
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)

    stem = nn.Linear(4, 4).eval()
    root = nn.Sequential(stem)
    for context in (torch.no_grad, torch.inference_mode):  # Lightning evaluates in inference mode
        with context(), share_inputs(root, batch):
            first = stem(batch["x"])
            first.mul_(0)  # a later layer of the first pass writes into its output
            second = stem(batch["x"])
            torch.testing.assert_close(second, nn.functional.linear(batch["x"], stem.weight, stem.bias))


def test_member_free_modules_are_the_outermost_without_member_layers():
    m = method(CASES[0][0])
    found = member_free_modules(m.backbone)
    assert m.backbone.model.patch_embed in found and m.backbone.model.blocks not in found
    assert all(not any(type(x).__name__.startswith("SV") for x in f.modules()) for f in found)


def test_the_flops_saved_are_the_stem_of_the_members_after_the_first(monkeypatch):
    from contextlib import nullcontext

    from torch.utils.flop_counter import FlopCounterMode

    import sve.methods.base as base

    m = method(CASES[0][0])
    m.members_at_once = 1
    batch = batch_for(m, "image")

    def flops(fn) -> int:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            fn()
        return counter.get_total_flops()

    flops(lambda: m(batch))  # merges and caches the members' weights
    shared = flops(lambda: m(batch))
    monkeypatch.setattr(base, "share_inputs", lambda *args: nullcontext())
    repeated = flops(lambda: m(batch))  # every pass through the stem again
    stem = flops(lambda: m.backbone.model.patch_embed(batch["pixel_values"]))
    assert stem > 0 and repeated - shared == (m.ensemble_size - 1) * stem
