"""The bytes of live tensor storages, counted under a dispatch mode as a step runs (on fake tensors, for the
memory plan: ``sve.runs.plan``)."""

from __future__ import annotations

import weakref

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

BLOCK = 512  # the CUDA caching allocator rounds every allocation up to 512 bytes


class LiveMemory(TorchDispatchMode):
    """Adds up the bytes of every tensor storage created inside it while that storage lives; ``peak`` is the
    most at any moment since ``reset_peak``. An output that shares a storage with an input of its operator (a
    view, an in-place result) is no new allocation and is not counted: a view of a parameter made before
    the tracker (``U.t()``) costs nothing."""

    def __init__(self, block: int = 1):
        super().__init__()
        self.block = block
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, tuple[int, weakref.ref]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage()._cdata
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, Tensor) and not _storageless(t)
        }
        for t in tree_flatten(out)[0]:
            if isinstance(t, Tensor) and not _storageless(t) and t.untyped_storage()._cdata not in inputs:
                self._track(t)
        return out

    def _track(self, t: Tensor) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._sizes:
            return
        size = -(-storage.nbytes() // self.block) * self.block
        # A weak reference with a callback, kept here (as torch's own MemTracker keeps them); weakref.finalize
        # on fake storages corrupted the heap now and then (torch 2.14).
        self._sizes[key] = (size, weakref.ref(storage, lambda _, key=key: self._free(key)))
        self.live += size
        self.peak = max(self.peak, self.live)

    def _free(self, key: int) -> None:
        size, _ = self._sizes.pop(key, (0, None))
        self.live -= size

    def reset_peak(self) -> int:
        self.peak = self.live
        return self.live


def _storageless(t: Tensor) -> bool:
    """Sparse and other layouts without one storage: never made by the steps planned here."""
    return t.layout != torch.strided


def tensor_bytes(tensors, block: int = 1) -> int:
    """Bytes of distinct storages among ``tensors``, each rounded up to ``block`` bytes."""
    sizes = {}
    for t in tensors:
        if isinstance(t, Tensor):
            storage = t.untyped_storage()
            sizes[storage._cdata] = -(-storage.nbytes() // block) * block
    return sum(sizes.values())
