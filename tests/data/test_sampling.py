"""The recipe's batch is the global batch: with N processes and A accumulation steps every global batch is
seen once, split N*A ways, weighted back to its mean; evaluation counts every example once."""

from __future__ import annotations

import itertools

import pytest

from sve.data.sampling import EvalBatchSampler, TrainBatchSampler
from sve.runs.run import run
from tests.conftest import compose_cfg


@pytest.mark.parametrize(("n", "batch", "world", "accumulate"), [(21, 8, 2, 1), (21, 8, 2, 2), (9, 8, 4, 3)])
def test_ranks_and_accumulation_steps_share_each_global_batch(n, batch, world, accumulate):
    ranks = [
        list(TrainBatchSampler(n, batch, seed=3, world_size=world, rank=r, accumulate=accumulate)) for r in range(world)
    ]
    single = list(TrainBatchSampler(n, batch, seed=3))
    assert all(len(r) == len(ranks[0]) == len(TrainBatchSampler(n, batch, 3, world, 0, accumulate)) for r in ranks)
    for step, whole in enumerate(single):
        parts = [m for r in ranks for m in r[step * accumulate : (step + 1) * accumulate]]
        real = [key for part in parts for key in part if key[2] > 0]
        assert sorted(key[0] for key in real) == sorted(key[0] for key in whole)  # the same examples, once
        # DDP averages over ranks, Lightning over steps: each example's weight in the loss is 1 / global batch.
        for part in parts:
            for _, _, scale, _, _ in part:
                assert scale / (len(part) * world * accumulate) == pytest.approx(1 / len(whole) if scale else 0)
        # Each micro-batch knows its rows of the global batch (sve.layers.draws): together they are the whole batch.
        rows = sorted((part[0][3], len(part)) for part in parts if part[0][2] > 0)
        assert all(part[0][4] == len(whole) for part in parts)
        assert [offset for offset, _ in rows] == list(itertools.accumulate([0] + [n for _, n in rows][:-1]))


def test_epochs_differ_and_resume_skips_what_was_done():
    sampler = TrainBatchSampler(20, 4, seed=0)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert [k[0] for b in first for k in b] != [k[0] for b in second for k in b]
    sampler.resume_at(1, 2)
    assert list(sampler) == second[2:]
    assert list(sampler) == second  # skipping applies once


@pytest.mark.parametrize(("n", "world"), [(21, 2), (5, 4), (3, 1)])
def test_evaluation_counts_each_example_once(n, world):
    keys = [k for r in range(world) for b in EvalBatchSampler(n, 4, world, r) for k in b]
    assert sorted(i for i, valid in keys if valid) == list(range(n))
    counts = {len(list(EvalBatchSampler(n, 4, world, r))) for r in range(world)}
    assert len(counts) == 1  # every rank runs the same number of batches


def test_accumulation_gives_the_same_training(tmp_path):
    common = [
        "backbone=tiny_vit",
        "method=sve",
        "ensemble_size=2",
        "trainer=cpu",
        "trainer.max_epochs=1",
        "dataset.num_train=20",
        "dataset.num_val=4",
        "dataset.num_test=16",
    ]
    one = run(compose_cfg(common, tmp_path / "a"))
    two = run(compose_cfg([*common, "trainer.accumulate_grad_batches=2"], tmp_path / "b"))
    assert two["hardware"]["per_device_batch_size"] == 4 and two["hardware"]["accumulate_grad_batches"] == 2
    assert two["metrics"]["test/acc"] == one["metrics"]["test/acc"]
    assert two["metrics"]["test/nll"] == pytest.approx(one["metrics"]["test/nll"], rel=1e-5)
