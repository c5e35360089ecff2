"""Measuring what a step costs, the same way on the CPU and on CUDA: time, FLOPs and peak memory.

- **Time**: ``interleaved_times`` runs every candidate once per round, rounds alternating the order, after a
  warm-up round; a ratio is the median over rounds of the two candidates' times in the same round, so a
  change of machine load between rounds (2 shared CPU cores here) cancels. CUDA is synchronised around each
  call.
- **FLOPs**: ``torch.utils.flop_counter.FlopCounterMode`` (matmuls, convolutions and attention; elementwise
  work counts zero), forward and, for a training step, backward.
- **Page faults**: ``minor_faults`` counts the minor page faults of this process during one call (the
  kernel zero-filling fresh pages for the allocator; ``sve.training.allocator`` explains why they matter on the CPU).
- **Peak memory** = what the model holds before the step (``resident_bytes``: parameters, buffers, optimiser
  state and any cache the method keeps, e.g. merged SV weights, each storage counted once) + the peak of what
  the step allocates on top. On CUDA the latter is ``torch.cuda.max_memory_allocated`` minus the allocation
  before the step. On the CPU, which has no allocator statistics, ``PeakTensorMemory`` (a dispatch mode)
  adds the bytes of every storage an operator allocates and subtracts them when the last tensor using it
  dies: the same live-tensor count the CUDA allocator keeps, without its block rounding and caching, and
  without workspaces that kernels allocate outside tensors.
"""

from __future__ import annotations

import resource
import statistics
import time
import weakref
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode


def storage_key(t: Tensor) -> tuple:
    return t.device, t.untyped_storage().data_ptr()


class PeakTensorMemory(TorchDispatchMode):
    """Live bytes of the storages allocated by operators inside the context, and their peak (``peak``)."""

    def __init__(self):
        super().__init__()
        self.live: dict[tuple, list[int]] = {}  # storage -> [bytes, tensors seen using it]
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = {storage_key(t) for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)}
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, Tensor) or t.device.type == "meta":
                continue
            key = storage_key(t)
            if key in self.live:  # a view or an in-place result of a storage allocated in here
                self.live[key][1] += 1
            elif key in inputs or t.untyped_storage().nbytes() == 0:  # a view of memory from before
                continue
            else:
                nbytes = t.untyped_storage().nbytes()
                self.live[key] = [nbytes, 1]
                self.now += nbytes
                self.peak = max(self.peak, self.now)
            weakref.finalize(t, self._release, key)
        return out

    def _release(self, key: tuple) -> None:
        entry = self.live.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] == 0:
                del self.live[key]
                self.now -= entry[0]


def reachable_tensors(root) -> list[Tensor]:
    """Every tensor ``root`` refers to through modules, containers and the attributes of this package's and
    laplace-torch's objects (parameters, buffers, caches, snapshots, posterior factors)."""
    found, seen, stack = [], set(), [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, Tensor):
            found.append(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend(obj)
        elif isinstance(obj, nn.Module) or type(obj).__module__.split(".")[0] in ("sve", "laplace"):
            stack.extend(vars(obj).values())
    return found


def resident_bytes(*roots) -> int:
    """Bytes of the distinct storages reachable from ``roots`` (a model, its optimiser's state, ...)."""
    storages = {}
    for root in roots:
        for t in reachable_tensors(root):
            if t.device.type != "meta":
                storages[storage_key(t)] = t.untyped_storage().nbytes()
    return sum(storages.values())


def peak_memory(step: Callable[[], object], device: torch.device) -> int:
    """Peak bytes ``step`` allocates beyond what was live before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    with PeakTensorMemory() as tracker:
        step()
    return tracker.peak


def count_flops(step: Callable[[], object]) -> int:
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def minor_faults(step: Callable[[], object]) -> int:
    """Minor page faults of this process while ``step`` runs."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def interleaved_times(
    steps: dict[str, Callable[[], object]],
    repeats: int,
    device: torch.device,
    warmup: int = 1,
    clock: Callable[[Callable[[], object]], float] | None = None,
) -> dict[str, list[float]]:
    """Per call of each step, ``repeats`` rounds after ``warmup`` rounds; each round runs every step once, the
    order alternating between rounds. ``clock(step)`` runs one step and returns its time (default: wall
    seconds, the device synchronised around it; the GPU check passes CUDA events in milliseconds)."""
    if clock is None:
        clock = wall_seconds(device)
    names = list(steps)
    for _ in range(warmup):
        for name in names:
            steps[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(clock(steps[name]))
    return times


def wall_seconds(device: torch.device) -> Callable[[Callable[[], object]], float]:
    """A clock for ``interleaved_times``: wall seconds of one step, a CUDA device synchronised before and after."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    def clock(step: Callable[[], object]) -> float:
        sync()
        start = time.perf_counter()
        step()
        sync()
        return time.perf_counter() - start

    return clock


def paired_ratios(times: dict[str, list[float]], name: str, reference: str) -> list[float]:
    """time(name) / time(reference) in each round."""
    return [a / b for a, b in zip(times[name], times[reference])]


def paired_ratio(times: dict[str, list[float]], name: str, reference: str) -> float:
    """Median over rounds of time(name) / time(reference) measured in the same round."""
    return statistics.median(paired_ratios(times, name, reference))


def verdict(ratios: list[float], limit: float, at_most: bool = True) -> str:
    """``holds`` when the median ratio is within the limit, ``within noise`` when only some round's ratio is,
    else ``does not hold``."""
    median = statistics.median(ratios)
    inside = (lambda r: r <= limit) if at_most else (lambda r: r >= limit)
    return "holds" if inside(median) else "within noise" if any(map(inside, ratios)) else "does not hold"


__all__ = [
    "PeakTensorMemory",
    "resident_bytes",
    "peak_memory",
    "count_flops",
    "minor_faults",
    "interleaved_times",
    "paired_ratio",
    "paired_ratios",
    "verdict",
]
