"""The memory a device has free: the CUDA allocator's view, or the host's available memory for the CPU."""

from __future__ import annotations

import os

import torch


def free_memory(device: torch.device | str) -> int:
    """Bytes free on ``device``: the CUDA allocator's view, or the host's available memory for the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
