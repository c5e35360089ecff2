"""The options every data module takes that need no torch to check (batch sizes, split sizes, token lengths,
loader workers): read by the config check before a run imports anything heavy (``sve.runs.validate``), and by
``ClassificationData`` when it is built. Each check raises an ``InputError`` naming the key, the value and what
is valid."""

from __future__ import annotations

from sve.errors import InputError

# Counts that must be positive where they are set; ``batch_size`` must always be.
POSITIVE = (
    "batch_size",
    "eval_batch_size",
    "train_size",
    "val_size",
    "test_size",
    "val_holdout",
    "num_train",
    "num_val",
    "num_test",
    "max_length",
)


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_count(key: str, value, minimum: int = 1, null: bool = False) -> None:
    """The config value ``key`` (e.g. ``dataset.num_train``) is an integer >= ``minimum`` (or None when ``null``)."""
    if value is None and null:
        return
    if not is_int(value) or value < minimum:
        expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise InputError(f"{key}={value!r} is not valid; expected {expected}" + (" or null" if null else ""))


def check_data_options(node, prefix: str = "dataset") -> None:
    """The options of a data module's config node (or its keyword arguments as a dict)."""
    if node is None:
        return
    for key in POSITIVE:
        check_count(f"{prefix}.{key}", node.get(key), null=key != "batch_size")
    workers = node.get("num_workers")
    if workers is not None:
        check_count(f"{prefix}.num_workers", workers, minimum=0)
