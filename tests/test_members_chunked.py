"""``members_at_once: k`` in training: the step runs and back-propagates k members at a time, and trains
exactly what all members at once train (same dropout masks, gradients added across the chunks).

The runs are real (Lightning, the sampler, AdamW, clipping, the schedule) on a tiny BERT whose dropout is on
(0.1 in its hidden layers and attention), so a chunk that drew other masks than all members at once would
end elsewhere."""

import pytest
import torch

from sve.methods.base import EnsembleMethod
from sve.runs.run import run
from sve.training.checkpoint import read_checkpoint
from sve.training.draws import seeded_draws
from tests.conftest import compose_cfg

BASE = ["ensemble_size=4", "backbone=tiny_bert", "dataset=synthetic_text", "callbacks=default",
        "trainer.limit_train_batches=4", "method.lr=0.01"]  # fmt: skip


def trained_state(tmp_path, method: str, members_at_once) -> dict[str, torch.Tensor]:
    out = tmp_path / f"{method}_{members_at_once}"
    run(compose_cfg([f"method={method}", f"method.members_at_once={members_at_once}", *BASE], out))
    state = read_checkpoint(out / "checkpoints" / "final.ckpt")["state_dict"]
    return {k: v for k, v in state.items() if v.is_floating_point()}


@pytest.mark.parametrize("method", ["sve", "sve_lora_shared", "lora_ensemble"])
def test_training_in_member_chunks_equals_all_members_at_once(tmp_path, method):
    # sve: every trainable tensor is one member's; sve_lora_shared: a LoRA shared by all members adds its
    # gradient up across the chunks; lora_ensemble: per-member adapters on a frozen backbone.
    together = trained_state(tmp_path, method, "all")
    for k in (1, 3):  # one member per pass, and chunks of unequal size (3 + 1)
        chunked = trained_state(tmp_path, method, k)
        assert chunked.keys() == together.keys()
        moved = [key for key in together if not torch.equal(together[key], chunked[key])]
        for key in moved:  # the shared LoRA's gradient is a sum in another order: rounding only
            torch.testing.assert_close(chunked[key], together[key], rtol=1e-5, atol=1e-7, msg=key)
        if method != "sve_lora_shared":
            assert not moved, f"members_at_once={k} trained other values for {moved[:3]}"


def test_a_chunked_step_back_propagates_each_chunk_before_the_next_runs(tmp_path, monkeypatch):
    # The memory promise: a chunk's graph is back-propagated (and freed) before the next chunk runs.
    events = []
    chunk_logits, backward = EnsembleMethod.chunk_logits, torch.Tensor.backward

    def forward_of(self, batch, members):
        events.append(tuple(members))
        return chunk_logits(self, batch, members)

    def backward_of(self, *args, **kwargs):
        events.append("backward")
        return backward(self, *args, **kwargs)

    monkeypatch.setattr(EnsembleMethod, "chunk_logits", forward_of)
    monkeypatch.setattr(torch.Tensor, "backward", backward_of)
    run(compose_cfg(["method=sve", "method.members_at_once=2", *BASE], tmp_path))
    steps = 4  # trainer.limit_train_batches
    first = events.index((0, 1))  # before it: the backward of the method's usage probe, at build time
    assert events[first:] == [(0, 1), "backward", (2, 3), "backward"] * steps


def test_a_chunk_draws_its_members_dropout_masks_as_all_members_do():
    x = torch.ones(4 * 3, 5)  # 4 members x 3 examples, member-major
    with seeded_draws(7, (0, 3), 3):
        together = torch.nn.functional.dropout(x, 0.5)
    with seeded_draws(7, (0, 3), 3, ([1, 3], 4)):
        chunk = torch.nn.functional.dropout(x[:6], 0.5)
    torch.testing.assert_close(chunk, torch.cat([together[3:6], together[9:12]]), rtol=0, atol=0)
    assert not torch.equal(together[3:6], together[9:12])  # the members' masks differ


def test_methods_that_train_otherwise_are_not_split():
    from sve.methods.deep_ensemble import DeepEnsemble
    from sve.methods.last_layer import LastLayerEnsemble

    assert EnsembleMethod.chunked_training and not DeepEnsemble.chunked_training
    assert not LastLayerEnsemble.chunked_training


def test_member_chunks_with_gradient_checkpointing_are_refused_in_one_line(tmp_path):
    from sve.errors import InputError

    overrides = ["method=sve", "method.members_at_once=2", *BASE, "+backbone.gradient_checkpointing=true"]
    match = r"2 of its 4 members per pass .*members_at_once=2.*gradient_checkpointing=true"
    with pytest.raises(InputError, match=match):
        run(compose_cfg(overrides, tmp_path))
