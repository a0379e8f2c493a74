"""Torch's OpenMP thread teams, handed back when a thread's burst of work ends.

PyTorch's CPU wheels run an op's intra-op parallelism on GNU OpenMP (libgomp). A thread that
runs a parallel op with more than one torch thread keeps a team of helper threads afterwards,
and libgomp counts the helpers of every thread's team: once they and their masters outnumber
the cores, every team's idle helpers stop spinning between parallel regions after 100 turns
instead of 300,000 and sleep, so each small op pays a futex wake-up. A local run has two
such threads, the engine's worker and the one that trains, each with its own team. Measured on
this 2-core machine (a loop of 64×192 matmuls, two torch threads in each thread): alternating
phases ran 2.3–2.6× slower in both threads than the same loop in one thread alone, and a
2-thread engine decoded slower than a 1-thread one. ``release()`` frees the calling thread's
team (OpenMP 5.0 ``omp_pause_resource_all(omp_pause_soft)``): the engine's worker calls it
when its queue runs dry, the trainer after each step, and the next parallel op builds a fresh
team (microseconds). With it, both phases ran at the speed of one thread alone.

Where torch does not use libgomp (another OpenMP runtime, another OS), ``release`` does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import queue

RTLD_NOLOAD = getattr(os, "RTLD_NOLOAD", 4)

PAUSE_SOFT = 1
"""``omp_pause_soft``: free the team's threads; keep the runtime's other state."""


@functools.cache
def _libgomp():
    import torch

    if "OpenMP" not in torch.__config__.parallel_info():
        return None
    found = sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp*.so*")))
    names = [*found, "libgomp.so.1"]
    for name in names:
        try:
            lib = ctypes.CDLL(name, mode=RTLD_NOLOAD)  # only a library torch loaded
        except OSError:
            continue
        if hasattr(lib, "omp_pause_resource_all"):
            lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
            return lib
    return None


def runtime():
    """Torch's GNU OpenMP runtime, loaded (a ``ctypes`` handle), or None where torch runs on another."""
    return _libgomp()


def release() -> bool:
    """Free the calling thread's OpenMP team, if it has one; whether the runtime took the call."""
    lib = _libgomp()
    return lib is not None and lib.omp_pause_resource_all(PAUSE_SOFT) == 0


def get_idle(q: queue.Queue):
    """``q.get()``, and if that would wait, first ``release()``: a worker thread going idle."""
    try:
        return q.get_nowait()
    except queue.Empty:
        release()
        return q.get()
