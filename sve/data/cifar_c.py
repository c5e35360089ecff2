"""CIFAR-100-C (Hendrycks and Dietterich, 2019): the CIFAR-100 test set under 19 corruptions x 5 severities.

Official release layout (``dataset.corrupted_root``, e.g. the unpacked ``CIFAR-100-C.tar`` from
https://zenodo.org/record/3555552): one ``<corruption>.npy`` per corruption, uint8 of shape (50000, 32, 32, 3)
holding the 10,000 test images at severity 1, then severity 2, ... 5; and ``labels.npy`` (50000,) in the same
order. Training, validation and the clean test split are CIFAR-100's (``dataset.root``); every chosen
(corruption, severity) is a test set of its own, ``shift/<corruption>/<severity>`` (``ImageClassificationData``),
so Fig. 3 gets metrics per corruption and severity rather than one number pooled over all of them. Without
``corrupted_root`` the corrupted sets are generated from the CIFAR-100 test set with ``sve.data.corruptions``
(same types, not bit-identical to the release).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from sve.data.checks import one_line
from sve.data.corruptions import SEVERITIES
from sve.data.image_sets import ArrayImages, CIFAR100Data
from sve.data.vision import Transformed
from sve.errors import InputError

PER_SEVERITY = 10_000
RELEASE_LAYOUT = (
    "<corruption>.npy files (uint8, (5*10000, 32, 32, 3), severities 1..5 in order) and labels.npy, as in "
    "the official CIFAR-100-C release"
)


def _load(path: Path, mmap: bool) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r" if mmap else None)
    except Exception as err:  # not a .npy file, truncated, ...
        raise InputError(
            f"dataset cifar100_c: {path} is not a readable .npy file ({one_line(err)}); expected {RELEASE_LAYOUT}"
        ) from None


def read_release(root: Path, corruption: str, severity: int, per_severity: int | None = None) -> ArrayImages:
    """One (corruption, severity) slice of the release, memory-mapped (the files are 150 MB each)."""
    images_path, labels_path = root / f"{corruption}.npy", root / "labels.npy"
    for path in (images_path, labels_path):
        if not path.is_file():
            raise InputError(
                f"dataset cifar100_c: {path} not found; set dataset.corrupted_root to a directory with {RELEASE_LAYOUT}"
            )
    images = _load(images_path, mmap=True)
    labels = _load(labels_path, mmap=False)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise InputError(
            f"{images_path}: {images.dtype} of shape {images.shape}; expected uint8 of shape (5 * N, height, width, 3)"
        )
    if labels.ndim != 1:
        raise InputError(f"{labels_path}: shape {labels.shape}; expected one label per image, (5 * N,)")
    n = per_severity or len(labels) // len(SEVERITIES)  # 10,000 in the release; fewer in test fixtures
    if n == 0 or images.shape[0] != len(labels) or len(labels) != n * len(SEVERITIES):
        raise InputError(
            f"{images_path}: {images.shape[0]} images and {len(labels)} labels; expected 5 severities x {n} each"
        )
    part = slice((severity - 1) * n, severity * n)
    return ArrayImages(images[part], labels[part])


class CIFAR100CData(CIFAR100Data):
    """Train on CIFAR-100, test on CIFAR-100 and on each corruption and severity of CIFAR-100-C.

    Args:
        corrupted_root: directory of the official release (see module docstring); None generates the
            corruptions from the CIFAR-100 test set.
        corruptions: a name, a list of names, or ``all`` (the 19 of ``sve.data.corruptions.CORRUPTIONS``).
        severities: an int, a list, or ``all`` (1 to 5).
    """

    name = "cifar100_c"

    def __init__(self, corrupted_root: str | None = None, corruptions: str | list[str] | None = "all", **kwargs):
        super().__init__(corruptions=corruptions, **kwargs)
        self.corrupted_root = corrupted_root
        self.release_length: int | None = None  # images per corruption and severity in the release

    def check_parsed(self, parsed):
        """Every release file the run reads is checked now (``check_data``), not after training."""
        if self.corrupted_root is not None and self.corruptions:
            root = Path(self.corrupted_root).expanduser()
            missing = [f"{c}.npy" for c in self.corruptions if not (root / f"{c}.npy").is_file()]
            missing += [] if (root / "labels.npy").is_file() else ["labels.npy"]
            if missing:
                raise InputError(
                    f"{self.what}: {self.key}.corrupted_root={self.corrupted_root} lacks {missing}; "
                    f"expected {RELEASE_LAYOUT}"
                )
            for corruption in self.corruptions:
                for severity in self.severities:
                    self.release_length = len(read_release(root, corruption, severity))
            labels = _load(root / "labels.npy", mmap=False)
            if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0 or labels.max() >= self.num_classes:
                raise InputError(
                    f"{root / 'labels.npy'}: labels {labels.dtype} from {labels.min()} to {labels.max()}; "
                    f"expected integers in 0..{self.num_classes - 1}"
                )
        super().check_parsed(parsed)

    def shifted_length(self, parsed) -> int:
        if self.corrupted_root is not None and self.release_length is not None:
            return self.release_length
        return super().shifted_length(parsed)

    def shifted_test(self, corruption: str, severity: int) -> Dataset:
        if self.corrupted_root is None:
            return super().shifted_test(corruption, severity)
        raw = read_release(Path(self.corrupted_root).expanduser(), corruption, severity)
        return Transformed(raw, self.test_transform)


__all__ = ["CIFAR100CData", "read_release", "PER_SEVERITY"]
