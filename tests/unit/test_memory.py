"""``runtime.keep_freed_memory``: large blocks freed and allocated again are served from pages the
process already has, not faulted in afresh (each case in its own process: the setting is global)."""

import subprocess
import sys

import pytest

SCRIPT = """
import resource, sys, torch
from rlonce.core.memory import keep_freed_memory
took = keep_freed_memory() if sys.argv[1] == "keep" else None
def step():  # what a training step does: blocks above glibc's largest dynamic mmap threshold, freed
    xs = [torch.ones(9 << 20) for _ in range(16)]  # 16 × 36 MiB, touched
    del xs
step()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
step()
step()
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def _faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=120, check=True)
    took, faults = out.stdout.split()
    return took, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    took, kept = _faults("keep")
    _, default = _faults("default")
    pages = 2 * 16 * (36 << 20) // 4096
    assert took == "True"
    assert default > pages * 0.9  # glibc unmapped every block: each step faults all its pages in again
    # kept: the pages are reused (this VM's kernel reclaims some idle pages anyway: 12–35 % faulted here)
    assert kept < pages * 0.6
