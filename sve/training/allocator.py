"""How this process's CPU memory allocator hands memory back to the system (``cpu_allocator`` in
configs/train.yaml, ``--cpu-allocator`` of sve-bench).

PyTorch allocates CPU tensors with the C library's malloc. glibc serves a large block (above an adaptive
threshold, 128 KiB at start) with its own ``mmap`` and gives it back on free, and it trims the top of its heap
whenever more than a threshold is free there. Either way the next activation of that size arrives as fresh
pages, and the kernel zero-fills each 4 KiB page on first touch (a minor page fault). A forward pass
allocates and frees the same activations over and over, so under the default policy part of every pass is
spent faulting memory in, and unevenly: two candidates that run the same matmuls can differ in time only
because one of them faults more. The benchmark counts the faults of every candidate (the page-fault column
of results/bench/bench.md, written with ``tuned``; ``--cpu-allocator system`` measures the default policy).

``tuned`` fixes both thresholds (``mallopt``): blocks up to 32 MiB (glibc's own ceiling for its adaptive
threshold on 64-bit systems) come from the heap, and free memory at the heap's top is kept up to 1 GiB. The
cost is resident memory: the process keeps up to that much freed memory for reuse instead of returning it,
as the caching allocators of PyTorch on CUDA, jemalloc and tcmalloc do. ``system`` leaves the C library's
defaults. On a C library other than glibc (macOS, musl) ``tuned`` does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

from sve.errors import InputError

log = logging.getLogger(__name__)

POLICIES = ("tuned", "system")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers (malloc.h)
MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 2**30


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise InputError(f"cpu_allocator={policy!r} is not valid; choose one of {list(POLICIES)}")
    return policy


def set_cpu_allocator(policy: str) -> bool:
    """Applies ``policy`` to this process; True when the C library's settings were changed. Process-wide and
    not undone: ``system`` after ``tuned`` keeps the tuned thresholds (start a new process to compare)."""
    if check_policy(policy) == "system":
        return False
    libc_name = ctypes.util.find_library("c") if platform.system() == "Linux" else None
    libc = ctypes.CDLL(libc_name) if libc_name else None
    if libc is None or not hasattr(libc, "mallopt") or platform.libc_ver()[0] != "glibc":
        log.info("cpu_allocator=tuned: not a glibc system, the C library's allocator is left as it is")
        return False
    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not ok:
        log.warning("cpu_allocator=tuned: glibc refused mallopt; the default allocator policy stays")
    return ok


__all__ = ["POLICIES", "check_policy", "set_cpu_allocator"]
