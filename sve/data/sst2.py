"""GLUE SST-2 (binary sentiment). The paper reports on the dev set (872 sentences) as its test set.

Local layout (``dataset.root``): ``train.tsv`` and ``dev.tsv``, UTF-8, tab separated with header
``sentence<TAB>label``, read without quote handling (sentences contain literal quote characters).
Without ``root`` the data comes from the Hugging Face hub (``glue``/``sst2``).
Validation is a seeded hold-out of ``val_holdout`` training sentences, so the test set is never used for
model selection.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import torch

from sve.data.base import TextClassificationData
from sve.data.checks import load_hub_dataset, read_utf8, require_files
from sve.data.options import is_int
from sve.errors import InputError

LAYOUT = "a directory with train.tsv and dev.tsv (columns: sentence<TAB>label, with a header row)"


def read_tsv(path: Path, num_classes: int = 2) -> list[tuple[str, int]]:
    """(sentence, label) rows; any bad row is an error naming the file, the line and what is valid."""
    rows = csv.DictReader(io.StringIO(read_utf8(path), newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    if rows.fieldnames is None:
        raise InputError(f"{path} is empty; expected a header row sentence<TAB>label, then one row per sentence")
    if not {"sentence", "label"} <= set(rows.fieldnames):
        raise InputError(
            f"{path}, line 1: expected a header with 'sentence' and 'label' (tab separated), got {rows.fieldnames}"
        )
    examples = []
    for row in rows:
        extra = row.get(None)  # fields beyond the header's: a tab inside the sentence? (a trailing tab is harmless)
        if extra and any(field.strip() for field in extra):
            raise InputError(
                f"{path}, line {rows.line_num}: {len(rows.fieldnames) + len(extra)} tab-separated fields "
                f"where the header has {len(rows.fieldnames)}; expected sentence<TAB>label"
            )
        label = (row["label"] or "").strip()  # None when the row has fewer fields than the header
        if not (label.isascii() and label.isdigit()) or int(label) >= num_classes:
            raise InputError(
                f"{path}, line {rows.line_num}: label {row['label']!r} is not valid; expected "
                f"an integer in 0..{num_classes - 1} in the 'label' column"
            )
        examples.append((row["sentence"] or "", int(label)))
    if not examples:
        raise InputError(f"{path}: no rows after the header")
    return examples


class SST2Data(TextClassificationData):
    """Args:
    root: local directory (see module docstring); None loads ``hub_name/hub_config`` with ``datasets``.
    val_holdout: training sentences held out (seeded by ``subset_seed``) for validation.
    """

    name = "sst2"
    num_classes = 2

    def __init__(
        self,
        root: str | None = None,
        val_holdout: int = 872,
        hub_name: str = "glue",
        hub_config: str = "sst2",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.root, self.hub_name, self.hub_config = root, hub_name, hub_config
        self.val_holdout = val_holdout

    def _read(self) -> tuple[list, list, str]:
        """(train rows, dev rows, where they come from)."""
        if self.root is not None:
            root = Path(self.root).expanduser()
            require_files(root, ("train.tsv", "dev.tsv"), f"{self.key}.root", self.root, LAYOUT, self.what)
            train, dev = (read_tsv(root / f, self.num_classes) for f in ("train.tsv", "dev.tsv"))
            return train, dev, str(root / "train.tsv")
        ds = load_hub_dataset(self.hub_name, self.hub_config, self.what, f"set {self.key}.root to {LAYOUT}")
        as_pairs = lambda split: list(zip(ds[split]["sentence"], ds[split]["label"]))  # noqa: E731
        return as_pairs("train"), as_pairs("validation"), f"{self.hub_name}/{self.hub_config} train"

    def read_splits(self):
        train, dev, source = self._read()
        if not is_int(self.val_holdout) or not 0 < self.val_holdout < len(train):
            raise InputError(
                f"{self.key}.val_holdout={self.val_holdout!r} is not valid: it must be an integer between "
                f"1 and {len(train) - 1} (the training file has {len(train)} sentences)"
            )
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(self.subset_seed)).tolist()
        val_idx, train_idx = order[: self.val_holdout], order[self.val_holdout :]
        self.notes = {
            "train": f"the {len(train)} sentences of {source} less the {self.key}.val_holdout={self.val_holdout} held "
            "out for validation",
            "val": f"the {self.key}.val_holdout={self.val_holdout} sentences held out of {source}",
            "test": "the dev set" if self.root is None else str(Path(self.root).expanduser() / "dev.tsv"),
        }
        return {"train": [train[i] for i in train_idx], "val": [train[i] for i in val_idx], "test": dev}
