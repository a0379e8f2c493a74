"""A bubblewrap sandbox with a memory cap of its own choosing, for the visual renderer (a browser:
no address-space rlimit, ``Limits.address_space_mb = 0``, the memory cgroup alone bounds it), and
its readings of that cgroup. Every ``BwrapSandbox`` gets a memory cgroup capped at
``Limits.memory_mb`` where one can be made (``rlonce.sandbox.memcg``)."""

from __future__ import annotations

from dataclasses import replace

from rlonce.sandbox import memcg
from rlonce.sandbox.bwrap import BwrapSandbox, Limits


class CgroupSandbox(BwrapSandbox):
    """A ``BwrapSandbox`` whose commands run in one memory cgroup capped at ``memory_mb``;
    ``memory_capped`` says whether one could be made."""

    def __init__(self, limits: Limits | None = None, *, memory_mb: int, cgroup_prefix: str = "rlonce-sandbox",
                 **kwargs):
        super().__init__(replace(limits or Limits(), memory_mb=memory_mb), cgroup_prefix=cgroup_prefix, **kwargs)

    def oom_kills(self) -> int:
        """How many processes the kernel killed for exhausting the cgroup's memory so far."""
        return memcg.oom_kills(self.cgroup)

    def peak_memory_mb(self) -> float | None:
        return memcg.peak_memory_mb(self.cgroup)
