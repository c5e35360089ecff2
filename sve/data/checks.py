"""What the data modules use to check their input before any work (``ClassificationData.check_data``).

Every user error in the data becomes one ``sve.errors.InputError`` of one line that names the file and line
(or the config key), the bad value, and what is expected; nothing here needs the backbone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from sve.data.options import check_count
from sve.errors import InputError
from sve.offline import hub_offline, hub_reachable

log = logging.getLogger(__name__)


def one_line(err: BaseException, limit: int = 300) -> str:
    """``Type: message`` of an exception on one line (for an InputError that quotes it)."""
    text = " ".join(str(err).split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def check_subset_size(key: str, size, available: int, what: str) -> None:
    """The subset size ``key`` (e.g. ``dataset.train_size``; None: all) is at most the ``available`` examples of
    ``what``."""
    check_count(key, size, null=True)
    if size is not None and size > available:
        raise InputError(
            f"{key}={size} is more than the {available} examples of {what}; give at most "
            f"{available}, or null for all of them"
        )


def seeded_order(n: int, seed: int) -> list[int]:
    """The seeded permutation of ``n`` examples whose first ``size`` are a subset (``subset_indices``); what
    follows them is never in the subset (``sve-distill unlabeled=N`` takes the next N)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()


def subset_indices(n: int, size: int | None, seed: int) -> list[int] | None:
    """The seeded subset ``take_subset`` takes (None: the whole dataset, also when ``size == n``)."""
    if size is None or size >= n:
        return None
    return seeded_order(n, seed)[:size]


def read_utf8(path: Path) -> str:
    """The text of ``path``; a byte that is not UTF-8 is an error naming the file, the line and the byte."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise InputError(f"{path} cannot be read ({one_line(err)})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InputError(
            f"{path}, line {line}: byte 0x{data[err.start]:02x} is not valid UTF-8 ({err.reason}); "
            "save the file as UTF-8"
        ) from None


def require_files(root: Path, names: Sequence[str], key: str, configured, layout: str, what: str) -> None:
    """``root`` holds every file in ``names``, or one error naming the key, the directory and what is missing."""
    if not root.is_dir():
        raise InputError(
            f"{what}: {key}={configured} is not a directory ({root} does not exist"
            f"{'' if not root.exists() else ' as a directory'}); expected {layout}"
        )
    missing = [n for n in names if not (root / n).is_file()]
    if missing:
        raise InputError(f"{what}: {key}={configured} lacks {missing}; expected {layout}")


def duplicates(keys: Sequence, where: Sequence) -> tuple | None:
    """The first repeated key as (key, where it first was, where it was again), or None."""
    seen: dict = {}
    for key, place in zip(keys, where):
        if key in seen:
            return key, seen[key], place
        seen[key] = place
    return None


def decode_images(files: Sequence[Path], what: str) -> None:
    """Opens and fully decodes every image in ``files`` (as the loaders do: PIL, converted to RGB), so a
    missing or corrupt file is found before any work. One error lists the first few bad files.

    Cost: one full decode per image, so it grows with the number and the size of the images.
    """
    from PIL import Image

    if not files:
        return
    start, last, bad = time.perf_counter(), time.perf_counter(), []
    log.info("%s: decoding the %d images the run reads", what, len(files))
    for done, path in enumerate(files, 1):
        try:
            with Image.open(path) as image:
                image.convert("RGB")
        except Exception as err:  # missing, truncated, not an image, ...
            bad.append((path, err))
        if time.perf_counter() - last > 10:
            last = time.perf_counter()
            log.info("%s: %d / %d images decoded", what, done, len(files))
    if bad:
        shown = "; ".join(f"{p} ({one_line(e, 120)})" for p, e in bad[:3])
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise InputError(
            f"{what}: {len(bad)} of the {len(files)} images the run reads cannot be read: {shown}{more}; "
            "replace or remove them"
        )
    log.info("%s: %d images decoded in %.1f s", what, len(files), time.perf_counter() - start)


def load_hub_dataset(name: str, config: str | None, what: str, instead: str):
    """``datasets.load_dataset(name, config)``; without a network only from the local cache. Failing, one
    error naming the dataset and ``instead`` (what to set)."""
    online = hub_reachable()
    try:
        import datasets

        with hub_offline(not online):
            return datasets.load_dataset(name, config)
    except Exception as err:
        how = "could not load" if online else "the Hugging Face hub cannot be reached and the local cache lacks"
        raise InputError(f"{what}: {how} {name}/{config} ({one_line(err)}); {instead}") from None
