"""Freed memory kept for reuse (``runtime.keep_freed_memory``).

glibc's malloc serves every block above its mmap threshold (128 KiB, rising to 32 MiB at most)
with a fresh ``mmap`` and unmaps it on ``free``, and gives the top of its heap back to the kernel
once more than the trim threshold is free there. A training step allocates gigabytes of
activations and frees them at the end of the backward pass, so every step faults those pages in
again: 3.4 million minor page faults (~13 GiB touched) per SmolLM2 update on the reasoning
workload, about a fifth of its time on this machine. Raising the mmap threshold to its maximum
and never trimming lets the next step reuse the same pages (8 thousand faults by the third step).
The process keeps its peak heap resident instead of returning it between steps — what a GPU
framework's caching allocator does too. Linux with glibc only; elsewhere nothing changes.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_MAX = 2**31 - 1
"""The largest value ``mallopt`` takes (an int): blocks above 2 GiB are still mapped on their own."""


def keep_freed_memory() -> bool:
    """Make this process's malloc keep freed memory for reuse; True if it took effect."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # a trim threshold of -1 is the largest size_t: the heap's top is never given back
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, -1))
