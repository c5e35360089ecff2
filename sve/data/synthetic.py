"""Small learnable datasets made in memory, for tests and smoke runs (no files, no network)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, TensorDataset

from sve.data.base import ImageClassificationData, TextClassificationData
from sve.data.corruptions import Corrupter
from sve.data.options import check_count


def _split_sizes(num_train: int, num_val: int, num_test: int) -> dict[str, int]:
    counts = {"train": num_train, "val": num_val, "test": num_test}
    for split, n in counts.items():
        check_count(f"dataset.num_{split}", n)
    return counts


def _notes(counts: dict[str, int]) -> dict[str, str]:
    return {split: f"dataset.num_{split}={n}" for split, n in counts.items()}


class SyntheticImageData(ImageClassificationData):
    """Images = class prototype + Gaussian noise, already normalised; size taken from the backbone.

    Args:
        num_classes: number of classes.
        num_train, num_val, num_test: examples per split.
        noise: std of the per-pixel noise (prototypes have unit scale); larger is harder.
        seed: generator seed; the same seed gives the same data.
    """

    name = "synthetic_image"

    def __init__(
        self,
        num_classes: int = 4,
        num_train: int = 64,
        num_val: int = 32,
        num_test: int = 32,
        noise: float = 1.0,
        seed: int = 0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_count("dataset.num_classes", num_classes)
        self.num_classes = num_classes
        self.counts = _split_sizes(num_train, num_val, num_test)
        self.noise = noise
        self.seed = seed

    def read_splits(self):
        """The labels of each split: the images are made at the backbone's resolution (``load_splits``)."""
        self.notes = _notes(self.counts)
        return {split: torch.arange(n) % self.num_classes for split, n in self.counts.items()}

    def load_splits(self):
        self.check_data()
        size = self.backbone.image_size if self.backbone is not None else 32
        g = torch.Generator().manual_seed(self.seed)
        # Low-frequency prototypes (8x8 upsampled) so that patch-based models can see them.
        coarse = torch.randn(self.num_classes, 3, 8, 8, generator=g)
        prototypes = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear")
        splits = {}
        for split, n in self.counts.items():
            labels = torch.arange(n) % self.num_classes
            images = prototypes[labels] + self.noise * torch.randn(n, 3, size, size, generator=g)
            splits[split] = TensorDataset(images, labels)
        self.raw_test = splits["test"]  # before test_size: shifted_test corrupts the whole split
        return splits

    def collate(self, examples):
        images, labels = zip(*examples)
        return {"pixel_values": torch.stack(images), "labels": torch.stack(labels).long()}

    def shifted_test(self, corruption: str, severity: int) -> Dataset:
        """The test images through the corruption generator: mapped to 8-bit pixels by x / 6 + 1/2 (values
        within 3 of zero, nearly all of them here, survive up to rounding), corrupted, and mapped back."""
        self.setup()
        return _Corrupted(self.raw_test, Corrupter(corruption, severity, self.corruption_seed))


class _Corrupted(Dataset):
    def __init__(self, dataset: Dataset, corrupt: Corrupter):
        self.dataset, self.corrupt = dataset, corrupt

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        image, label = self.dataset[i]
        pixels = ((image / 6 + 0.5).clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()  # (H, W, 3)
        corrupted = np.asarray(self.corrupt(Image.fromarray(pixels), i), dtype=np.float32) / 255
        return (torch.from_numpy(corrupted).permute(2, 0, 1) - 0.5) * 6, label


class SyntheticTextData(TextClassificationData):
    """Sentences of class-specific and neutral words; the class is the majority of class words.

    Args:
        num_classes: number of classes (each gets its own four words).
        num_train, num_val, num_test: examples per split.
        words_per_sentence: sentence length in words.
        seed: generator seed.
    """

    name = "synthetic_text"

    NEUTRAL = ["the", "a", "movie", "was", "and", "it", "plot", "film", "story", "very"]

    def __init__(
        self,
        num_classes: int = 2,
        num_train: int = 64,
        num_val: int = 32,
        num_test: int = 32,
        words_per_sentence: int = 6,
        seed: int = 0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_count("dataset.num_classes", num_classes)
        check_count("dataset.words_per_sentence", words_per_sentence)
        self.num_classes = num_classes
        self.counts = _split_sizes(num_train, num_val, num_test)
        self.words_per_sentence = words_per_sentence
        self.seed = seed

    def class_words(self, c: int) -> list[str]:
        return [f"w{c}x{i}" for i in range(4)]

    def read_splits(self):
        self.notes = _notes(self.counts)
        g = torch.Generator().manual_seed(self.seed)
        splits = {}
        for split, n in self.counts.items():
            examples = []
            for i in range(n):
                label = i % self.num_classes
                words = []
                for _ in range(self.words_per_sentence):
                    if torch.rand((), generator=g) < 0.6:
                        pool = self.class_words(label)
                    else:
                        pool = self.NEUTRAL
                    words.append(pool[int(torch.randint(len(pool), (), generator=g))])
                examples.append((" ".join(words), label))
            splits[split] = examples
        return splits
