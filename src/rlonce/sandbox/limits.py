"""A sandbox's resource limits, and the rule for the limits of a command a policy runs."""

from __future__ import annotations

import signal
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 10
    address_space_mb: int = 1024  # 0: no RLIMIT_AS (a browser reserves tens of GB it never uses)
    processes: int = 64
    file_size_mb: int = 16
    wall_seconds: float = 10.0
    output_bytes: int = 16384
    workspace_mb: int = 512
    """Size cap of the workspace (a tmpfs of its own when rlonce runs as root)."""
    tmp_mb: int = 256
    """Size cap of each of ``/tmp`` and ``/dev/shm`` inside (fresh for every command)."""
    memory_mb: int = 4096
    """Memory of all the sandbox's processes together (tmpfs pages they write included): a memory
    cgroup, where rlonce runs as root with the v1 memory controller (``rlonce.sandbox.memcg``);
    past it the kernel OOM-kills inside the sandbox. 0: none (each process's RLIMIT_AS alone)."""


CPU_EXHAUSTED = 128 + signal.SIGXCPU
"""Exit status of a command its CPU limit stopped (SIGXCPU; one that catches it is killed a second later)."""

COMMAND_WALL_S = 60.0
"""The least wall-clock limit of an agent's command (``command_limits``)."""


def command_limits(cpu_seconds: int, **kw) -> Limits:
    """Limits of one command an agent runs: ``cpu_seconds`` bounds the command's own work; the
    wall clock, at least ``COMMAND_WALL_S`` and twice the CPU limit, only catches a command that
    waits (``sleep``, a blocked read). A wall limit equal to the CPU limit times out commands for
    the host's load alone: at a held-out evaluation's 128 concurrent sessions on a 2-core
    machine, a 5 s wall limit timed out 198 of 374 toolfind commands, and each agent read
    '[command timed out]' as its own failure (held-out success 0.20 against 0.52)."""
    return Limits(cpu_seconds=cpu_seconds, wall_seconds=max(COMMAND_WALL_S, 2.0 * cpu_seconds), **kw)
