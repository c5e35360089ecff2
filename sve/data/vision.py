"""Image datasets read through torchvision (or from a local copy in the same on-disk layout).

Every dataset here returns PIL images from its raw splits; ``attach(backbone)`` builds the transforms from the
backbone's ``image_size``, ``mean`` and ``std`` (ImageNet statistics for the DINO backbones):

- train: random resized crop to ``image_size`` + horizontal flip (``backbone.train_crop == "pad"``: the
  CIFAR recipe, 4-pixel zero padding + random crop + flip, used by the CIFAR ResNets at 32 px);
- test: resize the short side to ``image_size / crop_pct`` + center crop (``crop_pct`` from the backbone,
  0.875 by default; the low-resolution datasets use 1.0, i.e. the whole image resized to ``image_size``).

Where a dataset has no official validation split, ``val_holdout`` training images are held out by
``subset_seed``. ``test_corruption``/``test_severity`` corrupt the test split with the generator of
``sve.data.corruptions`` (e.g. CIFAR-10-C made on the fly); ``corruptions``/``severities`` instead evaluate on
every corruption and severity as sets of their own, beside the clean test split (``ImageClassificationData``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import Dataset, Subset
from torchvision import transforms as T

from sve.data.base import ImageClassificationData
from sve.data.corruptions import Corrupter

log = logging.getLogger(__name__)

CACHE = Path("~/.cache/sve/data")


def image_transforms(backbone, crop_pct: float | None = None) -> tuple[T.Compose, T.Compose]:
    """(train, test) transforms from the backbone's resolution and normalisation; ``crop_pct`` overrides
    the backbone's test crop fraction."""
    size = backbone.image_size
    normalize = [T.ToTensor(), T.Normalize(backbone.mean, backbone.std)]
    if getattr(backbone, "train_crop", "random_resized") == "pad":
        train = [T.Resize(size), T.RandomCrop(size, padding=size // 8), T.RandomHorizontalFlip()]
    else:
        train = [T.RandomResizedCrop(size), T.RandomHorizontalFlip()]
    resize = round(size / (crop_pct or getattr(backbone, "crop_pct", 0.875)))
    test = [T.Resize(resize), T.CenterCrop(size)]
    return T.Compose(train + normalize), T.Compose(test + normalize)


class Transformed(Dataset):
    """Applies ``transform`` to the image of every ``(PIL image, label)`` example; the image is made RGB
    first (Fashion-MNIST is grayscale) and optionally corrupted (before the transform, at native size)."""

    def __init__(self, dataset: Dataset, transform, corrupt=None):
        self.dataset, self.transform, self.corrupt = dataset, transform, corrupt

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        image, label = self.dataset[i]
        if not isinstance(image, Image.Image):
            image = Image.fromarray(image)
        image = image.convert("RGB")
        if self.corrupt is not None:
            image = self.corrupt(image, i)
        return self.transform(image), int(label)


def hold_out(dataset: Dataset, size: int, seed: int) -> tuple[Subset, Subset]:
    """Splits ``dataset`` into (rest, ``size`` held-out examples), seeded."""
    if size is None or not 0 < size < len(dataset):
        raise ValueError(f"dataset.val_holdout={size} must be between 1 and {len(dataset) - 1}")
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
    return Subset(dataset, order[size:]), Subset(dataset, order[:size])


class VisionData(ImageClassificationData):
    """Base for the torchvision-backed datasets.

    Args:
        root: local directory in the layout named by the subclass (``LAYOUT``); None uses
            ``~/.cache/sve/data/<name>`` and downloads there.
        download: let torchvision download what is missing under ``root``.
        val_holdout: training images held out for validation where the dataset has no official split.
        test_corruption: corrupt the test split with this corruption (see ``sve.data.corruptions``).
        test_severity: its severity, 1 to 5.
    """

    name: str  # the config option name, used in error messages
    LAYOUT: str  # the expected on-disk layout, shown when loading fails
    # Test crop fraction; None takes the backbone's. Small, object-centred images (CIFAR, Fashion-MNIST)
    # use 1.0: they are resized to the backbone's resolution whole (Appendix D), not cropped.
    test_crop_pct: float | None = None

    def __init__(
        self,
        root: str | None = None,
        download: bool = True,
        val_holdout: int | None = None,
        test_corruption: str | None = None,
        test_severity: int = 1,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.root = root
        self.download = download
        self.val_holdout = val_holdout
        self.test_corruption = test_corruption
        self.test_severity = test_severity
        self.train_transform = self.test_transform = None
        self.raw_test: Dataset | None = None  # the test images before any transform (set by load_splits)

    def attach(self, backbone) -> None:
        super().attach(backbone)
        self.train_transform, self.test_transform = image_transforms(backbone, self.test_crop_pct)

    def raw_splits(self, root: Path, download: bool) -> dict[str, Dataset]:  # pragma: no cover - abstract
        """``train``, ``val`` (or None to hold out of train) and ``test`` datasets of (PIL image, label)."""
        raise NotImplementedError

    def resolved_root(self) -> Path:
        return Path(self.root).expanduser() if self.root else (CACHE / self.name).expanduser()

    def load_raw(self) -> dict[str, Dataset]:
        root = self.resolved_root()
        try:
            return self.raw_splits(root, self.download)
        except Exception as err:  # torchvision raises RuntimeError, URLError, OSError, ... when offline
            raise RuntimeError(
                f"dataset {self.name}: could not load from {root} ({type(err).__name__}: {err}). "
                f"Without network access set dataset.root to a directory holding {self.LAYOUT}"
            ) from err

    def load_splits(self) -> dict[str, Dataset]:
        if self.train_transform is None:
            raise RuntimeError(f"dataset {self.name}: call attach(backbone) before setup()")
        raw = self.load_raw()
        if raw.get("val") is None:
            raw["train"], raw["val"] = hold_out(raw["train"], self.val_holdout, self.subset_seed)
        corrupt = None
        if self.test_corruption:
            corrupt = Corrupter(self.test_corruption, self.test_severity, self.corruption_seed)
        self.raw_test = raw["test"]
        return {
            "train": Transformed(raw["train"], self.train_transform),
            "val": Transformed(raw["val"], self.test_transform),
            "test": Transformed(raw["test"], self.test_transform, corrupt),
        }

    def shifted_test(self, corruption: str, severity: int) -> Dataset:
        """The raw test images corrupted at their native size, then transformed as the clean test split."""
        self.setup()
        return Transformed(self.raw_test, self.test_transform, Corrupter(corruption, severity, self.corruption_seed))
