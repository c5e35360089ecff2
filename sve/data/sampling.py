"""Which examples each process sees and in what order: seeded, split across processes, resumable mid-epoch.

Training. ``batch_size`` is the *global* batch of the recipe, whatever the hardware. Epoch e is a permutation
seeded by (seed, e), cut into global batches; each global batch is split into ``world_size * accumulate``
near-equal micro-batches and rank r takes micro-batches ``r*A .. r*A + A - 1``. A micro-batch carries
``loss_scale = its size * world_size * A / global batch size``: DDP averages over ranks and Lightning over
accumulation steps, so the optimiser sees the mean loss over the global batch, as on one device (the scale is
1 except in a short last batch). A micro-batch that would be empty (a last batch smaller than
``world_size * A``) holds one example with scale 0, so every rank still runs a step.

Random augmentations of example i in epoch e draw from a generator seeded by (seed, e, i), not from the
global one: the data are the same on any number of devices and workers, and prefetching a batch before a
checkpoint does not shift the random numbers that dropout sees after it.

Evaluation. The batches are cut from the examples in order, whatever the number of processes N, and rank r
takes batches r, r + N, r + 2N, ...; a rank with one batch fewer gets one padding example marked
``valid = False`` (never counted), so every rank runs the same number of batches and every example is counted
exactly once. Each batch's random draws are seeded by the batch itself (``EnsembleModule.draws``): sampled
methods predict the same on any number of processes.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler


def split_sizes(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal contiguous sizes, the larger ones first."""
    return [total // parts + (i < total % parts) for i in range(parts)]


class TrainBatchSampler(Sampler):
    """Yields this rank's micro-batches as lists of ``(index, epoch, loss_scale, offset, total)`` keys for
    ``Keyed``: ``offset`` and ``total`` place the micro-batch in its global batch (``sve.layers.draws``).

    Args:
        num_examples: size of the training split.
        batch_size: the global batch.
        seed: seeds the permutation of every epoch (with the epoch number).
        world_size, rank: the processes sharing each global batch.
        accumulate: micro-batches per rank and optimiser step (``trainer.accumulate_grad_batches``).
    """

    def __init__(
        self,
        num_examples: int,
        batch_size: int,
        seed: int,
        world_size: int = 1,
        rank: int = 0,
        accumulate: int = 1,
        shuffle: bool = True,
    ):
        if num_examples < 1:
            raise ValueError("the training split is empty")
        self.n, self.batch_size, self.seed = num_examples, batch_size, seed
        self.world_size, self.rank, self.accumulate, self.shuffle = world_size, rank, accumulate, shuffle
        self.epoch = 0
        self.resume: tuple[int, int] | None = None  # (epoch, global batches already done in it)
        self.sampler = self  # Lightning calls set_epoch on ``batch_sampler.sampler`` at every epoch start

    def set_epoch(self, epoch: int) -> None:  # called by Lightning at the start of every epoch
        self.epoch = epoch

    def resume_at(self, epoch: int, done: int) -> None:
        """The next iteration over ``epoch`` skips its first ``done`` global batches (already trained on)."""
        self.epoch, self.resume = epoch, (epoch, done)

    def order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        generator = torch.Generator().manual_seed(hash((self.seed, epoch)) % 2**63)
        return torch.randperm(self.n, generator=generator).tolist()

    def micro_batches(self, epoch: int) -> list[list[tuple[int, int, float]]]:
        parts, A = self.world_size * self.accumulate, self.accumulate
        order, batches = self.order(epoch), []
        for start in range(0, self.n, self.batch_size):
            chunk = order[start : start + self.batch_size]
            bounds = np.cumsum([0, *split_sizes(len(chunk), parts)])
            for part in range(self.rank * A, self.rank * A + A):
                mine = chunk[bounds[part] : bounds[part + 1]]
                scale = len(mine) * parts / len(chunk)
                # (offset, total): these examples' rows in the global batch (sve.layers.draws)
                offset, total = int(bounds[part]), len(chunk)
                batches.append([(i, epoch, scale, offset, total) for i in mine] or [(chunk[0], epoch, 0.0, 0, total)])
        return batches

    def __iter__(self) -> Iterator[list[tuple[int, int, float]]]:
        epoch, skip = self.epoch, 0
        if self.resume is not None and self.resume[0] == epoch:
            skip = self.resume[1] * self.accumulate
        self.resume = None
        yield from self.micro_batches(epoch)[skip:]

    def __len__(self) -> int:
        return self.accumulate * -(-self.n // self.batch_size)


class EvalBatchSampler(Sampler):
    """Yields this rank's evaluation batches as lists of ``(index, valid)`` keys for ``Keyed``.

    The batches are the same on any number of processes: batch b holds examples ``b*B .. b*B + B - 1`` and
    rank r takes batches r, r + W, r + 2W, ...; a rank left with one batch fewer runs one padding example
    marked ``valid = False``, so every rank runs the same number of batches. Random numbers drawn while
    evaluating a batch (dropout, posterior samples) are seeded by the batch (``EnsembleModule``), so the
    predictive does not depend on how the batches are spread over the processes.
    """

    def __init__(self, num_examples: int, batch_size: int, world_size: int = 1, rank: int = 0):
        self.n, self.batch_size, self.world_size, self.rank = num_examples, batch_size, world_size, rank

    def batches(self) -> list[list[tuple[int, bool]]]:
        starts = range(self.rank * self.batch_size, self.n, self.world_size * self.batch_size)
        mine = [[(i, True) for i in range(start, min(start + self.batch_size, self.n))] for start in starts]
        return mine + [[(0, False)]] * (len(self) - len(mine))

    def __iter__(self) -> Iterator[list[tuple[int, bool]]]:
        yield from self.batches()

    def __len__(self) -> int:
        batches = -(-self.n // self.batch_size)  # ceil(n / B)
        return -(-batches // self.world_size)  # ceil(batches / W): every rank runs as many


class Keyed(Dataset):
    """``dataset[key]`` for the keys of the samplers above: returns ``(example, key)``.

    Training keys ``(index, epoch, scale)`` draw the example's random augmentation from a generator seeded by
    (seed, epoch, index); the global random states are left as they were.
    """

    def __init__(self, dataset: Dataset, seed: int = 0):
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key):
        if len(key) == 2:  # evaluation: no randomness to control
            return self.dataset[key[0]], key
        index, epoch = key[0], key[1]
        example_seed = hash((self.seed, epoch, index)) % 2**31
        state = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(example_seed)
            random.seed(example_seed)
            np.random.seed(example_seed)
            try:
                return self.dataset[index], key
            finally:
                random.setstate(state[0])
                np.random.set_state(state[1])


class KeyedCollate:
    """Wraps a collate function: the batch also gets ``loss_scale`` and ``rows`` (training: the micro-batch's
    offset in its global batch and that batch's size) or ``valid`` and ``index``, the examples' positions in
    the dataset (evaluation: saved predictions are put back in dataset order)."""

    def __init__(self, collate, plain: bool = False):
        self.collate, self.plain = collate, plain  # plain: the batch without the sampler's extra key

    def __call__(self, items: list) -> dict:
        examples, keys = zip(*items)
        batch = self.collate(list(examples))
        if self.plain:
            return batch
        if len(keys[0]) == 2:
            batch["valid"] = torch.tensor([valid for _, valid in keys])
            batch["index"] = torch.tensor([index for index, _ in keys])
        else:
            batch["loss_scale"] = keys[0][2]
            if len(keys[0]) == 5:
                batch["rows"] = keys[0][3:]
        return batch
