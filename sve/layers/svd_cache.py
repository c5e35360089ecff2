"""The SVD of a backbone, computed once and kept on disk for every later run that wraps the same weights.

An entry is keyed by the SHA-256 of the weight's bytes together with everything that changes the factors:
the weight's shape and dtype, ``svd_dtype`` and ``factor_dtype``. A sweep over methods, seeds and ensemble
sizes on one backbone therefore decomposes each layer once; a fine-tuned or otherwise different weight gets
its own entry. The directory is ``SVE_SVD_CACHE`` if set, else ``svd`` in the project's cache
(``$XDG_CACHE_HOME/sve/svd``, default ``~/.cache/sve/svd``; ``method.svd_cache`` in the config; null turns the
cache off).

Entries are written atomically (a temporary file in the same directory, then ``os.replace``), so concurrent
runs (DDP ranks, a parallel sweep) never read half a file. Reading checks the stored key and a checksum of
the factors' bytes; a truncated, foreign or altered entry is reported with a warning, recomputed and
replaced. Counts and seconds (``stats``) go into results.json through the method's ``report()``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from sve.paths import cache_root

log = logging.getLogger(__name__)

VERSION = "sve-svd-1"  # bump when the stored layout changes


def default_dir() -> Path:
    return Path(os.environ["SVE_SVD_CACHE"]).expanduser() if os.environ.get("SVE_SVD_CACHE") else cache_root("svd")


def tensor_bytes(t: Tensor) -> memoryview:
    """The raw bytes of ``t`` (any dtype, bfloat16 included), on the CPU, in row-major order."""
    return memoryview(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy())


def has_bytes(t: Tensor) -> bool:
    """A plain tensor with data (not a fake or meta tensor, which the memory plan builds models on)."""
    return type(t) in (Tensor, torch.nn.Parameter) and t.device.type != "meta"


def weight_key(W: Tensor, svd_dtype: torch.dtype, factor_dtype: torch.dtype) -> str:
    h = hashlib.sha256(f"{VERSION}|{tuple(W.shape)}|{W.dtype}|{svd_dtype}|{factor_dtype}|".encode())
    h.update(tensor_bytes(W))
    return h.hexdigest()


def checksum(tensors: list[Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(f"{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(tensor_bytes(t))
    return h.hexdigest()


class SVDCache:
    """Args:
    directory: where the entries live (created on first write); None: ``default_dir()``.
    """

    def __init__(self, directory: str | Path | None = None):
        self.directory = Path(directory).expanduser() if directory is not None else default_dir()
        self.stats = {
            "hits": 0,
            "misses": 0,
            "corrupt": 0,
            "compute_seconds": 0.0,
            "read_seconds": 0.0,
            "bytes_written": 0,
        }
        self._write_failed = False

    def path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.pt"

    def factors(
        self,
        W: Tensor,
        svd_dtype: torch.dtype,
        factor_dtype: torch.dtype,
        compute: Callable[[], tuple[Tensor, Tensor, Tensor]],
        key: str | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(U, s, Vh) of W from the cache, or ``compute()``d and stored; ``key``: ``weight_key`` of these
        arguments when the caller has it already (hashing a large weight takes a while)."""
        key = key or weight_key(W, svd_dtype, factor_dtype)
        path = self.path(key)
        if path.exists():
            start = time.perf_counter()
            found = self.read(path, key, W)
            self.stats["read_seconds"] += time.perf_counter() - start
            if found is not None:
                self.stats["hits"] += 1
                return found
        self.stats["misses"] += 1
        start = time.perf_counter()
        U, s, Vh = compute()
        self.stats["compute_seconds"] += time.perf_counter() - start
        self.write(path, key, U, s, Vh)
        return U, s, Vh

    def read(self, path: Path, key: str, W: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
        """The entry's factors on W's device, or None (with a warning) when it is unreadable or does not
        belong to ``key``."""
        try:
            entry = torch.load(path, map_location=W.device, weights_only=True)
            U, s, Vh = entry["U"], entry["s"], entry["Vh"]
            problem = (
                "it was stored under another key"
                if entry.get("key") != key
                else "its checksum does not match its contents"
                if entry.get("checksum") != checksum([U, s, Vh])
                else "its shapes do not fit the weight"
                if (U.shape[0], Vh.shape[1]) != tuple(W.shape)
                else None
            )
        except Exception as err:  # truncated or foreign file: torch.load raises many kinds
            problem = f"it cannot be read ({type(err).__name__}: {err})"
        if problem is None:
            return U, s, Vh
        self.stats["corrupt"] += 1
        warnings.warn(f"SVD cache entry {path} is discarded and recomputed: {problem}", stacklevel=3)
        return None

    def write(self, path: Path, key: str, U: Tensor, s: Tensor, Vh: Tensor) -> None:
        """Atomically stores an entry; a cache that cannot be written only costs the next run the SVD."""
        entry = {
            "key": key,
            "checksum": checksum([U, s, Vh]),
            "U": U.detach().cpu(),
            "s": s.detach().cpu(),
            "Vh": Vh.detach().cpu(),
        }
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(entry, tmp)
            os.replace(tmp, path)
            self.stats["bytes_written"] += path.stat().st_size
        except OSError as err:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:  # the directory itself is missing or not one
                pass
            if not self._write_failed:
                self._write_failed = True
                warnings.warn(
                    f"SVD cache {self.directory} cannot be written ({err}); factors are not kept", stacklevel=3
                )

    def written(self) -> str:
        """What this cache's writes added, and what its directory now holds, in words ("" when nothing was
        written): the cache grows by the factors of every new weight and is never pruned."""
        if not self.stats["bytes_written"]:
            return ""
        entries, held = 0, 0
        for path in self.directory.glob("??/*.pt"):
            try:
                held += path.stat().st_size
                entries += 1
            except OSError:  # replaced or deleted by another run meanwhile
                pass
        return (
            f"; wrote {self.stats['bytes_written'] / 2**20:.1f} MiB, the cache now holds {held / 2**20:.1f} MiB "
            f"in {entries} entries (delete {self.directory} to free it)"
        )

    def summary(self) -> dict:
        """What results.json records: the directory and the counts and seconds of this run."""
        return {
            "dir": str(self.directory),
            **{k: round(v, 3) if isinstance(v, float) else v for k, v in self.stats.items()},
        }


__all__ = ["SVDCache", "default_dir", "weight_key"]
