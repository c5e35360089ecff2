"""Your own data, with no code: any image folder tree or ``datasets`` image dataset (``dataset=image_folder``)
and any table of texts (``dataset=text_table``: local CSV, TSV, JSON lines or Parquet files, or a Hugging Face
hub dataset). Both also read a ``datasets`` ``save_to_disk`` directory given as ``root``.

Both read their classes from the data, so ``num_classes`` is whatever the training split holds:

- ``ImageFolderData``: ``root/train/<class>/<image>`` and ``root/test/<class>/<image>`` (torchvision's
  ImageFolder layout), and ``root/val/<class>/...`` (or ``validation/``) if there is one; otherwise
  ``val_holdout`` training images are held out. The classes are the training split's class folders in sorted
  order; validation and test may lack a class (a small test set), never have one that training lacks, and
  every split keeps the training split's numbering (ImageFolder alone numbers the folders each split has, so
  a test set without one class would shift every label after it). With ``hub_name`` (or a saved
  ``datasets`` directory as ``root``) the images come from ``image_column``, the classes from
  ``label_column``: a ``ClassLabel``'s names, or the training split's values in sorted order.
- ``TextTableData``: ``root/train.<ext>`` and ``root/test.<ext>`` (and ``validation``/``val``/``dev``), or
  the splits of ``hub_name``/``hub_config``; ``text_column`` names the text (two columns: a sentence pair,
  tokenised as a pair), ``label_column`` the label. The labels, integers or strings, are numbered in sorted
  order of the training split's distinct values (``label_names``); a validation or test label that training
  lacks is an error naming the file and the row.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
from pathlib import Path

import torch
from PIL import Image
from torchvision import datasets as tvd

from sve.data.base import TextClassificationData
from sve.data.checks import check_count, load_hub_dataset, one_line
from sve.data.vision import VisionData, hold_out, load_rgb, rgb
from sve.errors import InputError

log = logging.getLogger(__name__)

VAL_DIRS = ("val", "validation")
TEXT_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
TEXT_SPLITS = {"train": ("train",), "val": ("validation", "val", "dev"), "test": ("test",)}


def declared(num_classes) -> int | None:
    """``dataset.num_classes`` as given: None (read from the data) or an integer of at least 2."""
    check_count("dataset.num_classes", num_classes, minimum=2, null=True)
    return num_classes


def check_declared(num_classes: int | None, found: int, what: str) -> None:
    """A declared class count must be what the data has (a run planned or built on it would be wrong)."""
    if num_classes is not None and num_classes != found:
        raise InputError(f"dataset.num_classes={num_classes} but {what}; set dataset.num_classes={found} or null")


def default_holdout(size: int) -> int:
    """A tenth of the training examples (at least one) when the data has no validation split."""
    return max(1, size // 10)


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
    LAYOUT = ("train/<class>/<image> and test/<class>/<image>, and optionally val/<class>/<image> (torchvision's "
              "ImageFolder layout; without val/, dataset.val_holdout training images are held out), or a datasets "
              "save_to_disk directory; or set dataset.hub_name= a hub image dataset")  # fmt: skip

    def __init__(self, root: str | None = None, val_holdout: int | None = None, num_classes: int | None = None,
                 hub_name: str | None = None, hub_config: str | None = None, test_split: str = "test",
                 image_column: str = "image", label_column: str = "label", **kwargs):  # fmt: skip
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
            log.warning("%s: %d file(s) in %s are not read as images (%s); the readable extensions are %s",
                        self.what, sum(skipped.values()), folder,
                        ", ".join(f"{n} {ext}" for ext, n in sorted(skipped.items())), " ".join(IMAGE_EXTENSIONS))
        return split

    def read_raw(self, root):
        if self.hub_name or saved_datasets(root):
            return self.read_datasets(root)
        classes = class_folders(root / "train")
        if len(classes) < 2:
            raise InputError(f"{self.what}: {root / 'train'} has {len(classes)} class folder(s) {classes}; "
                             "a classification needs at least 2 (train/<class>/<image>)")  # fmt: skip
        check_declared(self.declared_classes, len(classes), f"{root / 'train'} has {len(classes)} class folders")
        self.classes = classes
        val = next((root / d for d in VAL_DIRS if (root / d).is_dir()), None)
        splits = {"train": self.read_split(root / "train", classes, allow_empty=False), "val": None}
        for split, folder in (("val", val), ("test", root / "test")):
            if folder is None:
                continue
            extra = [c for c in class_folders(folder) if c not in classes]
            if extra:
                raise InputError(f"{self.what}: {folder} has class folders that {root / 'train'} lacks: {extra}; "
                                 f"every class must have training images (the classes are {classes})")  # fmt: skip
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
                raise InputError(f"{self.what}: {source} has no split {name!r}; its splits are {list(ds)} "
                                 "(dataset.test_split names the tested one)")  # fmt: skip
        for name in ("train", self.test_split, val):
            absent = [c for c in (self.image_column, self.label_column) if name and c not in ds[name].column_names]
            if absent:
                raise InputError(f"{self.what}: {source} {name} has no column {absent}; its columns are "
                                 f"{ds[name].column_names} (set dataset.image_column and dataset.label_column)")
        names = getattr(ds["train"].features.get(self.label_column), "names", None)
        train_labels = [label_value(v) for v in ds["train"][self.label_column]]
        values = (list(range(len(names))) if names else
                  distinct_labels(train_labels, self.what, f"{source} train", self.label_column))  # fmt: skip
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
            splits[split] = ImageRows(ds[name].select_columns([self.image_column]), self.image_column,
                                      [index[v] for v in labels])
        if splits["val"] is None and self.val_holdout is None:
            self.val_holdout = default_holdout(len(splits["train"]))
        return splits


def distinct_labels(labels, what: str, source: str, column: str) -> list:
    """The training split's distinct labels in sorted order (empty cells left out): at least 2, of one type."""
    distinct = {label for label in labels if not missing(label)}
    if len(distinct) < 2:
        raise InputError(f"{what}: {source} has {len(distinct)} distinct label(s) in column {column!r}; a "
                         "classification needs at least 2")  # fmt: skip
    try:
        return sorted(distinct)
    except TypeError:  # integers and strings mixed
        raise InputError(f"{what}: {source}: column {column!r} mixes label types "
                         f"({sorted({type(v).__name__ for v in distinct})})") from None  # fmt: skip


def unknown_label(where: str, label, known: list) -> InputError:
    """The error for a validation or test label that the training split lacks; ``where`` names the row."""
    return InputError(f"{where}: label {label!r} is not one of the training split's labels {known[:10]}"
                      f"{unlabelled(label)}")


def unlabelled(label) -> str:
    """The hint for label -1: how the hub marks an example without a label (GLUE's and others' test splits)."""
    if label != -1:
        return ""
    return ("; -1 marks an unlabelled example (the test splits of GLUE and other benchmarks hide their labels): "
            "test on a labelled split instead, e.g. dataset.test_split=validation")


def saved_datasets(root: Path | None) -> bool:
    """Whether ``root`` is a ``datasets`` ``save_to_disk`` directory of splits."""
    return root is not None and (Path(root) / "dataset_dict.json").is_file()


def load_saved(root: Path, what: str):
    import datasets

    try:
        return datasets.load_from_disk(str(root))
    except Exception as err:
        raise InputError(f"{what}: {root} cannot be read as a saved datasets.DatasetDict ({one_line(err)})") from None


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


# --- text tables --------------------------------------------------------------------------------------------


def label_value(value):
    """A label as read: integer-like strings and floats (CSV cells, JSON numbers) as integers, so that 2 sorts
    before 10; other values as they are."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def missing(value) -> bool:
    """An empty cell: None (JSON null), NaN (parquet, pandas) or a blank string (CSV, read without NA parsing)."""
    return value is None or (isinstance(value, float) and math.isnan(value)) or (isinstance(value, str)
                                                                               and not value.strip())


def read_table(path: Path, encoding: str = "utf-8"):
    """A local table as a pandas DataFrame, by its extension (TSV without quote handling, as GLUE's files).
    Text files are read in ``encoding``; a UTF-8 byte-order mark (Excel's "CSV UTF-8") is dropped."""
    import pandas as pd

    kind = TEXT_FORMATS[path.suffix.lower()]
    codec = "utf-8-sig" if encoding.lower().replace("_", "-") in ("utf-8", "utf8") else encoding
    try:
        if kind in ("csv", "tsv"):
            sep, quoting = ("\t", csv.QUOTE_NONE) if kind == "tsv" else (",", csv.QUOTE_MINIMAL)
            if kind == "csv":
                with open(path, encoding=codec) as f:
                    header = f.readline()
                if ";" in header and "," not in header:
                    # Excel in many European locales writes "CSV" with semicolons (the comma is the decimal mark).
                    log.info("%s: its header %r has ';' and no ',': read with ';' as the separator", path,
                             header.strip())
                    sep = ";"
            return pd.read_csv(path, sep=sep, quoting=quoting, keep_default_na=False, dtype=str, encoding=codec)
        if kind == "json":
            return pd.read_json(path, lines=path.suffix.lower() == ".jsonl", dtype=False, encoding=codec)
        return pd.read_parquet(path)
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: is not {encoding} text ({one_line(err)}); name its encoding with "
                         "dataset.encoding=, e.g. latin-1 or cp1252") from None
    except LookupError as err:  # an unknown encoding name
        raise InputError(f"dataset.encoding={encoding!r} is not an encoding Python knows ({one_line(err)}); "
                         "e.g. utf-8, latin-1, cp1252") from None
    except Exception as err:  # a malformed file: pandas' parser errors name the line
        raise InputError(f"{path}: cannot be read as {kind} ({one_line(err)})") from None


class TextTableData(TextClassificationData):
    """Any text classification table (module docstring).

    Args:
        root: a directory with ``train.<ext>`` and ``test.<ext>`` (and ``validation``/``val``/``dev``); ext one
            of csv, tsv, jsonl, json, parquet. None: ``hub_name`` with ``datasets``.
        hub_name, hub_config: a Hugging Face hub dataset with ``train`` and ``test`` splits (and
            ``validation``), e.g. ``imdb``; ``test_split`` names another test split.
        text_column: the text's column, or two columns for a sentence pair.
        label_column: the label's column (integers or strings).
        val_holdout: training rows held out for validation when there is no validation split; null: a tenth.
        encoding: the text encoding of local csv, tsv and json files (a UTF-8 byte-order mark is dropped).
    """

    name = "text_table"

    def __init__(self, root: str | None = None, hub_name: str | None = None, hub_config: str | None = None,
                 test_split: str = "test", text_column: str | list[str] = "text", label_column: str = "label",
                 val_holdout: int | None = None, num_classes: int | None = None, encoding: str = "utf-8",
                 **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.declared_classes = declared(num_classes)
        self.encoding = encoding
        columns = [text_column] if isinstance(text_column, str) else list(text_column)
        if not 1 <= len(columns) <= 2 or not all(isinstance(c, str) and c for c in columns):
            raise InputError(f"dataset.text_column={text_column!r} is not valid; expected a column name, or a list "
                             "of two (a sentence pair)")  # fmt: skip
        if root is None and not hub_name:
            raise InputError("dataset=text_table needs its data: set dataset.root=<a directory with train.csv and "
                             "test.csv (or .tsv, .jsonl, .json, .parquet)> or dataset.hub_name=<a hub dataset>")
        self.root, self.hub_name, self.hub_config, self.test_split = root, hub_name, hub_config, test_split
        self.text_columns, self.label_column, self.val_holdout = columns, label_column, val_holdout
        self.label_names: list | None = None
        self.hub_label_names: list[str] | None = None  # a hub dataset's ClassLabel names, label i named [i]

    @property
    def num_classes(self) -> int:
        if self.label_names is None and self.declared_classes is None:  # read with the data: train's labels
            self.check_data()
        return len(self.label_names) if self.label_names is not None else self.declared_classes

    def class_names(self) -> list | None:
        if self.label_names is None:
            return None
        named = self.hub_label_names
        if named and all(isinstance(v, int) and 0 <= v < len(named) for v in self.label_names):
            return [named[v] for v in self.label_names]  # a hub ClassLabel: "neg", "pos" rather than 0, 1
        return list(self.label_names)

    def local_files(self) -> dict[str, Path]:
        root = Path(self.root).expanduser()
        found = {}
        for split, stems in TEXT_SPLITS.items():
            candidates = [root / f"{stem}{ext}" for stem in stems for ext in TEXT_FORMATS]
            files = [path for path in candidates if path.is_file()]
            if len(files) > 1:
                raise InputError(f"{self.what}: {root} holds {len(files)} files for the {split} split "
                                 f"({[f.name for f in files]}); keep one")  # fmt: skip
            if files:
                found[split] = files[0]
        lacking = [s for s in ("train", "test") if s not in found]
        if lacking:
            raise InputError(f"{self.what}: dataset.root={self.root} lacks a {' and a '.join(lacking)} file; expected "
                             f"train.<ext> and test.<ext> with ext one of {', '.join(e[1:] for e in TEXT_FORMATS)}")
        return found

    def tables(self) -> dict[str, tuple[list[dict], str]]:
        """Each split's rows (dicts of the used columns) and where they come from."""
        used = [*self.text_columns, self.label_column]
        out = {}
        saved = Path(self.root).expanduser() if self.root is not None else None
        if saved_datasets(saved):  # datasets' save_to_disk directory
            return self.split_tables(load_saved(saved, self.what), str(saved))
        if self.root is not None:
            for split, path in self.local_files().items():
                frame = read_table(path, self.encoding)
                absent = [c for c in used if c not in frame.columns]
                if absent:
                    raise InputError(f"{path}: no column {absent}; its columns are {list(frame.columns)} (set "
                                     "dataset.text_column and dataset.label_column)")  # fmt: skip
                out[split] = (frame[used].to_dict("records"), str(path))
            return out
        instead = "set dataset.root to a directory with train.csv and test.csv"
        return self.split_tables(load_hub_dataset(self.hub_name, self.hub_config, self.what, instead), self.hub_name)

    def split_tables(self, ds, source: str) -> dict[str, tuple[list[dict], str]]:
        """``tables`` of a ``datasets.DatasetDict`` (from the hub or ``save_to_disk``), ``source`` naming it."""
        used = [*self.text_columns, self.label_column]
        out = {}
        names = getattr(ds["train"].features.get(self.label_column), "names", None) if "train" in ds else None
        self.hub_label_names = list(names) if names else None
        val = next((name for name in TEXT_SPLITS["val"] if name in ds), None)
        names = {"train": "train", "test": self.test_split, "val": val}
        for split, name in names.items():
            if name is None:
                continue
            if name not in ds:
                raise InputError(f"{self.what}: {source} has no split {name!r}; its splits are {list(ds)}")
            absent = [c for c in used if c not in ds[name].column_names]
            if absent:
                raise InputError(f"{self.what}: {source} {name} has no column {absent}; its columns are "
                                 f"{ds[name].column_names}")  # fmt: skip
            out[split] = (ds[name].select_columns(used).to_list(), f"{source} {name}")
        return out

    def examples(self, rows: list[dict], source: str, index: dict) -> list[tuple]:
        out, empty = [], []
        for i, row in enumerate(rows):
            label = row[self.label_column]
            if missing(label):  # not a class of its own: a row someone forgot to label
                raise InputError(f"{source}, row {i + 1}: the label (column {self.label_column!r}) is empty; label "
                                 "the row or remove it")  # fmt: skip
            if any(missing(row[c]) for c in self.text_columns):
                empty.append(i + 1)
            if label not in index:
                raise unknown_label(f"{source}, row {i + 1}", label, self.label_names)
            texts = tuple("" if missing(row[c]) else str(row[c]) for c in self.text_columns)
            out.append((texts[0] if len(texts) == 1 else texts, index[label]))
        if empty:  # a warning, not an error: hub datasets have the odd empty text, and it still tokenises
            log.warning("%s: %d row(s) with an empty text (column %s), rows %s%s; they train as empty strings",
                        source, len(empty), self.text_columns, empty[:5], " ..." if len(empty) > 5 else "")
        return out

    def read_splits(self):
        tables = self.tables()
        for rows, _ in tables.values():
            for row in rows:
                row[self.label_column] = label_value(row[self.label_column])
        train_rows, train_source = tables["train"]
        self.label_names = distinct_labels([row[self.label_column] for row in train_rows], self.what, train_source,
                                           self.label_column)  # fmt: skip
        check_declared(self.declared_classes, len(self.label_names),
                       f"{train_source} has {len(self.label_names)} distinct labels")  # fmt: skip
        index = {label: i for i, label in enumerate(self.label_names)}
        splits = {name: self.examples(rows, source, index) for name, (rows, source) in tables.items()}
        if "val" not in splits:
            train = splits["train"]
            held = default_holdout(len(train)) if self.val_holdout is None else self.val_holdout
            splits["train"], splits["val"] = hold_out(train, held, self.subset_seed, f"{self.key}.val_holdout")
            self.notes.update(train=f"{train_source} less the {held} rows held out for validation",
                              val=f"{held} rows held out of {train_source}")  # fmt: skip
        return splits

    def collate(self, examples: list[tuple]) -> dict:
        if not examples or isinstance(examples[0][0], str):
            return super().collate(examples)
        pairs, labels = zip(*examples)  # sentence pairs: the tokenizer joins them with its own separator
        first, second = zip(*pairs)
        enc = self.backbone.tokenizer(list(first), list(second), padding=True, truncation=True,
                                      max_length=self.max_length, return_tensors="pt")  # fmt: skip
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                "labels": torch.tensor(labels, dtype=torch.long)}  # fmt: skip
