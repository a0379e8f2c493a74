"""The decode step's attention as a small C loop (``attend.c``), built once per process.

The torch engine's decode step attends one query per row and head against that row's cache: on
the embedded model 96 products of 3×32 by 32×N a layer, where torch's batched matmul spends most of
its time per matrix. ``attend.c`` does scores, mask, softmax and weighted values for a row and
key/value head in one AVX-512 loop, its rows split over the calling thread's OpenMP team (torch's
own GNU runtime, when gcc builds it; ``docs/performance.md`` has the timings). It is C through
``ctypes`` rather than a torch extension so that it builds in under a second with the system's C
compiler and no torch headers; the library is built into a private temporary directory, loaded,
and the directory removed, so nothing on disk outlives the process for anyone to replace. No
compiler, no AVX-512, or a failed build: ``kernel()`` says why and the engine keeps torch's
products (``engine.native_attention = false`` asks for them).
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import subprocess
import sysconfig
import tempfile
import threading
from pathlib import Path

import torch

from rlonce.model import omp

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("attend.c")
HEAD_DIMS = (16, 32, 48, 64, 80, 96, 112, 128)
"""Head sizes the loop is built for."""

_lock = threading.Lock()
_built: dict[str, object] = {}


def compiler() -> str | None:
    """The C compiler to build with: ``$CC``, else Python's own, else ``cc``, ``gcc`` or ``clang``."""
    for name in (os.environ.get("CC"), (sysconfig.get_config_var("CC") or "").split(" ")[0], "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def kernel():
    """The loaded ``rl_attend`` function, or a string saying why there is none (built on the first
    call in a process, then remembered)."""
    with _lock:
        if "fn" not in _built:
            _built["fn"] = _build()
            if isinstance(_built["fn"], str):
                log.info("decode attention stays on torch's batched products: %s", _built["fn"])
        return _built["fn"]


def _build():
    cc = compiler()
    if cc is None:
        return "no C compiler (cc, gcc or clang) on PATH"
    tmp = tempfile.mkdtemp(prefix="rlonce-attend-")
    try:
        lib = os.path.join(tmp, "attend.so")
        flags = ["-O3", "-march=native", "-shared", "-fPIC", "-o", lib, str(SOURCE)]
        # threads only from torch's own OpenMP runtime: GNU's, which gcc's -fopenmp links by the
        # same name (clang's would load a second runtime with a team of its own)
        tries = [[*flags, "-fopenmp"], flags] if _gnu(cc) and omp.runtime() is not None else [flags]
        for args in tries:
            done = subprocess.run([cc, *args], capture_output=True, text=True, timeout=120)
            if done.returncode == 0:
                break
        else:
            last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            return f"{cc} failed to build {SOURCE.name}: {last}"
        so = ctypes.CDLL(lib)
    except (OSError, subprocess.SubprocessError) as e:
        return f"building {SOURCE.name} failed: {e}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not so.rl_attend_ready():
        return "this CPU has no AVX-512 (the loop is written for it)"
    fn = so.rl_attend
    fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 12
    fn.restype = ctypes.c_int
    return fn


def _gnu(cc: str) -> bool:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Free Software Foundation" in out and "clang" not in out


def usable(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether the loop takes these: float32 on the CPU, a head size it is built for, each key and
    value contiguous in its last dimension, the queries contiguous."""
    return (q.dtype == keys.dtype == values.dtype == torch.float32 and q.device.type == "cpu"
            and keys.shape[-1] in HEAD_DIMS and keys.stride(-1) == 1 and values.stride(-1) == 1
            and q.is_contiguous())


def attend(fn, q_BHGD: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias_BN: torch.Tensor | None):
    """``rl_attend``: each row's ``G`` query heads per key/value head against its ``N`` cached keys
    and values (``keys``, ``values``: (B, H, N, D) views of the cache), ``bias_BN`` (0 or -inf,
    float32, contiguous rows) added to the scores; (B, H, G, D)."""
    B, H, N, D = keys.shape
    out = torch.empty_like(q_BHGD)
    rc = fn(q_BHGD.data_ptr(), keys.data_ptr(), values.data_ptr(), bias_BN.data_ptr() if bias_BN is not None else None,
            out.data_ptr(), B, H, q_BHGD.shape[2], N, D, *keys.stride()[:3], *values.stride()[:3],
            bias_BN.stride(0) if bias_BN is not None else 0)
    if rc != 0:
        raise RuntimeError(f"rl_attend failed with code {rc} (1: out of memory, 2: head size {D})")
    return out
