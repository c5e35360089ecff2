"""Data modules. Each knows its splits; the backbone supplies the tokenizer or the image preprocessing.

``run`` builds the backbone first and calls ``datamodule.attach(backbone)``; every batch is a dict with
``labels`` plus ``pixel_values`` (images) or ``input_ids``/``attention_mask`` (text, padded per batch).
"""

from __future__ import annotations

import logging

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, Subset

log = logging.getLogger(__name__)


def take_subset(dataset: Dataset, size: int | None, seed: int, name: str) -> Dataset:
    """A seeded random subset of ``size`` examples (all of them when size is None or too large)."""
    n = len(dataset)
    if size is None or size >= n:
        return dataset
    if size < 1:
        raise ValueError(f"dataset.{name}_size must be a positive integer or null, got {size}")
    g = torch.Generator().manual_seed(seed)
    return Subset(dataset, torch.randperm(n, generator=g)[:size].tolist())


class ClassificationData(pl.LightningDataModule):
    """Common split handling: seeded subsets for CPU-sized runs and the three loaders.

    Args:
        batch_size: per-device batch size (Table 7).
        eval_batch_size: batch size for validation and test (default: ``batch_size``).
        train_size, val_size, test_size: optional subset sizes (seeded by ``subset_seed``).
        num_workers: DataLoader workers.
        ood: another data module whose test split is the out-of-distribution set (e.g. CIFAR-10 for
            CIFAR-100, Table 4); the test loop then also reports OOD AUROC, AUPRC and FPR@95%TPR.
    """

    modality: str  # "image" or "text"; must match the backbone's
    num_classes: int

    def __init__(
        self,
        batch_size: int = 16,
        eval_batch_size: int | None = None,
        train_size: int | None = None,
        val_size: int | None = None,
        test_size: int | None = None,
        subset_seed: int = 0,
        num_workers: int = 0,
        ood: "ClassificationData | None" = None,
    ):
        super().__init__()
        self.ood = ood
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.sizes = {"train": train_size, "val": val_size, "test": test_size}
        self.subset_seed = subset_seed
        self.num_workers = num_workers
        self.splits: dict[str, Dataset] = {}
        self.backbone = None

    def attach(self, backbone) -> None:
        if backbone.modality != self.modality:
            raise ValueError(
                f"dataset {type(self).__name__} is {self.modality} data but backbone "
                f"{type(backbone).__name__} takes {backbone.modality} inputs; pick a matching pair"
            )
        self.backbone = backbone
        if self.ood is not None:
            self.ood.attach(backbone)

    def load_splits(self) -> dict[str, Dataset]:  # pragma: no cover - abstract
        """Returns the full ``train``, ``val`` and ``test`` datasets."""
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        for split, dataset in self.load_splits().items():
            self.splits[split] = take_subset(dataset, self.sizes[split], self.subset_seed, split)
        log.info("%s: %s", type(self).__name__, {k: len(v) for k, v in self.splits.items()})

    def collate(self, examples: list) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        self.setup()
        return DataLoader(
            self.splits[split],
            batch_size=self.batch_size if split == "train" else self.eval_batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            collate_fn=self.collate,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader | list[DataLoader]:
        """The test split, followed by the OOD set's test split when ``ood`` is given."""
        if self.ood is None:
            return self._loader("test", shuffle=False)
        return [self._loader("test", shuffle=False), self.ood.test_dataloader()]


class TextClassificationData(ClassificationData):
    """Examples are ``(text, label)`` pairs; tokenised per batch with dynamic padding.

    Args:
        max_length: truncation length in tokens (Table 7: 128 for SST-2).
    """

    modality = "text"

    def __init__(self, max_length: int = 128, **kwargs):
        super().__init__(**kwargs)
        self.max_length = max_length

    def collate(self, examples: list[tuple[str, int]]) -> dict:
        texts, labels = zip(*examples)
        enc = self.backbone.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        return {
            "input_ids": enc["input_ids"],
            "attention_mask": enc["attention_mask"],
            "labels": torch.tensor(labels, dtype=torch.long),
        }


class ImageClassificationData(ClassificationData):
    """Examples are ``(image tensor, label)``; the transform is built from the backbone in ``attach``."""

    modality = "image"

    def collate(self, examples: list) -> dict:
        images, labels = zip(*examples)
        return {"pixel_values": torch.stack(images), "labels": torch.tensor(labels, dtype=torch.long)}
