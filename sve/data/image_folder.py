"""Your own images, with no code (``dataset=image_folder``): any image folder tree or ``datasets`` image dataset.

``ImageFolderData`` reads ``root/train/<class>/<image>`` and ``root/test/<class>/<image>`` (torchvision's
ImageFolder layout), and ``root/val/<class>/...`` (or ``validation/``) if there is one; otherwise ``val_holdout``
training images are held out. The classes are the training split's class folders in sorted order; validation and
test may lack a class (a small test set), never have one that training lacks, and every split keeps the training
split's numbering (ImageFolder alone numbers the folders each split has, so a test set without one class would shift
every label after it). With ``hub_name`` (or a saved ``datasets`` directory as ``root``) the images come from
``image_column``, the classes from ``label_column``: a ``ClassLabel``'s names, or the training split's values in
sorted order.
"""

from __future__ import annotations

import io
import logging
import os
from pathlib import Path

import torch
from PIL import Image
from torchvision import datasets as tvd

from sve.data.checks import load_hub_dataset, one_line
from sve.data.user_data import (
    TEXT_SPLITS,
    check_declared,
    declared,
    default_holdout,
    distinct_labels,
    label_value,
    load_saved,
    saved_datasets,
    unknown_label,
)
from sve.data.vision import VisionData, load_rgb, rgb
from sve.errors import InputError

log = logging.getLogger(__name__)

VAL_DIRS = ("val", "validation")

# torchvision's image extensions, and the other still-image formats PIL reads (a GIF gives its first frame).
IMAGE_EXTENSIONS = tuple(sorted(set(tvd.folder.IMG_EXTENSIONS) | {".gif", ".jfif", ".jpe"}))


class ClassFolder(tvd.ImageFolder):
    """An ImageFolder split numbered by ``classes`` (the training split's), not by the folders it has."""

    def __init__(self, root: Path, classes: list[str], allow_empty: bool):
        self.fixed_classes = list(classes)
        self.skipped: dict[str, int] = {}  # files that are not images (hidden ones aside), by extension
        super().__init__(str(root), loader=load_rgb, allow_empty=allow_empty, is_valid_file=self.is_valid)

    def is_valid(self, path: str) -> bool:
        """``is_image_file``, counting the other files as ImageFolder's walk meets them."""
        if is_image_file(path):
            return True
        name = os.path.basename(path)
        if not name.startswith("."):
            suffix = Path(name).suffix.lower() or "(none)"
            self.skipped[suffix] = self.skipped.get(suffix, 0) + 1
        return False

    def find_classes(self, directory):
        return self.fixed_classes, {name: i for i, name in enumerate(self.fixed_classes)}


def is_image_file(path: str) -> bool:
    """An image by its extension, hidden files left out: macOS copies leave ``._<name>.jpg`` files beside the
    images that hold no image."""
    name = os.path.basename(path)
    return not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS)


def class_folders(folder: Path) -> list[str]:
    """The class folders of a split, hidden ones (``.ipynb_checkpoints``, say) left out, in sorted order; folders
    all named by integers in numeric order (``2`` before ``10``, as ``text_table`` numbers integer labels)."""
    names = [entry.name for entry in os.scandir(folder) if entry.is_dir() and not entry.name.startswith(".")]
    numeric = bool(names) and all(name.isdigit() for name in names)
    return sorted(names, key=int if numeric else None)


class ImageFolderData(VisionData):
    """Any image classification data in ImageFolder layout, or a ``datasets`` image dataset (module docstring).

    Args:
        root: the directory holding ``train/`` and ``test/`` (and optionally ``val/``), or a ``datasets``
            ``save_to_disk`` directory.
        val_holdout: training images held out for validation when there is no ``val/``; null: a tenth.
        hub_name, hub_config: a Hugging Face hub image dataset (``beans``, ``food101``, ...) instead of a root.
        test_split: the split tested on (a hub or saved dataset's; ``validation`` where there is no test split).
        image_column, label_column: the columns of a hub or saved dataset.
    """

    name = "image_folder"
    downloadable = False
    LAYOUT = (
        "train/<class>/<image> and test/<class>/<image>, and optionally val/<class>/<image> (torchvision's "
        "ImageFolder layout; without val/, dataset.val_holdout training images are held out), or a datasets "
        "save_to_disk directory; or set dataset.hub_name= a hub image dataset"
    )

    def __init__(
        self,
        root: str | None = None,
        val_holdout: int | None = None,
        num_classes: int | None = None,
        hub_name: str | None = None,
        hub_config: str | None = None,
        test_split: str = "test",
        image_column: str = "image",
        label_column: str = "label",
        **kwargs,
    ):
        super().__init__(root=root, download=False, val_holdout=val_holdout, **kwargs)
        self.classes: list[str] | None = None
        self.declared_classes = declared(num_classes)
        if root is not None and hub_name:
            raise InputError(f"dataset.root={root} and dataset.hub_name={hub_name} both name the data; set one")
        self.hub_name, self.hub_config, self.test_split = hub_name, hub_config, test_split
        self.image_column, self.label_column = image_column, label_column

    @property
    def num_classes(self) -> int:
        if self.classes is None and self.declared_classes is None:  # read with the data: train/'s folders
            self.check_data()
        return len(self.classes) if self.classes is not None else self.declared_classes

    def class_names(self) -> list[str] | None:
        return list(self.classes) if self.classes is not None else None

    def required(self, root):
        return [] if self.hub_name or saved_datasets(root) else ["train/", "test/"]

    def read_split(self, folder: Path, classes: list[str], allow_empty: bool) -> ClassFolder:
        try:
            split = ClassFolder(folder, classes, allow_empty)
        except Exception as err:  # a class folder without image files, an unreadable directory
            raise InputError(f"{self.what}: cannot read the image tree {folder} ({one_line(err)})") from None
        skipped = split.skipped
        if skipped:  # a warning: notes and thumbnails beside the images are common; an unread format is not
            log.warning(
                "%s: %d file(s) in %s are not read as images (%s); the readable extensions are %s",
                self.what,
                sum(skipped.values()),
                folder,
                ", ".join(f"{n} {ext}" for ext, n in sorted(skipped.items())),
                " ".join(IMAGE_EXTENSIONS),
            )
        return split

    def read_raw(self, root):
        if self.hub_name or saved_datasets(root):
            return self.read_datasets(root)
        classes = class_folders(root / "train")
        if len(classes) < 2:
            raise InputError(
                f"{self.what}: {root / 'train'} has {len(classes)} class folder(s) {classes}; "
                "a classification needs at least 2 (train/<class>/<image>)"
            )
        check_declared(self.declared_classes, len(classes), f"{root / 'train'} has {len(classes)} class folders")
        self.classes = classes
        val = next((root / d for d in VAL_DIRS if (root / d).is_dir()), None)
        splits = {"train": self.read_split(root / "train", classes, allow_empty=False), "val": None}
        for split, folder in (("val", val), ("test", root / "test")):
            if folder is None:
                continue
            extra = [c for c in class_folders(folder) if c not in classes]
            if extra:
                raise InputError(
                    f"{self.what}: {folder} has class folders that {root / 'train'} lacks: {extra}; "
                    f"every class must have training images (the classes are {classes})"
                )
            splits[split] = self.read_split(folder, classes, allow_empty=True)
        if splits["val"] is None and self.val_holdout is None:
            self.val_holdout = default_holdout(len(splits["train"]))
        return splits

    def read_datasets(self, root: Path) -> dict:
        """The splits of a hub image dataset or a ``save_to_disk`` directory, numbered by the training split's
        labels: a ``ClassLabel``'s names in its order, other labels in sorted order (as ``text_table``)."""
        if self.hub_name:
            instead = "set dataset.root to an image tree (train/<class>/<image>) or a save_to_disk directory"
            ds, source = load_hub_dataset(self.hub_name, self.hub_config, self.what, instead), self.hub_name
        else:
            ds, source = load_saved(root, self.what), str(root)
        val = next((name for name in TEXT_SPLITS["val"] if name in ds and name != self.test_split), None)
        for name in ("train", self.test_split):
            if name not in ds:
                raise InputError(
                    f"{self.what}: {source} has no split {name!r}; its splits are {list(ds)} "
                    "(dataset.test_split names the tested one)"
                )
        for name in ("train", self.test_split, val):
            absent = [c for c in (self.image_column, self.label_column) if name and c not in ds[name].column_names]
            if absent:
                raise InputError(
                    f"{self.what}: {source} {name} has no column {absent}; its columns are "
                    f"{ds[name].column_names} (set dataset.image_column and dataset.label_column)"
                )
        names = getattr(ds["train"].features.get(self.label_column), "names", None)
        train_labels = [label_value(v) for v in ds["train"][self.label_column]]
        values = (
            list(range(len(names)))
            if names
            else distinct_labels(train_labels, self.what, f"{source} train", self.label_column)
        )
        check_declared(self.declared_classes, len(values), f"{source} train has {len(values)} labels")
        self.classes = [str(n) for n in names] if names else [str(v) for v in values]
        index = {v: i for i, v in enumerate(values)}
        splits = {"val": None}
        for split, name in (("train", "train"), ("val", val), ("test", self.test_split)):
            if name is None:
                continue
            labels = train_labels if name == "train" else [label_value(v) for v in ds[name][self.label_column]]
            unknown = next(((i, v) for i, v in enumerate(labels) if v not in index), None)
            if unknown is not None:
                raise unknown_label(f"{self.what}: {source} {name}, row {unknown[0] + 1}", unknown[1], values)
            splits[split] = ImageRows(
                ds[name].select_columns([self.image_column]), self.image_column, [index[v] for v in labels]
            )
        if splits["val"] is None and self.val_holdout is None:
            self.val_holdout = default_holdout(len(splits["train"]))
        return splits


class ImageRows(torch.utils.data.Dataset):
    """(RGB PIL image, label) rows of a ``datasets`` split whose image column holds decoded images, file paths
    or ``{"bytes", "path"}`` records."""

    def __init__(self, rows, column: str, labels: list[int]):
        self.rows, self.column, self.labels = rows, column, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        image = self.rows[i][self.column]
        if isinstance(image, dict):  # an undecoded Image feature: its bytes, else its file
            image = io.BytesIO(image["bytes"]) if image.get("bytes") else image.get("path")
        if not isinstance(image, Image.Image):
            image = Image.open(image)
        return rgb(image), self.labels[i]
