"""The CPU allocator policy (sve/training/allocator.py), checked in fresh processes since it is process-wide."""

import platform
import subprocess
import sys

import pytest

from sve.training.allocator import POLICIES, check_policy, set_cpu_allocator

# Prints: whether the policy was applied; whether a 20 MiB tensor made right after lies in the heap (glibc
# serves a block that large from its own mmap by default); and the fewest minor page faults in three windows
# of three evaluation steps of a transformer layer, after warm-up.
PROBE = """
import resource, sys
import torch
from sve.training.allocator import set_cpu_allocator
applied = set_cpu_allocator(sys.argv[1])
block = torch.empty(5 * 2**20)
heap = [line.split()[0].split("-") for line in open("/proc/self/maps") if line.rstrip().endswith("[heap]")]
in_heap = any(int(lo, 16) <= block.data_ptr() < int(hi, 16) for lo, hi in heap)
del block
torch.manual_seed(0)
torch.set_num_threads(1)
layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True).eval()
x = torch.randn(8, 197, 256)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
windows = []
with torch.no_grad():
    for _ in range(6):
        layer(x)
    for _ in range(3):
        before = faults()
        for _ in range(3):
            layer(x)
        windows.append(faults() - before)
print(applied, in_heap, min(windows))
"""

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                           reason="the tuned policy applies to glibc (Linux) only")


def probe(policy: str) -> tuple[bool, bool, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, policy], capture_output=True, text=True, check=True)
    applied, in_heap, faults = out.stdout.split()
    return applied == "True", in_heap == "True", int(faults)


@glibc
def test_tuned_policy_serves_large_blocks_from_the_heap_and_stops_faulting():
    applied, in_heap, faults = probe("tuned")
    assert applied and in_heap
    # Steady state: every activation reuses freed memory. Under glibc's defaults the same steps fault in up to
    # ~9,000 pages per window (measured with glibc 2.36), though not in every process.
    assert faults < 100


@glibc
def test_system_policy_leaves_glibc_alone():
    applied, in_heap, _ = probe("system")
    assert not applied
    assert not in_heap  # glibc's default: a 20 MiB block is mapped on its own (and unmapped again on free)


def test_a_bad_policy_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"cpu_allocator='fast'.*\['tuned', 'system'\]"):
        set_cpu_allocator("fast")
    assert check_policy("system") == "system" and POLICIES == ("tuned", "system")
