"""Your own texts, with no code (``dataset=text_table``): CSV, TSV, JSON lines or Parquet tables, or a hub dataset.

``TextTableData`` reads ``root/train.<ext>`` and ``root/test.<ext>`` (and ``validation``/``val``/``dev``), or the
splits of ``hub_name``/``hub_config``; ``text_column`` names the text (two columns: a sentence pair, tokenised as a
pair), ``label_column`` the label. The labels, integers or strings, are numbered in sorted order of the training
split's distinct values (``label_names``); a validation or test label that training lacks is an error naming the
file and the row.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import torch

from sve.data.base import TextClassificationData
from sve.data.checks import load_hub_dataset, one_line
from sve.data.user_data import (
    TEXT_SPLITS,
    check_declared,
    declared,
    default_holdout,
    distinct_labels,
    label_value,
    load_saved,
    missing,
    saved_datasets,
    unknown_label,
)
from sve.data.vision import hold_out
from sve.errors import InputError

log = logging.getLogger(__name__)

TEXT_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


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
                    log.info(
                        "%s: its header %r has ';' and no ',': read with ';' as the separator", path, header.strip()
                    )
                    sep = ";"
            return pd.read_csv(path, sep=sep, quoting=quoting, keep_default_na=False, dtype=str, encoding=codec)
        if kind == "json":
            return pd.read_json(path, lines=path.suffix.lower() == ".jsonl", dtype=False, encoding=codec)
        return pd.read_parquet(path)
    except UnicodeDecodeError as err:
        raise InputError(
            f"{path}: is not {encoding} text ({one_line(err)}); name its encoding with "
            "dataset.encoding=, e.g. latin-1 or cp1252"
        ) from None
    except LookupError as err:  # an unknown encoding name
        raise InputError(
            f"dataset.encoding={encoding!r} is not an encoding Python knows ({one_line(err)}); "
            "e.g. utf-8, latin-1, cp1252"
        ) from None
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

    def __init__(
        self,
        root: str | None = None,
        hub_name: str | None = None,
        hub_config: str | None = None,
        test_split: str = "test",
        text_column: str | list[str] = "text",
        label_column: str = "label",
        val_holdout: int | None = None,
        num_classes: int | None = None,
        encoding: str = "utf-8",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.declared_classes = declared(num_classes)
        self.encoding = encoding
        columns = [text_column] if isinstance(text_column, str) else list(text_column)
        if not 1 <= len(columns) <= 2 or not all(isinstance(c, str) and c for c in columns):
            raise InputError(
                f"dataset.text_column={text_column!r} is not valid; expected a column name, or a list "
                "of two (a sentence pair)"
            )
        if root is None and not hub_name:
            raise InputError(
                "dataset=text_table needs its data: set dataset.root=<a directory with train.csv and "
                "test.csv (or .tsv, .jsonl, .json, .parquet)> or dataset.hub_name=<a hub dataset>"
            )
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
                raise InputError(
                    f"{self.what}: {root} holds {len(files)} files for the {split} split "
                    f"({[f.name for f in files]}); keep one"
                )
            if files:
                found[split] = files[0]
        lacking = [s for s in ("train", "test") if s not in found]
        if lacking:
            raise InputError(
                f"{self.what}: dataset.root={self.root} lacks a {' and a '.join(lacking)} file; expected "
                f"train.<ext> and test.<ext> with ext one of {', '.join(e[1:] for e in TEXT_FORMATS)}"
            )
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
                    raise InputError(
                        f"{path}: no column {absent}; its columns are {list(frame.columns)} (set "
                        "dataset.text_column and dataset.label_column)"
                    )
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
                raise InputError(
                    f"{self.what}: {source} {name} has no column {absent}; its columns are {ds[name].column_names}"
                )
            out[split] = (ds[name].select_columns(used).to_list(), f"{source} {name}")
        return out

    def examples(self, rows: list[dict], source: str, index: dict) -> list[tuple]:
        out, empty = [], []
        for i, row in enumerate(rows):
            label = row[self.label_column]
            if missing(label):  # not a class of its own: a row someone forgot to label
                raise InputError(
                    f"{source}, row {i + 1}: the label (column {self.label_column!r}) is empty; label "
                    "the row or remove it"
                )
            if any(missing(row[c]) for c in self.text_columns):
                empty.append(i + 1)
            if label not in index:
                raise unknown_label(f"{source}, row {i + 1}", label, self.label_names)
            texts = tuple("" if missing(row[c]) else str(row[c]) for c in self.text_columns)
            out.append((texts[0] if len(texts) == 1 else texts, index[label]))
        if empty:  # a warning, not an error: hub datasets have the odd empty text, and it still tokenises
            log.warning(
                "%s: %d row(s) with an empty text (column %s), rows %s%s; they train as empty strings",
                source,
                len(empty),
                self.text_columns,
                empty[:5],
                " ..." if len(empty) > 5 else "",
            )
        return out

    def read_splits(self):
        tables = self.tables()
        for rows, _ in tables.values():
            for row in rows:
                row[self.label_column] = label_value(row[self.label_column])
        train_rows, train_source = tables["train"]
        self.label_names = distinct_labels(
            [row[self.label_column] for row in train_rows], self.what, train_source, self.label_column
        )
        check_declared(
            self.declared_classes, len(self.label_names), f"{train_source} has {len(self.label_names)} distinct labels"
        )
        index = {label: i for i, label in enumerate(self.label_names)}
        splits = {name: self.examples(rows, source, index) for name, (rows, source) in tables.items()}
        if "val" not in splits:
            train = splits["train"]
            held = default_holdout(len(train)) if self.val_holdout is None else self.val_holdout
            splits["train"], splits["val"] = hold_out(train, held, self.subset_seed, f"{self.key}.val_holdout")
            self.notes.update(
                train=f"{train_source} less the {held} rows held out for validation",
                val=f"{held} rows held out of {train_source}",
            )
        return splits

    def collate(self, examples: list[tuple]) -> dict:
        if not examples or isinstance(examples[0][0], str):
            return super().collate(examples)
        pairs, labels = zip(*examples)  # sentence pairs: the tokenizer joins them with its own separator
        first, second = zip(*pairs)
        enc = self.backbone.tokenizer(
            list(first), list(second), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        return {
            "input_ids": enc["input_ids"],
            "attention_mask": enc["attention_mask"],
            "labels": torch.tensor(labels, dtype=torch.long),
        }
