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

``check_data`` needs no backbone: it finds what is missing under ``root`` (and downloads it where the dataset
allows and ``download`` is set), parses every metadata file, and decodes every image file of the chosen
subsets (``sve.data.checks.decode_images``); ``setup`` after ``attach`` only adds the transforms.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps
from torch.utils.data import Dataset, Subset
from torchvision import datasets as tvd
from torchvision import transforms as T

from sve.data.base import ImageClassificationData
from sve.data.checks import decode_images, one_line
from sve.data.corruptions import CORRUPTIONS, SEVERITIES, Corrupter
from sve.data.options import is_int
from sve.errors import InputError
from sve.paths import cache_root

log = logging.getLogger(__name__)


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


# PIL modes of grey images deeper than 8 bits (16-bit PNG and TIFF: medical scans, microscopy, depth maps).
DEEP_GREY = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")


def rgb(image: Image.Image) -> Image.Image:
    """An image as 8-bit RGB, upright (its EXIF orientation applied). A grey image deeper than 8 bits is scaled
    to 8 bits over the range of its values' type (16-bit: 65535; a 32-bit one whose values fit 8 or 16 bits:
    that range; floats: [0, 1] or their maximum): PIL's own conversion clips every value above 255 to white."""
    image = ImageOps.exif_transpose(image)  # a phone photo's EXIF orientation, as a viewer shows it
    if image.mode in DEEP_GREY:
        values = np.asarray(image, dtype=np.float64)
        top = float(values.max(initial=0.0))
        if image.mode.startswith("I;16"):
            top = 65535.0
        elif image.mode == "I":
            top = 255.0 if top <= 255 else 65535.0 if top <= 65535 else top
        else:  # "F"
            top = 1.0 if top <= 1 else top
        image = Image.fromarray(np.clip(values / max(top, 1e-12) * 255, 0, 255).round().astype(np.uint8))
    return image.convert("RGB")


def load_rgb(path) -> Image.Image:
    """The image file at ``path`` as 8-bit RGB (``rgb``); the loader of every image file read here."""
    with open(path, "rb") as f:
        return rgb(Image.open(f))


class ImageFiles(Dataset):
    """(PIL image, label) from a list of image files, read as torchvision's dataset classes read them."""

    def __init__(self, files: list[Path], labels: list[int]):
        self.files, self.labels = list(files), list(labels)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        return load_rgb(self.files[i]), self.labels[i]


def image_files(dataset: Dataset, indices: list[int] | None = None) -> list[Path]:
    """The files behind examples ``indices`` (None: all) of ``dataset`` (through any ``Subset``), or [] for
    images held in memory."""
    indices = list(range(len(dataset))) if indices is None else list(indices)
    while isinstance(dataset, Subset):
        indices, dataset = [dataset.indices[i] for i in indices], dataset.dataset
    if isinstance(dataset, ImageFiles):
        return [dataset.files[i] for i in indices]
    if isinstance(dataset, tvd.DatasetFolder):
        return [Path(dataset.samples[i][0]) for i in indices]
    return []


def hold_out(dataset: Dataset, size: int, seed: int, key: str = "dataset.val_holdout") -> tuple[Subset, Subset]:
    """Splits ``dataset`` into (rest, ``size`` held-out examples), seeded."""
    if not is_int(size) or not 0 < size < len(dataset):
        raise InputError(
            f"{key}={size!r} is not valid: it must be an integer between 1 and {len(dataset) - 1}, the "
            f"number of the {len(dataset)} training examples held out for validation"
        )
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
    return Subset(dataset, order[size:]), Subset(dataset, order[:size])


class VisionData(ImageClassificationData):
    """Base for the torchvision-backed datasets.

    Args:
        root: local directory in the layout named by the subclass (``LAYOUT``); None uses ``data/<name>`` in
            the project's cache (``$XDG_CACHE_HOME/sve``, default ``~/.cache/sve``) and downloads there.
        download: let torchvision download what is missing under ``root`` (in ``check_data``).
        val_holdout: training images held out for validation where the dataset has no official split.
        test_corruption: corrupt the test split with this corruption (see ``sve.data.corruptions``).
        test_severity: its severity, 1 to 5.

    A subclass names the files it needs (``required``), reads them (``read_raw``: every user error an
    ``InputError`` naming the file) and, where torchvision can, downloads them (``fetch``).
    """

    name: str  # the config option name, used in error messages
    LAYOUT: str  # the expected on-disk layout, shown when loading fails
    downloadable = True  # torchvision can download it (dataset.download=true)
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
        if test_corruption is not None and test_corruption not in CORRUPTIONS:
            raise InputError(
                f"dataset.test_corruption={test_corruption!r} is not valid; choose one of {list(CORRUPTIONS)} or null"
            )
        if test_corruption is not None and test_severity not in SEVERITIES:
            raise InputError(f"dataset.test_severity={test_severity!r} is not valid; choose one of {list(SEVERITIES)}")
        if not isinstance(download, bool):
            raise InputError(f"dataset.download={download!r} is not valid; expected true or false")
        self.root = root
        self.download = download
        self.val_holdout = val_holdout
        self.test_corruption = test_corruption
        self.test_severity = test_severity
        self.train_transform = self.test_transform = None
        self.raw_test: Dataset | None = None  # the test images before any transform (set by read_splits)

    def attach(self, backbone) -> None:
        super().attach(backbone)
        self.train_transform, self.test_transform = image_transforms(backbone, self.test_crop_pct)

    def required(self, root: Path) -> list[str]:  # pragma: no cover - abstract
        """The files and directories (ending in ``/``) that must exist under ``root``, relative to it."""
        raise NotImplementedError

    def missing(self, root: Path) -> list[str]:
        exists = lambda r: (root / r).is_dir() if r.endswith("/") else (root / r).is_file()  # noqa: E731
        return [r for r in self.required(root) if not exists(r)]

    def fetch(self, root: Path) -> None:  # pragma: no cover - abstract
        """Downloads the dataset to ``root`` (torchvision)."""
        raise NotImplementedError

    def read_raw(self, root: Path) -> dict[str, Dataset]:  # pragma: no cover - abstract
        """``train``, ``val`` (or None to hold out of train) and ``test`` datasets of (PIL image, label), read
        from ``root`` (where ``required`` exists) and checked."""
        raise NotImplementedError

    def resolved_root(self) -> Path:
        return Path(self.root).expanduser() if self.root else cache_root("data", self.name)

    def load_raw(self) -> dict[str, Dataset]:
        """The raw splits; what is missing is downloaded first (``download``), or one error says what is
        missing where and how to provide it."""
        root = self.resolved_root()
        configured = f"{self.key}.root={self.root}" if self.root else f"{self.key}.root=null ({root})"
        provide = f"set {self.key}.root to a directory holding {self.LAYOUT}"
        missing = self.missing(root)
        if missing and self.download and self.downloadable:
            log.info("%s: %s lacks %s; downloading", self.what, root, missing)
            try:
                self.fetch(root)
            except Exception as err:  # torchvision raises RuntimeError, URLError, OSError, ... when offline
                raise InputError(
                    f"{self.what}: {configured} lacks {missing} and downloading them there failed "
                    f"({one_line(err)}); without network {provide}"
                ) from None
            missing = self.missing(root)
        if missing:
            if self.downloadable and not self.download:
                provide += f", or {self.key}.download=true to download it there"
            raise InputError(f"{self.what}: {configured} lacks {missing}; {provide}")
        try:
            return self.read_raw(root)
        except OSError as err:  # a file that cannot be read (permissions, I/O error, ...)
            raise InputError(f"{self.what}: cannot read {configured} ({one_line(err)})") from None

    def read_splits(self) -> dict[str, Dataset]:
        raw = self.load_raw()
        if raw.get("val") is None:
            raw["train"], raw["val"] = hold_out(
                raw["train"], self.val_holdout, self.subset_seed, f"{self.key}.val_holdout"
            )
            held = f"{self.key}.val_holdout={self.val_holdout}"
            self.notes.update(
                train=f"the training images less the {held} held out for validation",
                val=f"the {held} images held out of the training images",
            )
        self.raw_test = raw["test"]
        return raw

    def verify_selected(self, selected) -> None:
        """Decodes every image file the chosen subsets read (once each)."""
        files = dict.fromkeys(f for dataset, indices in selected.values() for f in image_files(dataset, indices))
        decode_images(list(files), self.what)

    def load_splits(self) -> dict[str, Dataset]:
        if self.train_transform is None:
            raise RuntimeError(f"dataset {self.name}: call attach(backbone) before setup()")
        self.check_data()
        raw = self.parsed
        corrupt = None
        if self.test_corruption:
            corrupt = Corrupter(self.test_corruption, self.test_severity, self.corruption_seed)
        return {
            "train": Transformed(raw["train"], self.train_transform),
            "val": Transformed(raw["val"], self.test_transform),
            "test": Transformed(raw["test"], self.test_transform, corrupt),
        }

    def shifted_test(self, corruption: str, severity: int) -> Dataset:
        """The raw test images corrupted at their native size, then transformed as the clean test split."""
        self.setup()
        return Transformed(self.raw_test, self.test_transform, Corrupter(corruption, severity, self.corruption_seed))
