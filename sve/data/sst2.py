"""GLUE SST-2 (binary sentiment). The paper reports on the dev set (872 sentences) as its test set.

Local layout (``dataset.root``): ``train.tsv`` and ``dev.tsv``, tab separated with header
``sentence<TAB>label``, read without quote handling (sentences contain literal quote characters).
Without ``root`` the data comes from the Hugging Face hub (``glue``/``sst2``).
Validation is a seeded hold-out of ``val_holdout`` training sentences, so the test set is never used for
model selection.
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch

from sve.data.base import TextClassificationData
from sve.errors import InputError

LAYOUT = "a directory with train.tsv and dev.tsv (columns: sentence<TAB>label, with a header row)"


def read_tsv(path: Path, num_classes: int = 2) -> list[tuple[str, int]]:
    """(sentence, label) rows; any bad row is an error naming the file, the line and what is valid."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        if rows.fieldnames is None or not {"sentence", "label"} <= set(rows.fieldnames):
            raise InputError(f"{path}: expected a header with 'sentence' and 'label', got {rows.fieldnames}")
        examples = []
        for row in rows:
            label = (row["label"] or "").strip()  # None when the row has fewer fields than the header
            if not label.isdigit() or int(label) >= num_classes:
                raise InputError(f"{path}, line {rows.line_num}: label {row['label']!r} is not valid; expected "
                                 f"an integer in 0..{num_classes - 1} in the 'label' column")  # fmt: skip
            examples.append((row["sentence"] or "", int(label)))
    if not examples:
        raise InputError(f"{path}: no rows after the header")
    return examples


class SST2Data(TextClassificationData):
    """Args:
    root: local directory (see module docstring); None loads ``glue/sst2`` with ``datasets``.
    val_holdout: training sentences held out (seeded by ``subset_seed``) for validation.
    """

    num_classes = 2

    def __init__(self, root: str | None = None, val_holdout: int = 872, **kwargs):
        super().__init__(**kwargs)
        self.root = root
        self.val_holdout = val_holdout

    def _read(self) -> tuple[list, list]:
        if self.root is not None:
            root = Path(self.root).expanduser()
            missing = [f for f in ("train.tsv", "dev.tsv") if not (root / f).exists()]
            if missing:
                raise FileNotFoundError(f"dataset.root={self.root} lacks {missing}; expected {LAYOUT}")
            return read_tsv(root / "train.tsv", self.num_classes), read_tsv(root / "dev.tsv", self.num_classes)
        try:
            import datasets

            ds = datasets.load_dataset("glue", "sst2")
        except Exception as err:
            raise RuntimeError(
                f"could not download SST-2 from the Hugging Face hub ({type(err).__name__}: {err}); "
                f"set dataset.root to {LAYOUT}"
            ) from err
        as_pairs = lambda split: list(zip(ds[split]["sentence"], ds[split]["label"]))  # noqa: E731
        return as_pairs("train"), as_pairs("validation")

    def load_splits(self):
        train, dev = self._read()
        if not isinstance(self.val_holdout, int) or not 0 < self.val_holdout < len(train):
            raise InputError(f"dataset.val_holdout={self.val_holdout!r} is not valid: it must be an integer between 1 "
                             f"and {len(train) - 1} (the training file has {len(train)} sentences)")  # fmt: skip
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(self.subset_seed)).tolist()
        val_idx, train_idx = order[: self.val_holdout], order[self.val_holdout :]
        return {"train": [train[i] for i in train_idx], "val": [train[i] for i in val_idx], "test": dev}
