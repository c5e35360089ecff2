"""Table 3's baselines as Yang et al. (2024) ran them, on LoRA: the LoRA dropout and its exact draws, MC dropout
on one LoRA adapter, and the deep ensemble of LoRA fine-tunes (its members, what it stores, its resume)."""

from __future__ import annotations

import pytest
import torch

from sve.layers import LoRALayer
from sve.layers.draws import seeded_draws
from sve.runs.run import instantiate, run
from tests.conftest import compose_cfg, method_on

TEXT = ["backbone=tiny_bert", "dataset=synthetic_text", "dataset.batch_size=4"]


def make(method: str, *overrides: str, ensemble_size: int = 3, seed: int = 0):
    """(method, a training batch), built from ``seed``."""
    cfg = compose_cfg([f"method={method}", f"ensemble_size={ensemble_size}", *TEXT, *overrides])
    torch.manual_seed(seed)
    backbone = instantiate(cfg.backbone)
    m, datamodule = method_on(cfg, backbone, ensemble_size)
    return m, next(iter(datamodule.train_dataloader()))


@torch.no_grad()
def move_adapters(m, seed: int = 3) -> None:
    """B is zero at init, where the LoRA path (and so its dropout) changes nothing: give it weight."""
    g = torch.Generator().manual_seed(seed)
    for layer in m.modules():
        if isinstance(layer, LoRALayer):
            layer.lora_B.add_(0.5 * torch.randn(layer.lora_B.shape, generator=g))


def without_backbone_dropout(m) -> None:
    """Only the LoRA dropout draws: BERT's own dropout sites off."""
    for module in m.backbone.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def test_lora_dropout_drops_the_low_rank_input_only_and_is_off_by_default():
    base = torch.nn.Linear(6, 5)
    assert LoRALayer(base).dropout == 0.0
    layer = LoRALayer(base, ensemble_size=1, rank=2, alpha=2.0, dropout=0.5)
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(4, 6)
    layer.eval()
    torch.testing.assert_close(layer(x), base(x) + x @ layer.lora_A[0].T @ layer.lora_B[0].T)
    layer.train()
    torch.manual_seed(0)
    dropped = layer(x)
    torch.manual_seed(0)
    mask = torch.nn.functional.dropout(torch.ones_like(x), 0.5)  # the one draw the layer makes
    torch.testing.assert_close(dropped, base(x) + (x * mask) @ layer.lora_A[0].T @ layer.lora_B[0].T)
    with pytest.raises(ValueError, match=r"LoRA dropout must be in \[0, 1\), got 1.0"):
        LoRALayer(base, dropout=1.0)


def test_lora_dropout_gives_each_example_its_mask_in_every_member_layout():
    # Exact draws (sve.layers.draws): rows k*B + j of the member-major batch get member k's mask for example j,
    # whether all members run at once, one member chunk at a time, or the batch is split into micro-batches.
    m, batch = make("lora_ensemble", "method.dropout=0.5")
    without_backbone_dropout(m)
    move_adapters(m)
    m.train()
    B, M = batch["labels"].shape[0], m.ensemble_size
    with torch.no_grad(), seeded_draws(11, (0, B), B):
        together = m(batch)
    with torch.no_grad():
        chunks = []
        for members in ([0], [1, 2]):
            with seeded_draws(11, (0, B), B, (members, M)):
                chunks.append(m.chunk_logits(batch, members))
        halves = []
        for rows in (slice(0, 1), slice(1, B)):
            part = {k: v[rows] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            with seeded_draws(11, (rows.start, B), rows.stop - rows.start):
                halves.append(m(part))
    torch.testing.assert_close(torch.cat(chunks), together, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(torch.cat(halves, dim=1), together, rtol=1e-6, atol=1e-6)
    m.eval()  # dropout off: the draws did change the output
    with torch.no_grad():
        assert not torch.allclose(m(batch), together, atol=1e-4)


def test_mc_dropout_lora_trains_as_single_lora_and_its_passes_differ_at_evaluation():
    mc, batch = make("mc_dropout_lora", ensemble_size=1)
    single, _ = make("single_lora_yang", ensemble_size=1)
    assert (mc.rank, mc.alpha, mc.dropout, mc.num_samples, mc.lr) == (8, 16.0, 0.1, 10, 5e-5)
    assert sorted(mc.state_dict()) == sorted(single.state_dict())
    move_adapters(mc), move_adapters(single)
    B = batch["labels"].shape[0]
    grads = []
    for m in (mc, single):  # training: one member, the backbone's and the LoRA dropout on, the same draws
        m.train()
        with seeded_draws(5, (0, B), B):
            logits = m(batch)
        assert logits.shape[0] == 1
        m.loss(logits, batch["labels"]).backward()
        grads.append({n: p.grad for n, p in m.named_parameters() if p.requires_grad})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], rtol=0, atol=0)
    mc.eval()
    assert not mc.backbone.training and all(layer.training for layer in mc.lora_layers())
    with torch.no_grad():
        passes = mc(batch)
    assert passes.shape[0] == 10 and not torch.allclose(passes[0], passes[1], atol=1e-4)
    for layer in mc.lora_layers():  # without the LoRA dropout every pass is the same: the backbone's is off
        layer.dropout = 0.0
    with torch.no_grad():
        plain = mc(batch)
    torch.testing.assert_close(plain, plain[:1].expand_as(plain))


def train_round(m, batch, steps: int = 3) -> bool:
    """One round with a fresh AdamW with weight decay (as each fit of run() has); then ``next_round``."""
    m.train()
    optimizer = torch.optim.AdamW(m.trainable_parameters(), lr=1e-2, weight_decay=0.5)
    for _ in range(steps):
        optimizer.zero_grad()
        m.loss(m(batch), batch["labels"]).backward()
        optimizer.step()
    return m.next_round()


def test_lora_deep_ensemble_members_are_runs_of_their_own_stored_as_adapters():
    m, batch = make("deep_ensemble_lora")
    assert (m.mode, m.chunk_size, m.rounds) == ("sequential", 1, 3) and not hasattr(m, "members")
    assert not any(p.requires_grad for n, p in m.backbone.named_parameters() if ".lora_" not in n)
    layer = m.lora_layers()[0]
    drawn_at_construction = layer.lora_A[1].detach().clone()
    assert train_round(m, batch)
    # Round 1's member is drawn afresh from the round's seed: a new A, B = 0 (the base layer).
    assert not torch.equal(layer.lora_A[1], drawn_at_construction) and not layer.lora_B[1].any()
    first = {n: t.clone() for n, t in m.store[0].items()}
    while train_round(m, batch):
        pass
    # The store holds adapters and heads only: one member's rows of the trainable tensors, never backbone weights.
    frozen = sum(p.numel() for p in m.backbone.parameters() if not p.requires_grad)
    per_member = sum(t.numel() for t in first.values())
    assert set(first) == {n for n, p in m.named_parameters() if p.requires_grad}
    assert per_member * m.ensemble_size == sum(p.numel() for p in m.trainable_parameters())
    assert 4 * per_member < frozen  # tiny BERT's own (hidden size 32); on a 7B backbone about 0.1%
    # Weight decay moved member 0's rows while members 1 and 2 trained: they are back as member 0 finished.
    for name, p in m.trained().items():
        torch.testing.assert_close(m.store[0][name], first[name], rtol=0, atol=0)
        for member in range(m.ensemble_size):
            assert torch.equal(p[member].detach(), m.store[member][name]), (name, member)
    m.eval()
    with torch.no_grad():
        out = m(batch)
    assert out.shape[0] == 3 and not torch.allclose(out[0], out[1], atol=1e-4)
    assert not torch.allclose(out[1], out[2], atol=1e-4)


def test_lora_deep_ensemble_from_a_pretrained_head_starts_each_member_from_it(monkeypatch):
    from sve.backbones.hf import HFBackbone

    def head(self, task, num_classes):
        g = torch.Generator().manual_seed(0)
        return torch.randn(num_classes, self.feature_dim, generator=g), torch.zeros(num_classes)

    monkeypatch.setattr(HFBackbone, "initial_head", head)
    m, batch = make("deep_ensemble_lora", ensemble_size=2)
    assert m.head_pretrained and m.mode == "sequential"
    pretrained = head(m.backbone, None, 2)[0]
    assert train_round(m, batch, steps=1)  # member 0 trained its head; member 1 starts from the pretrained one
    assert torch.equal(m.heads.weight[1], pretrained) and not torch.equal(m.heads.weight[0], pretrained)


def test_lora_deep_ensemble_resumes_its_round_after_a_crash(tmp_path):
    # The rounds and the stored members live in the checkpoint: the resumed run ends as the uninterrupted one.
    overrides = [
        "backbone=tiny_vit",
        "dataset=synthetic_image",
        "method=deep_ensemble_lora",
        "ensemble_size=2",
        "trainer=cpu",
        "trainer.max_epochs=2",
        "callbacks=default",
        "callbacks.checkpoint.every_n_steps=1",
        "dataset.num_train=16",
        "dataset.num_val=8",
        "dataset.num_test=8",
        "dataset.batch_size=8",
    ]
    whole = run(compose_cfg(overrides, tmp_path / "whole"))
    crash = [
        "+callbacks.crash._target_=tests.helpers.Crash",
        "+callbacks.crash.after_batches=5",  # round 2
        f"+callbacks.crash.marker={tmp_path / 'crashed'}",
    ]
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(compose_cfg([*overrides, *crash], tmp_path / "crashed_run"))
    resumed = run(compose_cfg([*overrides, *crash], tmp_path / "crashed_run"))  # the marker: no second crash
    assert resumed["resumed_from"] is not None
    assert resumed["method_report"]["rounds"] == 2 and resumed["num_members"] == whole["num_members"] == 2
    drop = lambda r: {k: v for k, v in r["metrics"].items() if k != "test/seconds"}  # noqa: E731
    assert drop(resumed) == drop(whole)


def test_lora_options_refuse_bad_values_naming_them():
    with pytest.raises(Exception, match=r"method.dropout=1.5 is not valid"):
        make("deep_ensemble_lora", "method.dropout=1.5")
    with pytest.raises(Exception, match=r"method.num_samples=0 is not valid"):
        make("mc_dropout_lora", "method.num_samples=0", ensemble_size=1)
    with pytest.raises(Exception, match=r"method.dropout=-0.1 is not valid"):
        make("single_lora", "method.dropout=-0.1", ensemble_size=1)


def test_lora_init_scale_scales_each_members_a_draw_and_keeps_the_base_at_init():
    base = torch.nn.Linear(6, 5)
    torch.manual_seed(3)
    plain = LoRALayer(base, ensemble_size=3, rank=2)
    torch.manual_seed(3)
    wide = LoRALayer(base, ensemble_size=3, rank=2, init_scale=3.0)
    torch.testing.assert_close(wide.lora_A, 3.0 * plain.lora_A, rtol=0, atol=1e-7)  # the same draws, 3x apart
    assert not wide.lora_B.any()  # B = 0: every member is still the base layer
    x = torch.randn(3 * 4, 6)  # member-major (M*B, in)
    torch.testing.assert_close(wide(x), base(x))
    with pytest.raises(Exception, match=r"init_scale must be a positive number, got 0"):
        LoRALayer(base, ensemble_size=2, init_scale=0)
    with pytest.raises(Exception, match=r"method.init_scale=-1.0 is not valid"):
        make("lora_ensemble", "method.init_scale=-1.0")
