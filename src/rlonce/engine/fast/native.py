"""The decode step's work besides its matrix products as small C loops (``step.c``), built once
per machine.

The torch engine's decode step attends one query per row and head against that row's cache: on
the embedded model 96 products of 3×32 by 32×N a layer, where torch's batched matmul spends most of
its time per matrix. ``step.c`` does rotary positions, scores, mask, softmax and weighted values
for a row and key/value head in one loop (AVX-512, or AVX2 with FMA where the CPU has no AVX-512:
``-march=native`` picks), its rows split over the calling thread's OpenMP
team (torch's own GNU runtime, when gcc builds it); and RMSNorm and the MLP's ``silu(gate) * up``,
each one call where torch makes several (``docs/performance.md`` has the timings). It is C through
``ctypes`` rather than a torch extension so that it builds in under a second with the system's C
compiler and no torch headers.

The library is built once per machine into ``cache_dir()`` as ``step-<key>.so``, the key a digest
of what decides its bytes: ``step.c``'s source and the compile flags, the compiler's
path and ``--version``, the CPU's feature flags (``-march=native``), the platform and machine. Every
later process — each Ray actor — loads that file instead of compiling. Whoever can replace a
library we load runs code as us (root, usually), so the cache is trusted only as far as nobody
else can write it: the directory is made 0700, and it, each directory above it (unless sticky, as
``/tmp``) and each file in it must be owned by us (or root, for the directories above) and not
writable by group or others, else the cache is refused and the library built privately, as
without one: into a temporary directory, loaded and removed. A build is compiled to a temporary
name in the cache directory and renamed into place, so a reader never sees part of a file and two
first builds racing leave one whole library (the last rename wins); its SHA-256 goes beside it
(``step-<key>.sha256``), and a loader hashes the very file it then loads through
``/proc/self/fd`` (no path to swap in between): a library that does not match is rebuilt. That
catches a truncated or damaged file, not a forged pair written by someone with our uid — who
could replace the Python code as well. No compiler, neither AVX-512 nor AVX2, or a failed build: ``kernel()``
says why and the engine keeps torch's operations (``engine.fast_path = false`` turns the whole fast
path off).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import platform
import shutil
import stat
import subprocess
import sys
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
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC")
"""What every build passes the compiler, besides ``-fopenmp`` (gcc beside torch's GNU OpenMP) and the files."""
NO_COMPILER = "no C compiler (cc, gcc or clang) on PATH"
ISA = {512: "avx512", 256: "avx2"}
"""``rl_ready()``'s answer → the instructions ``step.c`` was compiled with (0: neither, no loops)."""

_lock = threading.Lock()
_built: dict[str, object] = {}


class _Untrusted(Exception):
    """The cache cannot be used safely; the message says why."""


def compiler() -> str | None:
    """The C compiler to build with: ``$CC``, else Python's own, else ``cc``, ``gcc`` or ``clang``."""
    for name in (os.environ.get("CC"), (sysconfig.get_config_var("CC") or "").split(" ")[0], "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def cache_dir() -> Path:
    """Where built libraries are kept: ``$RLONCE_CACHE/native`` (the root converted models share,
    ``rlonce.model.loader``), else ``$XDG_CACHE_HOME/rlonce/native``, else ``~/.cache/rlonce/native``."""
    root = os.environ.get("RLONCE_CACHE")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        root = os.path.join(xdg if os.path.isabs(xdg) else Path.home() / ".cache", "rlonce")
    return Path(os.path.abspath(root)) / "native"


def cache_key(cc: str, version: str, tries: list[list[str]]) -> str:
    """The digest a library is kept under: the source, the flags of each try, the compiler's path and
    ``--version``, the CPU's feature flags (``-march=native`` builds for them), platform and machine."""
    parts = {"source": hashlib.sha256(SOURCE.read_bytes()).hexdigest(), "flags": tries, "compiler": cc,
             "version": version, "cpu": _cpu_flags(), "platform": sys.platform, "machine": platform.machine()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


class Kernels:
    """``step.c``'s functions, loaded."""

    def __init__(self, so: ctypes.CDLL, where: str):
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        self.attend, self.rms_norm, self.silu_mul = so.rl_attend, so.rl_rms_norm, so.rl_silu_mul
        self.attend.argtypes = [ptr] * 7 + [ctypes.c_float] + [i64] * 12
        self.attend.restype = ctypes.c_int
        self.rms_norm.argtypes = [ptr, ptr, ptr, i64, i64, i64, ctypes.c_float]
        self.rms_norm.restype = None
        self.silu_mul.argtypes = [ptr, ptr, i64]
        self.silu_mul.restype = None
        self.where = where
        """How this process got them: built into the cache, loaded from it, or built privately (why)."""
        self.isa = ISA[so.rl_ready()]
        """The vector instructions they were compiled for: ``avx512`` or ``avx2``."""


def kernel() -> Kernels | str:
    """The loaded kernels, or a string saying why there are none (loaded from the machine's cache,
    or built, on the first call in a process, then remembered)."""
    with _lock:
        if "fn" not in _built:
            _built["fn"] = _load()
            if isinstance(_built["fn"], str):
                log.info("the decode step stays on torch's operations: %s", _built["fn"])
        return _built["fn"]


def _load() -> Kernels | str:
    """The library from ``cache_dir()``, built into it first when missing or damaged; built privately
    when the cache cannot be trusted or used (one logged line says why)."""
    cc = compiler()
    if cc is None:
        return NO_COMPILER
    version = _version(cc)
    tries = _tries(cc, version)
    where = cache_dir()
    try:
        _check_dir(where)
        lib = where / f"step-{cache_key(cc, version, tries)}.so"
        found = _from_cache(lib)
        return found if found is not None else _into_cache(cc, tries, lib)
    except _Untrusted as e:
        why = str(e)
    except (OSError, subprocess.SubprocessError) as e:
        why = f"{type(e).__name__}: {e}"
    log.warning("native kernels: not using the cache at %s (%s); building privately", where, why)
    return _build(f"the cache at {where} was not used: {why}")


def _build(why: str = "") -> Kernels | str:
    """Built into a private temporary directory, loaded, and the directory removed."""
    cc = compiler()
    if cc is None:
        return NO_COMPILER
    tmp = tempfile.mkdtemp(prefix="rlonce-attend-")
    try:
        lib = os.path.join(tmp, "attend.so")
        failed = _compile(cc, _tries(cc, _version(cc)), lib)
        if failed:
            return failed
        so = ctypes.CDLL(lib)
    except (OSError, subprocess.SubprocessError) as e:
        return f"building {SOURCE.name} failed: {e}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _ready(so, f"built privately ({why})" if why else "built privately")


def _compile(cc: str, tries: list[list[str]], out: str) -> str | None:
    """Build ``out`` with the first of ``tries`` that works; None, or the compiler's last line."""
    for flags in tries:
        done = subprocess.run([cc, *flags, "-o", out, str(SOURCE)], capture_output=True, text=True, timeout=120)
        if done.returncode == 0:
            return None
    last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return f"{cc} failed to build {SOURCE.name}: {last}"


def _tries(cc: str, version: str) -> list[list[str]]:
    # threads only from torch's own OpenMP runtime: GNU's, which gcc's -fopenmp links by the
    # same name (clang's would load a second runtime with a team of its own)
    gnu = "Free Software Foundation" in version and "clang" not in version
    return [[*FLAGS, "-fopenmp"], list(FLAGS)] if gnu and omp.runtime() is not None else [list(FLAGS)]


def _version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpu_flags() -> str:
    """A digest of the CPU feature lines of ``/proc/cpuinfo`` (``flags`` on x86, ``Features`` on Arm)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError as e:
        raise _Untrusted(f"cannot read /proc/cpuinfo to key the cache by the CPU: {e.strerror}") from e
    lines = {" ".join(sorted(line.split(":", 1)[1].split())) for line in text.splitlines()
             if line.split(":", 1)[0].strip() in ("flags", "Features") and ":" in line}
    if not lines:
        raise _Untrusted("no CPU feature flags in /proc/cpuinfo to key the cache by")
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()


def _check_dir(where: Path) -> None:
    """Make ``where`` (0700) and refuse it unless only we can change what is in it: it ours and not
    writable by group or others, each directory above it root's or ours and not so writable unless
    sticky (``/tmp``)."""
    try:
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise _Untrusted(f"cannot make it: {e.strerror}") from e
    st = os.lstat(where)
    if not stat.S_ISDIR(st.st_mode):
        raise _Untrusted("it is not a directory")
    _check_owner(st, "it")
    for up in {*where.parents, *Path(os.path.realpath(where)).parents}:
        st = os.stat(up)
        if st.st_uid not in (0, os.geteuid()):
            raise _Untrusted(f"{up} belongs to uid {st.st_uid}")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise _Untrusted(f"{up} is writable by others and not sticky")


def _check_owner(st: os.stat_result, what: str) -> None:
    if st.st_uid != os.geteuid():
        raise _Untrusted(f"{what} belongs to uid {st.st_uid}, not {os.geteuid()}")
    if st.st_mode & 0o022:
        raise _Untrusted(f"{what} is {'world' if st.st_mode & 0o002 else 'group'}-writable")


def _open_file(path: Path) -> int | None:
    """A descriptor of ``path`` (never through a link), checked as ``_check_owner``; None if missing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _Untrusted(f"cannot open {path.name}: {e.strerror}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Untrusted(f"{path.name} is not a regular file")
        _check_owner(st, path.name)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _sha256(fd: int) -> str:
    with open(fd, "rb", closefd=False) as f:
        f.seek(0)
        return hashlib.file_digest(f, "sha256").hexdigest()


def _from_cache(lib: Path) -> Kernels | str | None:
    """The cached library, if there is one and it matches its recorded SHA-256; else None."""
    fd = _open_file(lib)
    if fd is None:
        return None
    try:
        side = _open_file(lib.with_suffix(".sha256"))
        recorded = ""
        if side is not None:
            with open(side, "rb") as f:
                recorded = f.read(200).decode("ascii", "replace").strip()
        if _sha256(fd) != recorded:
            log.info("native kernels: %s does not match its recorded SHA-256; rebuilding it", lib)
            return None
        return _ready(ctypes.CDLL(f"/proc/self/fd/{fd}"), f"loaded from the cache at {lib}")
    finally:
        os.close(fd)


def _into_cache(cc: str, tries: list[list[str]], lib: Path) -> Kernels | str:
    """Compile to a temporary name beside ``lib``, record its SHA-256, rename it into place, and load
    the file compiled (by its descriptor, whatever renames follow)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{lib.stem}-", suffix=".so", dir=lib.parent)
    os.close(fd)
    try:
        failed = _compile(cc, tries, tmp)
        if failed:
            return failed
        os.chmod(tmp, 0o600)  # the linker's mode follows the umask; the directory is ours alone
        fd = _open_file(Path(tmp))
        if fd is None:
            raise _Untrusted(f"{Path(tmp).name} vanished after the build")
        try:
            _write_atomically(lib.with_suffix(".sha256"), _sha256(fd) + "\n")
            os.replace(tmp, lib)
            return _ready(ctypes.CDLL(f"/proc/self/fd/{fd}"), f"built into the cache at {lib}")
        finally:
            os.close(fd)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with open(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def _ready(so: ctypes.CDLL, where: str) -> Kernels | str:
    if so.rl_ready() not in ISA:
        return "this CPU has neither AVX-512 nor AVX2 with FMA (the loops are written for them)"
    return Kernels(so, where)


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
