"""Facts about the baselines: equivalence at init, exact layer algebra, stochastic passes, deep-ensemble modes,
Laplace and BLoB posteriors, checkpoint members."""

from __future__ import annotations

import copy

import pytest
import torch
from hydra.errors import InstantiationException
from torch import nn

from sve.layers import BatchEnsembleLayer, BLoBLayer, LoRALayer
from sve.members import predictive, repeat_batch, split_members
from sve.runs.run import instantiate
from tests.conftest import compose_cfg, method_on

TEXT = ["backbone=tiny_bert", "dataset=synthetic_text", "dataset.batch_size=4"]


def make(method: str, *overrides: str, reference: bool = False):
    """(method, a batch, a frozen copy of the unwrapped backbone if asked)."""
    cfg = compose_cfg([f"method={method}", "ensemble_size=3", *TEXT, *overrides])
    backbone = instantiate(cfg.backbone)
    ref = copy.deepcopy(backbone).eval() if reference else None
    m, datamodule = method_on(cfg, backbone, 3)
    return m, next(iter(datamodule.train_dataloader())), ref, datamodule


@pytest.mark.parametrize("method", ["batch_ensemble", "lora_ensemble", "single_lora"])
def test_every_member_equals_the_base_model_at_init(method):
    m, batch, ref, _ = make(method, reference=True)
    m.eval()
    M = m.ensemble_size
    with torch.no_grad():
        members = split_members(m.backbone(repeat_batch(batch, M)), M)  # (M, B, D)
        base = ref(batch)
    for features in members:
        torch.testing.assert_close(features, base, atol=1e-5, rtol=1e-5)


def test_lora_merge_equals_unmerged_and_update_is_scaled_BA():
    torch.manual_seed(1)
    base = nn.Linear(6, 5)
    layer = LoRALayer(base, ensemble_size=2, rank=3, alpha=6.0)
    nn.init.normal_(layer.lora_B)
    x = torch.randn(2 * 4, 6)
    y = split_members(layer(x), 2)
    for m in range(2):
        torch.testing.assert_close(y[m], layer.merge(m)(x[4 * m : 4 * m + 4]))
        W = base.weight + 2.0 * layer.lora_B[m] @ layer.lora_A[m]  # alpha / r = 2
        torch.testing.assert_close(layer.member_weight(m), W)


def test_lora_and_batch_ensemble_on_conv2d_read_the_kernel_as_a_matrix():
    torch.manual_seed(2)
    conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)
    x = torch.randn(2 * 2, 3, 9, 9)
    lora = LoRALayer(conv, ensemble_size=2, rank=2)
    torch.testing.assert_close(lora(x), conv(x))  # B = 0: the base layer at init
    nn.init.normal_(lora.lora_B)
    y = split_members(lora(x), 2)
    for m in range(2):
        torch.testing.assert_close(y[m], lora.merge(m)(x[2 * m : 2 * m + 2]), atol=1e-5, rtol=1e-5)
    be = BatchEnsembleLayer(copy.deepcopy(conv), ensemble_size=2)
    torch.testing.assert_close(be(x), conv(x))  # r = s = 1, member bias = pretrained bias
    nn.init.normal_(be.r), nn.init.normal_(be.s)
    y = split_members(be(x), 2)
    for m in range(2):
        kernel = be.member_weight(m).reshape_as(conv.weight)
        expected = nn.functional.conv2d(x[2 * m : 2 * m + 2], kernel, be.biases[m], stride=2, padding=1)
        torch.testing.assert_close(y[m], expected, atol=1e-5, rtol=1e-5)


def test_batch_ensemble_linear_is_rank_one_modulation():
    torch.manual_seed(3)
    base = nn.Linear(5, 4)
    layer = BatchEnsembleLayer(copy.deepcopy(base), ensemble_size=3)
    nn.init.normal_(layer.r), nn.init.normal_(layer.s)
    x = torch.randn(3 * 2, 5)
    y = split_members(layer(x), 3)
    for m in range(3):
        W = base.weight * torch.outer(layer.s[m], layer.r[m])
        torch.testing.assert_close(y[m], x[2 * m : 2 * m + 2] @ W.T + layer.biases[m])


def test_mc_dropout_passes_differ_in_eval_and_agree_without_dropout():
    m, batch, _, _ = make("mc_dropout")
    m.eval()
    with torch.no_grad():
        out = m(batch)
    assert out.shape[0] == 10
    assert not torch.allclose(out[0], out[1])
    off, batch, _, _ = make("mc_dropout", "method.dropout=0.0")
    off.eval()
    with torch.no_grad():
        out = off(batch)
    torch.testing.assert_close(out, out[:1].expand_as(out))


def _train(m, batches, steps_per_round: int = 2):
    """Each round: a fresh AdamW over the trainable parameters, the same batches (what run() does per fit)."""
    while True:
        m.train()
        opt = torch.optim.AdamW(m.trainable_parameters(), lr=1e-3, eps=1e-12)
        for batch in batches[:steps_per_round]:
            opt.zero_grad()
            m.loss(m(batch), batch["labels"]).backward()
            opt.step()
        if not m.next_round():
            return m.eval()


def test_deep_ensemble_members_share_no_tensor_and_differ_after_training():
    m, batch, _, dm = make("deep_ensemble", "method.mode=in_memory")
    ptrs = [{p.data_ptr() for p in member.parameters()} for member in m.members]
    assert len(m.members) == 3
    assert all(not (ptrs[i] & ptrs[j]) for i in range(3) for j in range(i + 1, 3))
    _train(m, list(dm.train_dataloader()))
    a, b = (dict(member.named_parameters()) for member in m.members[:2])
    assert any(not torch.allclose(a[n], b[n]) for n in a)
    with torch.no_grad():
        out = m(batch)
    assert not torch.allclose(out[0], out[1])


def test_sequential_and_in_memory_deep_ensembles_give_the_same_predictive():
    outs = {}
    for mode in ("in_memory", "sequential"):
        torch.manual_seed(0)
        m, batch, _, dm = make("deep_ensemble", f"method.mode={mode}", "method.chunk_size=2")
        for module in m.modules():  # dropout draws follow a different RNG order in the two modes
            if isinstance(module, nn.Dropout):
                module.p = 0.0
        assert m.mode == mode and m.report()["mode"] == mode
        _train(m, list(dm.train_dataloader()))
        with torch.no_grad():
            outs[mode] = predictive(m(batch))
    assert m.rounds == 2 and len(m.members) == 2  # 3 members in chunks of 2
    torch.testing.assert_close(outs["in_memory"], outs["sequential"], atol=1e-5, rtol=1e-4)


def test_sequential_deep_ensemble_heads_are_their_rounds_results_despite_weight_decay():
    # Every round's optimiser holds all M heads; AdamW's decoupled weight decay shrinks the rows of members not
    # in the round. A finished member's head must be as its round left it, a later member's start as drawn.
    m, batch, _, _ = make("deep_ensemble", "method.mode=sequential", "method.chunk_size=1")
    drawn = m.heads.weight.detach().clone()
    ended, started = {}, {}
    for round_ in range(m.rounds):
        started[round_] = m.heads.weight[round_].detach().clone()
        optimizer = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.5)
        for _ in range(3):
            optimizer.zero_grad()
            m.loss(m(batch), batch["labels"]).backward()
            optimizer.step()
        ended[round_] = m.heads.weight[round_].detach().clone()
        m.next_round()
    assert m.finished
    for member in range(m.ensemble_size):
        assert torch.equal(started[member], drawn[member]), member  # not decayed by the earlier rounds
        assert torch.equal(m.heads.weight[member], ended[member]), member  # not decayed by the later ones
        assert not torch.equal(ended[member], drawn[member])  # it did train


@pytest.mark.parametrize("method", ["bayes_lora_llla", "bayes_lora_la", "bayes_lora_la:nn"])
def test_laplace_predictive_approaches_map_as_prior_precision_grows(method):
    # 200 samples and precisions 1e4 apart: the ordering is the posterior's, not 10 samples' noise.
    method, _, kind = method.partition(":")
    extra = [f"method.predictive={kind}"] if kind else []
    m, batch, _, dm = make(method, "method.marglik_steps=5", "method.num_samples=200", *extra)
    _train(m, list(dm.train_dataloader()))
    m.after_fit(dm)
    assert float(m.laplace.prior_precision) > 0
    m.eval()
    with torch.no_grad():
        map_probs = predictive(m.map_logits(batch))
        gaps = []
        for precision in (1e-3, 1e1, 1e6):
            m.laplace.prior_precision = precision
            out = m(batch)
            assert out.shape[0] == m.num_samples
            gaps.append(float((predictive(out) - map_probs).abs().max()))
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 1e-3, gaps


def test_la_glm_predictive_is_the_model_linearised_at_the_map():
    # Member s = f(theta*) + J (theta_s - theta*). Reference: the same offsets through the network itself, by
    # central differences in float64 (error O(eps^2)), and the nn predictive's own samples as the endpoints.
    torch.manual_seed(0)
    m, batch, _, dm = make("bayes_lora_la", "method.marglik_steps=3", "method.num_samples=3")
    _train(m, list(dm.train_dataloader()))
    m.after_fit(dm)
    m.double().eval()
    m.laplace.mean = m.laplace.mean.double()
    offsets = 0.1 * torch.randn(3, m.laplace.n_params, dtype=torch.float64)
    m.laplace.sample = lambda S: m.laplace.mean + offsets[:S]
    assert m.report()["predictive"] == "glm"
    with torch.no_grad():
        glm = m(batch)
        at_map = m.map_logits(batch)
        m.predictive = "nn"
        eps = 1e-4
        ends = []
        for sign in (1, -1):
            m.laplace.sample = lambda S, sign=sign: m.laplace.mean + sign * eps * offsets[:S]
            ends.append(m(batch))
    jvp = (ends[0] - ends[1]) / (2 * eps)  # (S, B, C)
    assert glm.shape == (3, *at_map.shape[1:])
    assert jvp.abs().max() > 1e-3  # the offsets move the logits: the comparison is not 0 == 0
    torch.testing.assert_close(glm, at_map + jvp, atol=1e-6, rtol=1e-6)


def test_la_predictive_must_be_one_of_the_named_ones():
    with pytest.raises(InstantiationException, match=r"method.predictive='probit'.*\['glm', 'nn'\]"):
        make("bayes_lora_la", "method.predictive=probit")


@pytest.mark.parametrize("method", ["bayes_lora_llla", "bayes_lora_la"])
def test_laplace_posterior_travels_in_the_state_dict(method, tmp_path):
    # The posterior is method state: saved (weights-only loadable) and restored, it samples the same members,
    # and after_fit on the restored method keeps it rather than fitting a new one.
    m, batch, _, dm = make(method, "method.marglik_steps=3", "method.num_samples=4")
    _train(m, list(dm.train_dataloader()))
    m.after_fit(dm)
    torch.save(m.state_dict(), tmp_path / "state.pt")
    fresh, *_ = make(method, "method.marglik_steps=3", "method.num_samples=4")
    assert fresh.laplace is None
    fresh.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert fresh.laplace is not None  # restored by loading alone
    restored = fresh.laplace
    fresh.after_fit(dm)
    assert fresh.laplace is restored  # kept, not refitted
    assert float(fresh.laplace.prior_precision) == float(m.laplace.prior_precision)
    m.eval(), fresh.eval()
    with torch.no_grad():
        torch.manual_seed(3)
        expected = m(batch)
        torch.manual_seed(3)
        torch.testing.assert_close(fresh(batch), expected)
    assert expected.shape[0] == 4


def test_blob_samples_vary_and_kl_is_finite_and_non_negative():
    m, batch, _, _ = make("blob")
    kl = m.kl()
    assert torch.isfinite(kl) and kl >= 0
    nn.init.normal_(m.member_layers()[0].lora_B)  # B = 0 at init hides the noise in A
    m.eval()
    with torch.no_grad():
        out = m(batch)
    assert out.shape[0] == 10 and not torch.allclose(out[0], out[1])
    layer = BLoBLayer(nn.Linear(4, 4), rank=2, prior_std=0.5)
    with torch.no_grad():  # at the prior the KL is zero
        layer.lora_A.zero_()
        layer.lora_G.fill_(0.5**0.5)
    torch.testing.assert_close(layer.kl(), torch.tensor(0.0), atol=1e-6, rtol=0)


def test_checkpoint_ensemble_members_are_the_snapshots():
    m, batch, _, dm = make("checkpoint_ensemble")
    batches = list(dm.train_dataloader())
    live = []
    for epoch in range(4):  # 4 epochs, ensemble_size 3: the last 3 snapshots are kept
        _train(m, batches[epoch:], steps_per_round=1)
        m.on_train_epoch_end(None)
        with torch.no_grad():
            live.append(m(batch)[0])
    m.after_fit(dm)
    with torch.no_grad():
        out = m(batch)
    assert out.shape[0] == 3 and m.report()["checkpoints"] == 3 and m.num_members() == 3
    torch.testing.assert_close(out, torch.stack(live[1:]), atol=1e-5, rtol=1e-5)


def test_last_layer_ensemble_members_differ_only_in_their_heads():
    m, batch, _, _ = make("last_layer_ensemble")
    m.eval()
    with torch.no_grad():
        out = m(batch)
        features = m.backbone(batch)
    expected = torch.einsum("bd,mcd->mbc", features, m.heads.weight) + m.heads.bias[:, None]
    torch.testing.assert_close(out, expected)
    assert not torch.allclose(out[0], out[1])


def test_batch_ensemble_init_std_draws_fast_weights_around_one():
    torch.manual_seed(0)
    layer = BatchEnsembleLayer(nn.Linear(6, 5), ensemble_size=3, init_std=0.1)
    for fast in (layer.r, layer.s):
        assert not torch.allclose(fast[0], fast[1])  # members differ from the start
        assert (fast - 1).abs().mean() < 0.3 and (fast - 1).std() > 0.03  # around one, spread ~ init_std
    x = torch.randn(3 * 4, 6)
    y = split_members(layer(x), 3)  # rows 4m..4m+3 are member m's
    for m in range(3):  # the layer computes what its member weight says
        torch.testing.assert_close(y[m], x[4 * m : 4 * m + 4] @ layer.member_weight(m).T + layer.member_bias(m))
    with pytest.raises(ValueError, match="init_std must be >= 0, got -0.1"):
        BatchEnsembleLayer(nn.Linear(6, 5), ensemble_size=3, init_std=-0.1)


def test_batch_ensemble_warns_when_a_pretrained_head_leaves_nothing_to_tell_members_apart(monkeypatch):
    from sve.backbones.hf import HFBackbone

    monkeypatch.setattr(
        HFBackbone, "initial_head", lambda self, task, C: (torch.zeros(C, self.feature_dim), torch.zeros(C))
    )
    with pytest.warns(UserWarning, match="stay identical; set method.init_std > 0"):
        make("batch_ensemble")
    m, *_ = make("batch_ensemble", "method.init_std=0.01")  # no warning needed: the fast weights differ
    assert m.report()["init_std"] == 0.01
    layer = next(layer for layer in m.modules() if isinstance(layer, BatchEnsembleLayer))
    assert not torch.allclose(layer.r[0], layer.r[1])
