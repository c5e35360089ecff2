"""The paper's image datasets (Appendix D) plus the offline stand-ins CIFAR-10 (JPEG tree) and Fashion-MNIST.

Splits follow the paper (Table 8): Flowers102 and DTD use their official train/val/test (DTD partition 1);
Oxford Pets uses trainval/test with a seeded validation hold-out; CIFAR-100 and CIFAR-10 use train/test with
a seeded validation hold-out.

Local copies are read in the layout torchvision downloads to. Files are checked for existence, not for the
official checksums, so a local copy (or a test fixture) in the right layout always loads; downloads are still
verified by torchvision.
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset
from torchvision import datasets as tvd

from sve.data.vision import VisionData


class _Flowers102(tvd.Flowers102):
    def _check_integrity(self) -> bool:
        names = [self._file_dict[k][0] for k in ("label", "setid")]
        return self._images_folder.is_dir() and all((self._base_folder / n).exists() for n in names)


class _CIFAR10(tvd.CIFAR10):
    def _check_integrity(self) -> bool:
        folder = Path(self.root) / self.base_folder
        return all((folder / name).exists() for name, _ in self.train_list + self.test_list)

    def _load_meta(self) -> None:  # the parent checks the meta file's checksum
        with open(Path(self.root) / self.base_folder / self.meta["filename"], "rb") as f:
            self.classes = pickle.load(f, encoding="latin1")[self.meta["key"]]
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}


class _CIFAR100(_CIFAR10, tvd.CIFAR100):
    """CIFAR-100 with the existence-only check (MRO: our overrides, then CIFAR-100's file lists)."""


class Flowers102Data(VisionData):
    """Oxford Flowers 102: 1,020 train / 1,020 val / 6,149 test (official split)."""

    name = "flowers102"
    num_classes = 102
    LAYOUT = "flowers-102/{jpg/image_00001.jpg ..., imagelabels.mat, setid.mat} (torchvision Flowers102)"

    def raw_splits(self, root, download):
        return {s: _Flowers102(root, split=s, download=download) for s in ("train", "val", "test")}


class DTDData(VisionData):
    """Describable Textures, partition ``partition`` (1 to 10): 1,880 / 1,880 / 1,880."""

    name = "dtd"
    num_classes = 47
    LAYOUT = "dtd/dtd/{images/<class>/*.jpg, labels/{train,val,test}1.txt} (torchvision DTD)"

    def __init__(self, partition: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.partition = partition

    def raw_splits(self, root, download):
        make = lambda s: tvd.DTD(root, split=s, partition=self.partition, download=download)  # noqa: E731
        return {s: make(s) for s in ("train", "val", "test")}


class OxfordPetsData(VisionData):
    """Oxford-IIIT Pets: 3,680 trainval (``val_holdout`` of them held out for validation) / 3,669 test."""

    name = "oxford_pets"
    num_classes = 37
    LAYOUT = (
        "oxford-iiit-pet/{images/<Breed>_<n>.jpg, annotations/{trainval,test}.txt} (torchvision OxfordIIITPet)"
    )

    def __init__(self, val_holdout: int = 368, **kwargs):
        super().__init__(val_holdout=val_holdout, **kwargs)

    def raw_splits(self, root, download):
        make = lambda s: tvd.OxfordIIITPet(root, split=s, download=download)  # noqa: E731
        return {"train": make("trainval"), "val": None, "test": make("test")}


class CIFAR100Data(VisionData):
    """CIFAR-100: 50,000 train (``val_holdout`` held out) / 10,000 test, upsampled to the backbone's size."""

    name = "cifar100"
    num_classes = 100
    test_crop_pct = 1.0
    LAYOUT = "cifar-100-python/{train,test,meta} (the python pickle release, as torchvision downloads it)"

    def __init__(self, val_holdout: int = 5000, **kwargs):
        super().__init__(val_holdout=val_holdout, **kwargs)

    def raw_splits(self, root, download):
        make = lambda train: _CIFAR100(root, train=train, download=download)  # noqa: E731
        return {"train": make(True), "val": None, "test": make(False)}


class CIFAR10Data(VisionData):
    """CIFAR-10 (the OOD set for CIFAR-100, and the CIFAR ResNets' task).

    ``root`` is either an ImageFolder tree ``train/<class>/*.jpg``, ``test/<class>/*.jpg`` (e.g.
    ``../shared/data/cifar10_jpg.tar.gz`` unpacked; classes in alphabetical order, which is also the
    official label order) or the torchvision pickle release ``cifar-10-batches-py/``.
    """

    name = "cifar10"
    num_classes = 10
    test_crop_pct = 1.0
    LAYOUT = (
        "either train/<class>/*.jpg and test/<class>/*.jpg (ImageFolder; e.g. tar -xzf "
        "../shared/data/cifar10_jpg.tar.gz -C DIR) or cifar-10-batches-py/ (torchvision's pickle release)"
    )

    def __init__(self, val_holdout: int = 5000, **kwargs):
        super().__init__(val_holdout=val_holdout, **kwargs)

    def raw_splits(self, root, download):
        if (root / "test").is_dir() and (root / "train").is_dir():
            return {"train": tvd.ImageFolder(root / "train"), "val": None, "test": tvd.ImageFolder(root / "test")}
        make = lambda train: _CIFAR10(root, train=train, download=download)  # noqa: E731
        return {"train": make(True), "val": None, "test": make(False)}


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (the MNIST format, optionally gzipped) as a uint8 array of its declared shape."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]  # magic: 0, 0, dtype code (0x08 = uint8), number of dimensions
    if data[2] != 0x08:
        raise ValueError(f"{path}: only uint8 IDX files are supported (type code {data[2]:#x})")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


class ArrayImages(Dataset):
    """(N, H, W[, 3]) uint8 images with labels; items are (array, label), made PIL/RGB by the transform."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.images[i], int(self.labels[i])


class FashionMNISTData(VisionData):
    """Fashion-MNIST from the Debian package ``dataset-fashion-mnist`` (60,000 / 10,000, 28x28 grayscale,
    made 3-channel). ``download`` is not offered: install the package or point ``root`` at the four files."""

    name = "fashion_mnist"
    num_classes = 10
    test_crop_pct = 1.0
    LAYOUT = (
        "{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (apt-get install dataset-fashion-mnist "
        "installs them in /usr/share/datasets/fashion-mnist)"
    )

    def __init__(
        self, root: str | None = "/usr/share/datasets/fashion-mnist", download: bool = False, val_holdout: int = 5000,
        **kwargs,
    ):  # fmt: skip
        super().__init__(root=root, download=download, val_holdout=val_holdout, **kwargs)  # nothing to download

    def raw_splits(self, root, download):
        def find(stem: str) -> Path:
            for name in (stem + ".gz", stem):
                if (root / name).exists():
                    return root / name
            raise FileNotFoundError(f"{root / stem}[.gz] not found")

        def split(prefix: str) -> ArrayImages:
            images = read_idx(find(f"{prefix}-images-idx3-ubyte"))
            return ArrayImages(images, read_idx(find(f"{prefix}-labels-idx1-ubyte")))

        return {"train": split("train"), "val": None, "test": split("t10k")}


__all__ = [
    "Flowers102Data",
    "DTDData",
    "OxfordPetsData",
    "CIFAR100Data",
    "CIFAR10Data",
    "FashionMNISTData",
    "ArrayImages",
    "read_idx",
]
