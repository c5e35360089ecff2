"""The paper's image datasets (Appendix D) plus the offline stand-ins CIFAR-10 (JPEG tree) and Fashion-MNIST.

Splits follow the paper (Table 8): Flowers102 and DTD use their official train/val/test (DTD partition 1);
Oxford Pets uses trainval/test with a seeded validation hold-out; CIFAR-100 and CIFAR-10 use train/test with
a seeded validation hold-out.

Local copies are read in the layout torchvision downloads to, by the readers here (the same examples, labels
and order as torchvision's dataset classes), which check every metadata file and name the file and line of
any error. Files are checked for existence and content, not for the official checksums, so a local copy (or a
test fixture) in the right layout always loads; downloads are still verified by torchvision.
"""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path

import numpy as np
from PIL import Image
from torch.utils.data import Dataset
from torchvision import datasets as tvd

from sve.data.checks import duplicates, one_line, read_utf8
from sve.data.options import is_int
from sve.data.vision import ImageFiles, VisionData
from sve.errors import InputError

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
DTD_CLASSES = (
    "banded",
    "blotchy",
    "braided",
    "bubbly",
    "bumpy",
    "chequered",
    "cobwebbed",
    "cracked",
    "crosshatched",
    "crystalline",
    "dotted",
    "fibrous",
    "flecked",
    "freckled",
    "frilly",
    "gauzy",
    "grid",
    "grooved",
    "honeycombed",
    "interlaced",
    "knitted",
    "lacelike",
    "lined",
    "marbled",
    "matted",
    "meshed",
    "paisley",
    "perforated",
    "pitted",
    "pleated",
    "polka-dotted",
    "porous",
    "potholed",
    "scaly",
    "smeared",
    "spiralled",
    "sprinkled",
    "stained",
    "stratified",
    "striped",
    "studded",
    "swirly",
    "veined",
    "waffled",
    "woven",
    "wrinkled",
    "zigzagged",
)
SPLITS = ("train", "val", "test")


class _Flowers102(tvd.Flowers102):
    """For downloading only (``fetch``); the existence-only check keeps torchvision from downloading again."""

    def _check_integrity(self) -> bool:
        names = [self._file_dict[k][0] for k in ("label", "setid")]
        return self._images_folder.is_dir() and all((self._base_folder / n).exists() for n in names)


def _lines(path: Path):
    """(line number, stripped text) of the non-blank lines of a UTF-8 text file."""
    for n, line in enumerate(read_utf8(path).splitlines(), 1):
        if line.strip():
            yield n, line.strip()


def _no_repeats(path: Path, keys: list, lines: list[int], what: str) -> None:
    repeated = duplicates(keys, lines)
    if repeated:
        key, first, again = repeated
        raise InputError(f"{path}, line {again}: {what} {key!r} is listed again (first on line {first}); each once")


def _mat_vector(path: Path, key: str, mat: dict | None = None) -> np.ndarray:
    """The integer vector ``key`` of a MATLAB file (as torchvision reads it: scipy, squeezed)."""
    from scipy.io import loadmat

    if mat is None:
        try:
            mat = loadmat(path, squeeze_me=True)
        except Exception as err:
            raise InputError(f"{path}: not a readable MATLAB .mat file ({one_line(err)})") from None
    if key not in mat:
        raise InputError(f"{path} has no variable {key!r} (it has {sorted(k for k in mat if not k.startswith('__'))})")
    values = np.atleast_1d(np.asarray(mat[key])).ravel()
    if values.size == 0 or not np.issubdtype(values.dtype, np.number) or not np.all(np.mod(values, 1) == 0):
        raise InputError(f"{path}: {key!r} must be a non-empty vector of integers, got {values.dtype} {values[:5]}")
    return values.astype(np.int64)


class Flowers102Data(VisionData):
    """Oxford Flowers 102: 1,020 train / 1,020 val / 6,149 test (official split)."""

    name = "flowers102"
    num_classes = 102
    LAYOUT = "flowers-102/{jpg/image_00001.jpg ..., imagelabels.mat, setid.mat} (torchvision Flowers102)"
    SETS = {"train": "trnid", "val": "valid", "test": "tstid"}

    def required(self, root):
        return ["flowers-102/jpg/", "flowers-102/imagelabels.mat", "flowers-102/setid.mat"]

    def fetch(self, root):
        _Flowers102(root, split="test", download=True)

    def read_raw(self, root):
        base = root / "flowers-102"
        labels_path, setid_path = base / "imagelabels.mat", base / "setid.mat"
        labels = _mat_vector(labels_path, "labels")  # 1-based class of image id i at position i - 1
        bad = np.flatnonzero((labels < 1) | (labels > self.num_classes))
        if bad.size:
            raise InputError(
                f"{labels_path}: 'labels' entry {bad[0] + 1} is {labels[bad[0]]}; expected classes "
                f"1..{self.num_classes}"
            )
        from scipy.io import loadmat

        try:
            setid = loadmat(setid_path, squeeze_me=True)
        except Exception as err:
            raise InputError(f"{setid_path}: not a readable MATLAB .mat file ({one_line(err)})") from None
        splits = {}
        for split, key in self.SETS.items():
            ids = _mat_vector(setid_path, key, setid)
            bad = np.flatnonzero((ids < 1) | (ids > len(labels)))
            if bad.size:
                raise InputError(
                    f"{setid_path}: {key!r} entry {bad[0] + 1} is image id {ids[bad[0]]}; "
                    f"{labels_path.name} labels ids 1..{len(labels)}"
                )
            repeated = duplicates(ids.tolist(), range(1, len(ids) + 1))
            if repeated:
                raise InputError(
                    f"{setid_path}: {key!r} lists image id {repeated[0]} twice (entries {repeated[1]} "
                    f"and {repeated[2]}); each image once"
                )
            files = [base / "jpg" / f"image_{i:05d}.jpg" for i in ids.tolist()]
            splits[split] = ImageFiles(files, [int(labels[i - 1]) - 1 for i in ids.tolist()])
        return splits


class DTDData(VisionData):
    """Describable Textures, partition ``partition`` (1 to 10): 1,880 / 1,880 / 1,880.

    The label of ``<class>/<image>.jpg`` is the class's position among the 47 DTD classes in alphabetical
    order (``DTD_CLASSES``); torchvision numbers the classes each split file lists, which is the same when a
    split has every class (the official partitions), and shifts the labels when one lacks a class."""

    name = "dtd"
    num_classes = 47
    LAYOUT = "dtd/dtd/{images/<class>/*.jpg, labels/{train,val,test}1.txt} (torchvision DTD)"

    def __init__(self, partition: int = 1, **kwargs):
        super().__init__(**kwargs)
        if not is_int(partition) or not 1 <= partition <= 10:
            raise InputError(f"dataset.partition={partition!r} is not valid; expected an integer in 1..10")
        self.partition = partition

    def required(self, root):
        return ["dtd/dtd/images/"] + [f"dtd/dtd/labels/{s}{self.partition}.txt" for s in SPLITS]

    def fetch(self, root):
        tvd.DTD(root, split="test", partition=self.partition, download=True)

    def read_raw(self, root):
        data = root / "dtd" / "dtd"
        splits = {}
        for split in SPLITS:
            path = data / "labels" / f"{split}{self.partition}.txt"
            files, labels, numbers = [], [], []
            for n, entry in _lines(path):
                parts = entry.split("/")
                if len(parts) != 2 or not all(parts):
                    raise InputError(f"{path}, line {n}: {entry!r} is not <class>/<image file>")
                if parts[0] not in DTD_CLASSES:
                    raise InputError(
                        f"{path}, line {n}: class {parts[0]!r} is not one of the 47 DTD classes "
                        f"({', '.join(DTD_CLASSES)})"
                    )
                files.append(data / "images" / parts[0] / parts[1])
                labels.append(DTD_CLASSES.index(parts[0]))
                numbers.append(n)
            if not files:
                raise InputError(f"{path} lists no images; expected one <class>/<image file> per line")
            _no_repeats(path, [f.relative_to(data / "images").as_posix() for f in files], numbers, "image")
            splits[split] = ImageFiles(files, labels)
        return splits


class OxfordPetsData(VisionData):
    """Oxford-IIIT Pets: 3,680 trainval (``val_holdout`` of them held out for validation) / 3,669 test."""

    name = "oxford_pets"
    num_classes = 37
    LAYOUT = "oxford-iiit-pet/{images/<Breed>_<n>.jpg, annotations/{trainval,test}.txt} (torchvision OxfordIIITPet)"

    def __init__(self, val_holdout: int = 368, **kwargs):
        super().__init__(val_holdout=val_holdout, **kwargs)

    def required(self, root):
        return [
            "oxford-iiit-pet/images/",
            "oxford-iiit-pet/annotations/trainval.txt",
            "oxford-iiit-pet/annotations/test.txt",
        ]

    def fetch(self, root):
        tvd.OxfordIIITPet(root, split="test", download=True)

    def read_raw(self, root):
        base = root / "oxford-iiit-pet"
        breeds: dict[str, tuple[int, Path, int]] = {}  # breed -> (label, file, line): one label per breed
        splits = {}
        for split, name in (("train", "trainval"), ("test", "test")):
            path = base / "annotations" / f"{name}.txt"
            ids, labels, numbers = [], [], []
            for n, entry in _lines(path):
                if entry.startswith("#"):
                    continue
                fields = entry.split()
                if (
                    len(fields) < 2
                    or not (fields[1].isascii() and fields[1].isdigit())
                    or not 1 <= int(fields[1]) <= self.num_classes
                ):
                    raise InputError(
                        f"{path}, line {n}: {entry!r} is not valid; expected <image name> <class id "
                        f"1..{self.num_classes}> <species> <breed id>"
                    )
                label, breed = int(fields[1]) - 1, fields[0].rsplit("_", 1)[0]
                first = breeds.setdefault(breed, (label, path, n))
                if first[0] != label:
                    raise InputError(
                        f"{path}, line {n}: {fields[0]} has class id {label + 1}, but {breed} images "
                        f"have class id {first[0] + 1} ({first[1]}, line {first[2]})"
                    )
                ids.append(fields[0])
                labels.append(label)
                numbers.append(n)
            if not ids:
                raise InputError(f"{path} lists no images")
            _no_repeats(path, ids, numbers, "image")
            splits[split] = ImageFiles([base / "images" / f"{i}.jpg" for i in ids], labels)
        return {"train": splits["train"], "val": None, "test": splits["test"]}


class CIFARImages(Dataset):
    """(PIL image, label) from (N, 32, 32, 3) uint8 arrays, as torchvision's CIFAR classes give them."""

    def __init__(self, data: np.ndarray, targets: list[int], classes: list[str]):
        self.data, self.targets, self.classes = data, targets, classes

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int):
        return Image.fromarray(self.data[i]), self.targets[i]


def _unpickle(path: Path):
    try:
        with open(path, "rb") as f:
            return pickle.load(f, encoding="latin1")
    except Exception as err:
        raise InputError(f"{path}: not a readable pickle of the CIFAR python release ({one_line(err)})") from None


def read_cifar(folder: Path, files: list[str], meta: tuple[str, str], num_classes: int) -> CIFARImages:
    """One split of the CIFAR python release (torchvision's reading: rows of 3072 bytes, channel-major),
    checked file by file."""
    data, targets = [], []
    for name in files:
        path = folder / name
        entry = _unpickle(path)
        key = "labels" if isinstance(entry, dict) and "labels" in entry else "fine_labels"
        if not isinstance(entry, dict) or "data" not in entry or key not in entry:
            raise InputError(
                f"{path}: expected a dict with 'data' and '{key}' (the CIFAR python release), got "
                f"{sorted(entry) if isinstance(entry, dict) else type(entry).__name__}"
            )
        images, labels = np.asarray(entry["data"]), np.asarray(entry[key])
        if images.dtype != np.uint8 or images.ndim != 2 or images.shape[1] != 3072:
            raise InputError(
                f"{path}: 'data' is {images.dtype} of shape {images.shape}; expected uint8 of shape "
                "(N, 3072), one 32x32x3 image per row"
            )
        if labels.ndim != 1 or len(labels) != len(images):
            raise InputError(f"{path}: {len(images)} images but '{key}' has shape {labels.shape}; one label per image")
        if len(labels) and (
            not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0 or labels.max() >= num_classes
        ):
            values = labels.tolist()
            bad = next(i for i, v in enumerate(values) if not is_int(v) or not 0 <= v < num_classes)
            raise InputError(
                f"{path}: label {values[bad]!r} of image {bad} is not valid; expected an integer in "
                f"0..{num_classes - 1}"
            )
        data.append(images)
        targets.extend(labels.tolist())
    meta_path = folder / meta[0]
    names = _unpickle(meta_path)
    if not isinstance(names, dict) or meta[1] not in names or len(names[meta[1]]) != num_classes:
        raise InputError(f"{meta_path}: expected '{meta[1]}' with the {num_classes} class names")
    images = np.vstack(data).reshape(-1, 3, 32, 32).transpose((0, 2, 3, 1))  # HWC
    return CIFARImages(images, targets, list(names[meta[1]]))


class CIFAR100Data(VisionData):
    """CIFAR-100: 50,000 train (``val_holdout`` held out) / 10,000 test, upsampled to the backbone's size."""

    name = "cifar100"
    num_classes = 100
    test_crop_pct = 1.0
    LAYOUT = "cifar-100-python/{train,test,meta} (the python pickle release, as torchvision downloads it)"

    def __init__(self, val_holdout: int = 5000, **kwargs):
        super().__init__(val_holdout=val_holdout, **kwargs)

    def required(self, root):
        return ["cifar-100-python/train", "cifar-100-python/test", "cifar-100-python/meta"]

    def fetch(self, root):
        tvd.CIFAR100(root, train=False, download=True)

    def read_raw(self, root):
        folder, meta = root / "cifar-100-python", ("meta", "fine_label_names")
        return {
            "train": read_cifar(folder, ["train"], meta, self.num_classes),
            "val": None,
            "test": read_cifar(folder, ["test"], meta, self.num_classes),
        }


class CIFAR10Data(VisionData):
    """CIFAR-10 (the OOD set for CIFAR-100, and the CIFAR ResNets' task).

    ``root`` is either an ImageFolder tree ``train/<class>/*.jpg``, ``test/<class>/*.jpg`` (e.g.
    ``../shared/data/cifar10_jpg.tar.gz`` unpacked; classes in alphabetical order, which is also the
    official label order; each split must have exactly the 10 class folders) or the torchvision pickle
    release ``cifar-10-batches-py/``.
    """

    name = "cifar10"
    num_classes = 10
    test_crop_pct = 1.0
    LAYOUT = (
        "either train/<class>/*.jpg and test/<class>/*.jpg (ImageFolder; e.g. tar -xzf "
        "../shared/data/cifar10_jpg.tar.gz -C DIR) or cifar-10-batches-py/ (torchvision's pickle release)"
    )
    PICKLES = [f"data_batch_{i}" for i in range(1, 6)]

    def __init__(self, val_holdout: int = 5000, **kwargs):
        super().__init__(val_holdout=val_holdout, **kwargs)

    @staticmethod
    def is_tree(root: Path) -> bool:
        """An ImageFolder tree: both splits there, or one of them and no pickle release."""
        has = [(root / s).is_dir() for s in ("train", "test")]
        return all(has) or (any(has) and not (root / "cifar-10-batches-py").is_dir())

    def required(self, root):
        if self.is_tree(root):
            return ["train/", "test/"]
        return [f"cifar-10-batches-py/{n}" for n in self.PICKLES + ["test_batch", "batches.meta"]]

    def fetch(self, root):
        tvd.CIFAR10(root, train=False, download=True)

    def read_raw(self, root):
        if self.is_tree(root):
            return {"train": self.read_tree(root / "train"), "val": None, "test": self.read_tree(root / "test")}
        folder, meta = root / "cifar-10-batches-py", ("batches.meta", "label_names")
        return {
            "train": read_cifar(folder, self.PICKLES, meta, self.num_classes),
            "val": None,
            "test": read_cifar(folder, ["test_batch"], meta, self.num_classes),
        }

    def read_tree(self, folder: Path) -> tvd.ImageFolder:
        """One split of the JPEG tree; its class folders must be exactly the 10 classes (ImageFolder numbers
        the folders it finds: 9 would shift the labels, 11 would make a label 10)."""
        found = sorted(e.name for e in os.scandir(folder) if e.is_dir())  # as ImageFolder finds its classes
        if tuple(found) != CIFAR10_CLASSES:
            lacks = [c for c in CIFAR10_CLASSES if c not in found]
            extra = [c for c in found if c not in CIFAR10_CLASSES]
            raise InputError(
                f"{self.what}: {folder} has {len(found)} class folders where the 10 CIFAR-10 classes "
                f"{list(CIFAR10_CLASSES)} are expected: missing {lacks}, extra {extra}"
            )
        try:
            return tvd.ImageFolder(folder)
        except Exception as err:  # e.g. a class folder without image files
            raise InputError(f"{self.what}: cannot read the image tree {folder} ({one_line(err)})") from None


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (the MNIST format, optionally gzipped) as a uint8 array of its declared shape."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except Exception as err:  # a bad or truncated gzip stream
        raise InputError(
            f"{path}: cannot be read ({one_line(err)}); expected an IDX file"
            f"{', gzipped' if path.suffix == '.gz' else ''}"
        ) from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise InputError(
            f"{path}: not an IDX file (it starts with bytes {data[:4].hex(' ') or 'none'}; expected "
            "00 00 08 <number of dimensions>)"
        )
    ndim = data[3]  # magic: 0, 0, dtype code (0x08 = uint8), number of dimensions
    if data[2] != 0x08:
        raise InputError(f"{path}: only uint8 IDX files are supported (type code {data[2]:#x})")
    offset = 4 + 4 * ndim
    if len(data) < offset:
        raise InputError(f"{path}: truncated IDX header ({len(data)} bytes for {ndim} dimensions)")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    if len(data) - offset != int(np.prod(shape)):
        raise InputError(
            f"{path}: the header declares shape {shape} ({int(np.prod(shape))} bytes of data) but "
            f"{len(data) - offset} bytes follow it; the file is truncated or corrupt"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(shape)


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
    downloadable = False
    LAYOUT = (
        "{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (apt-get install dataset-fashion-mnist "
        "installs them in /usr/share/datasets/fashion-mnist)"
    )
    STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

    def __init__(
        self,
        root: str | None = "/usr/share/datasets/fashion-mnist",
        download: bool = False,
        val_holdout: int = 5000,
        **kwargs,
    ):
        super().__init__(root=root, download=download, val_holdout=val_holdout, **kwargs)  # nothing to download

    @staticmethod
    def find(root: Path, stem: str) -> Path | None:
        for name in (stem + ".gz", stem):
            if (root / name).is_file():
                return root / name
        return None

    def missing(self, root):
        return [f"{stem}[.gz]" for stem in self.STEMS if self.find(root, stem) is None]

    def read_raw(self, root):
        def split(prefix: str) -> ArrayImages:
            images_path = self.find(root, f"{prefix}-images-idx3-ubyte")
            labels_path = self.find(root, f"{prefix}-labels-idx1-ubyte")
            images, labels = read_idx(images_path), read_idx(labels_path)
            if images.ndim != 3:
                raise InputError(f"{images_path}: images of shape {images.shape}; expected (N, height, width)")
            if labels.shape != (len(images),):
                raise InputError(
                    f"{labels_path}: labels of shape {labels.shape} for the {len(images)} images of "
                    f"{images_path.name}; expected ({len(images)},)"
                )
            if labels.max() >= self.num_classes:
                bad = int(np.flatnonzero(labels >= self.num_classes)[0])
                raise InputError(
                    f"{labels_path}: label {labels[bad]} of image {bad} is not valid; expected 0.."
                    f"{self.num_classes - 1}"
                )
            return ArrayImages(images, labels)

        return {"train": split("train"), "val": None, "test": split("t10k")}


__all__ = [
    "Flowers102Data",
    "DTDData",
    "OxfordPetsData",
    "CIFAR100Data",
    "CIFAR10Data",
    "FashionMNISTData",
    "ArrayImages",
    "CIFARImages",
    "CIFAR10_CLASSES",
    "DTD_CLASSES",
    "read_idx",
]
