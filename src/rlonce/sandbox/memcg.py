"""Memory cgroups (the cgroup v1 memory controller) for sandboxes: every process of a sandbox
in one cgroup, capped together.

Why: rlimits bound each process's address space, so a sandbox's total is its process cap times
that (64 × 1 GiB by default: more than this machine has), and a browser cannot live under an
address-space rlimit at all (Chromium reserves tens of GB it never touches). A memory cgroup
bounds what the sandbox's processes really use, together: past the cap the kernel reclaims and
then OOM-kills inside the cgroup, never elsewhere on the host.

How: rlonce (root) makes ``<prefix>-<pid>-<id>`` under its own memory cgroup, sets
``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes`` where swap accounting exists),
and the first process of each launch chain, still root, moves itself in (``enter``) before it
drops to the sandbox uid; every process after it inherits the cgroup, and the unprivileged uid
cannot move out (``/sys`` is not mounted inside, and the cgroup files are root's). Closing the
sandbox kills whatever is left in the cgroup and removes it.

What it does not do: where cgroups cannot be made (not root, no v1 memory controller mounted, a
read-only hierarchy) ``make_cgroup`` gives None and the sandbox runs without one; the rlimits
still hold. Kernel memory outside the controller's accounting and the page cache of shared
system files are not bounded by it.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path


def memory_root() -> Path | None:
    """The directory of this process's own cgroup in the v1 memory hierarchy, or None."""
    try:
        own = next(line.split(":", 2)[2].strip() for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if "memory" in line.split(":", 2)[1].split(","))
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except (OSError, StopIteration, IndexError):
        return None
    for line in mounts:
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] == "cgroup" and "memory" in fields[sep + 3].split(","):
            root, point = fields[3], fields[4]
            rel = os.path.relpath(own, root)
            if rel.startswith(".."):
                continue
            path = Path(point) / rel
            return path if (path / "memory.limit_in_bytes").exists() else None
    return None


def make_cgroup(memory_mb: int, prefix: str = "rlonce-sandbox") -> Path | None:
    """A fresh child cgroup capped at ``memory_mb``, or None where that is not possible."""
    if os.geteuid() != 0:
        return None
    root = memory_root()
    if root is None:
        return None
    path = root / f"{prefix}-{os.getpid()}-{secrets.token_hex(6)}"  # whose it is, for anyone sweeping
    try:
        path.mkdir()
    except OSError:
        return None
    try:
        limit = str(memory_mb << 20)
        (path / "memory.limit_in_bytes").write_text(limit)
        if (path / "memory.memsw.limit_in_bytes").exists():
            (path / "memory.memsw.limit_in_bytes").write_text(limit)
    except OSError:
        remove_cgroup(path)
        return None
    return path


def remove_cgroup(path: Path, wait_s: float = 2.0) -> None:
    """Kill every process left in the cgroup, then remove it (retried while they die)."""
    until = time.monotonic() + wait_s
    while True:
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > until:
                raise
            time.sleep(0.02)


def enter(path: Path | None) -> list[str]:
    """The launch chain's first step: move into cgroup ``path`` (nothing without one)."""
    return [] if path is None else ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(path)]


def oom_kills(path: Path | None) -> int:
    """How many processes the kernel killed for exhausting the cgroup's memory so far."""
    if path is None:
        return 0
    try:
        for line in (path / "memory.oom_control").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def peak_memory_mb(path: Path | None) -> float | None:
    if path is None:
        return None
    try:
        return int((path / "memory.max_usage_in_bytes").read_text()) / (1 << 20)
    except (OSError, ValueError):
        return None
