"""The decode step's work besides its matrix products as small C loops (``step.c``), built once
per process.

The torch engine's decode step attends one query per row and head against that row's cache: on
the embedded model 96 products of 3×32 by 32×N a layer, where torch's batched matmul spends most of
its time per matrix. ``step.c`` does rotary positions, scores, mask, softmax and weighted values
for a row and key/value head in one AVX-512 loop, its rows split over the calling thread's OpenMP
team (torch's own GNU runtime, when gcc builds it); and RMSNorm and the MLP's ``silu(gate) * up``,
each one call where torch makes several (``docs/performance.md`` has the timings). It is C through
``ctypes`` rather than a torch extension so that it builds in under a second with the system's C
compiler and no torch headers; the library is built into a private temporary directory, loaded,
and the directory removed, so nothing on disk outlives the process for anyone to replace. No
compiler, no AVX-512, or a failed build: ``kernel()`` says why and the engine keeps torch's
operations (``engine.native_kernels = false`` asks for them).
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

SOURCE = Path(__file__).with_name("step.c")
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


class Kernels:
    """``step.c``'s functions, loaded."""

    def __init__(self, so: ctypes.CDLL):
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        self.attend, self.rms_norm, self.silu_mul = so.rl_attend, so.rl_rms_norm, so.rl_silu_mul
        self.attend.argtypes = [ptr] * 7 + [ctypes.c_float] + [i64] * 12
        self.attend.restype = ctypes.c_int
        self.rms_norm.argtypes = [ptr, ptr, ptr, i64, i64, i64, ctypes.c_float]
        self.rms_norm.restype = None
        self.silu_mul.argtypes = [ptr, ptr, i64]
        self.silu_mul.restype = None


def kernel() -> Kernels | str:
    """The loaded kernels, or a string saying why there are none (built on the first call in a
    process, then remembered)."""
    with _lock:
        if "fn" not in _built:
            _built["fn"] = _build()
            if isinstance(_built["fn"], str):
                log.info("the decode step stays on torch's operations: %s", _built["fn"])
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
    if not so.rl_ready():
        return "this CPU has no AVX-512 (the loops are written for it)"
    return Kernels(so)


def _gnu(cc: str) -> bool:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Free Software Foundation" in out and "clang" not in out


def _f32(*ts: torch.Tensor) -> bool:
    return all(t.dtype == torch.float32 and t.device.type == "cpu" for t in ts)


def usable(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether ``attend`` takes these: float32 on the CPU, a head size it is built for, each key and
    value contiguous in its last dimension, the queries contiguous."""
    return (_f32(q, keys, values) and keys.shape[-1] in HEAD_DIMS and keys.stride(-1) == 1
            and values.stride(-1) == 1 and q.is_contiguous())


def attend(k: Kernels, q_BHGD: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias_BN: torch.Tensor | None,
           rope: tuple[torch.Tensor, torch.Tensor, float] | None = None) -> torch.Tensor:
    """``rl_attend``: each row's ``G`` query heads per key/value head against its ``N`` cached keys
    and values (``keys``, ``values``: (B, H, N, D) views of the cache), ``bias_BN`` (0 or -inf,
    float32, contiguous rows) added to the scores; (B, H, G, D). ``rope``: the rotary tables
    ``cos``, ``sin`` (B, D, contiguous) and the attention's scale — the queries are then rotated and
    scaled, and **each row's last key is rotated in place in the cache** (the step appends it raw)."""
    B, H, N, D = keys.shape
    out = torch.empty_like(q_BHGD)
    cs, sn, scale = (rope[0].data_ptr(), rope[1].data_ptr(), rope[2]) if rope is not None else (None, None, 1.0)
    rc = k.attend(q_BHGD.data_ptr(), keys.data_ptr(), values.data_ptr(),
                  bias_BN.data_ptr() if bias_BN is not None else None, out.data_ptr(), cs, sn, scale,
                  B, H, q_BHGD.shape[2], N, D, *keys.stride()[:3], *values.stride()[:3],
                  bias_BN.stride(0) if bias_BN is not None else 0)
    if rc != 0:
        raise RuntimeError(f"rl_attend failed with code {rc} (1: out of memory, 2: head size {D})")
    return out


def norm_usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``rms_norm`` takes these: float32 on the CPU, rows of ``x`` contiguous, the weight too."""
    return _f32(x, weight) and x.dim() == 2 and x.stride(1) == 1 and weight.is_contiguous()


def rms_norm(k: Kernels, x_BH: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x²) + eps) * weight`` of each row, into a new contiguous tensor."""
    out = torch.empty(x_BH.shape, dtype=torch.float32)
    k.rms_norm(x_BH.data_ptr(), weight.data_ptr(), out.data_ptr(), x_BH.shape[0], x_BH.shape[1], x_BH.stride(0), eps)
    return out


def silu_usable(gate: torch.Tensor, up: torch.Tensor) -> bool:
    """Whether ``silu_mul`` takes these: float32 on the CPU, contiguous, one shape."""
    return _f32(gate, up) and gate.shape == up.shape and gate.is_contiguous() and up.is_contiguous()


def silu_mul(k: Kernels, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``, written into ``gate`` (returned)."""
    k.silu_mul(gate.data_ptr(), up.data_ptr(), gate.numel())
    return gate
