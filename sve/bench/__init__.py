"""The cost benchmark: memory and FLOP counters (``counters``, importable from here) and the benchmark behind
Table 5 and ``make bench`` (``benchmark``, with its ``settings``, its parts and their ``markdown``)."""

from sve.bench.counters import (  # noqa: F401 - the package's names
    PeakTensorMemory,
    count_flops,
    interleaved_times,
    minor_faults,
    paired_ratio,
    paired_ratios,
    peak_memory,
    reachable_tensors,
    resident_bytes,
    storage_key,
    verdict,
)
