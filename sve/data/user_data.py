"""What ``image_folder`` and ``text_table`` share: class counts, labels numbered by the training split, saved data.

Both read their classes from the data, so ``num_classes`` is whatever the training split holds (a declared count
must match it), and both also read a ``datasets`` ``save_to_disk`` directory given as ``root``.
"""

from __future__ import annotations

import math
from pathlib import Path

from sve.data.checks import one_line
from sve.data.options import check_count
from sve.errors import InputError

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


def distinct_labels(labels, what: str, source: str, column: str) -> list:
    """The training split's distinct labels in sorted order (empty cells left out): at least 2, of one type."""
    distinct = {label for label in labels if not missing(label)}
    if len(distinct) < 2:
        raise InputError(
            f"{what}: {source} has {len(distinct)} distinct label(s) in column {column!r}; a "
            "classification needs at least 2"
        )
    try:
        return sorted(distinct)
    except TypeError:  # integers and strings mixed
        raise InputError(
            f"{what}: {source}: column {column!r} mixes label types ({sorted({type(v).__name__ for v in distinct})})"
        ) from None


def unknown_label(where: str, label, known: list) -> InputError:
    """The error for a validation or test label that the training split lacks; ``where`` names the row."""
    return InputError(
        f"{where}: label {label!r} is not one of the training split's labels {known[:10]}{unlabelled(label)}"
    )


def unlabelled(label) -> str:
    """The hint for label -1: how the hub marks an example without a label (GLUE's and others' test splits)."""
    if label != -1:
        return ""
    return (
        "; -1 marks an unlabelled example (the test splits of GLUE and other benchmarks hide their labels): "
        "test on a labelled split instead, e.g. dataset.test_split=validation"
    )


def saved_datasets(root: Path | None) -> bool:
    """Whether ``root`` is a ``datasets`` ``save_to_disk`` directory of splits."""
    return root is not None and (Path(root) / "dataset_dict.json").is_file()


def load_saved(root: Path, what: str):
    import datasets

    try:
        return datasets.load_from_disk(str(root))
    except Exception as err:
        raise InputError(f"{what}: {root} cannot be read as a saved datasets.DatasetDict ({one_line(err)})") from None


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
    return (
        value is None
        or (isinstance(value, float) and math.isnan(value))
        or (isinstance(value, str) and not value.strip())
    )
