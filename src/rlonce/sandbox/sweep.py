"""Leftovers of sandboxes whose process died without closing them.

``BwrapSandbox.close`` (and, at interpreter exit, ``atexit``) removes a sandbox's host directory,
unmounts its workspace tmpfs and removes its memory cgroup. A process killed by SIGKILL, the OOM
killer or a power cut runs neither, and its sandboxes stay: directories under the temp root
(``rlonce-sbx-<pid>-…``, each with a tmpfs of up to ``Limits.workspace_mb`` mounted inside, whose
pages stay in memory) and cgroups ``<prefix>-<pid>-<id>``. Both names carry the pid of the process
that made them, so the first sandbox a process opens sweeps away those whose pid no longer runs:
it kills what is left in such a cgroup and removes it, unmounts what is mounted under such a
directory and removes the directory without following any link (``hostfs.remove_tree``: the
files are the agent's). A live process's sandboxes are never touched; a pid reused by another
process keeps its leftovers until that process ends (a false "alive" only delays the sweep).
Pids are this pid namespace's: processes in other pid namespaces must not share the temp root.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from rlonce.sandbox import hostfs, memcg, mounts

log = logging.getLogger(__name__)

DIR_PREFIX = "rlonce-sbx-"
_SWEPT: set[tuple[str, str]] = set()


def owner_pid(name: str, prefix: str) -> int | None:
    """The pid in ``<prefix><pid>-<rest>``, or None when ``name`` is not such a name."""
    if not name.startswith(prefix):
        return None
    pid, sep, rest = name[len(prefix):].partition("-")
    return int(pid) if sep and rest and pid.isdigit() else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path`` in this mount namespace, deepest first."""
    base = str(path)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])  # "\\040": a space
        if point == base or point.startswith(base + "/"):
            found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def sweep(root: Path, cgroup_prefix: str) -> dict[str, int]:
    """Remove the dead processes' sandbox directories under ``root`` (their mounts first) and
    their ``cgroup_prefix`` memory cgroups; returns how many of each."""
    done = {"dirs": 0, "mounts": 0, "cgroups": 0}
    for d in root.glob(DIR_PREFIX + "*"):
        pid = owner_pid(d.name, DIR_PREFIX)
        if pid is None or alive(pid) or d.is_symlink() or not d.is_dir():
            continue
        for point in mounts_under(d):
            mounts.umount(point)
            done["mounts"] += 1
        hostfs.remove_tree(d)
        done["dirs"] += 1
    cgroups = memcg.memory_root()
    for c in cgroups.glob(cgroup_prefix + "-*") if cgroups is not None else ():
        pid = owner_pid(c.name, cgroup_prefix + "-")
        if pid is not None and not alive(pid) and c.is_dir():
            memcg.remove_cgroup(c)
            done["cgroups"] += 1
    return done


def once(root: Path, cgroup_prefix: str) -> None:
    """``sweep`` the first time this process asks for this root and prefix (a failure is logged:
    leftovers cost memory, not correctness)."""
    key = (str(root), cgroup_prefix)
    if key in _SWEPT:
        return
    _SWEPT.add(key)
    try:
        done = sweep(root, cgroup_prefix)
    except OSError as e:
        log.warning("could not sweep dead processes' sandboxes under %s: %s", root, e)
        return
    if any(done.values()):
        log.warning("removed %d sandbox director%s (%d mount(s)) and %d memory cgroup(s) left by processes that "
                    "died without closing them", done["dirs"], "y" if done["dirs"] == 1 else "ies", done["mounts"],
                    done["cgroups"])
