"""Host-side mounts for the bubblewrap sandbox (root only): a size-capped tmpfs per workspace,
read-only bind mounts that stage a source the sandbox uid could not otherwise reach, and their
detached unmounts.

These run in the host's mount namespace through libc ``mount(2)``/``umount2(2)``, before any
sandboxed process exists, on paths rlonce created itself (under the sandbox's host directory),
so nothing the agent writes decides what is mounted where. They give no isolation by
themselves: the tmpfs bounds the workspace's size and inode count, the bind makes a path
readable, and ``rlonce.sandbox.bwrap`` decides what a sandbox sees. A process that is not root
gets ``OSError`` (``mount_tmpfs`` then returns False and the workspace is a plain directory).
"""

from __future__ import annotations

import ctypes
import os
import stat
from pathlib import Path

MS_NOSUID, MS_NODEV, MS_BIND, MS_REC = 2, 4, 4096, 16384
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def mount(source: str, target: Path, fstype: str | None, flags: int, data: str | None = None) -> None:
    rc = _libc.mount(source.encode(), str(target).encode(), fstype.encode() if fstype else None,
                     ctypes.c_ulong(flags), data.encode() if data else None)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(target))


def mount_tmpfs(path: Path, size_mb: int, uid: int | None) -> bool:
    """Mount a tmpfs owned by ``uid`` at ``path``, capped at ``size_mb`` and at 128 inodes per MiB
    (empty files cost memory too); False where mounting is not allowed."""
    opts = f"size={size_mb}m,nr_inodes={size_mb * 128},mode=0700" + (f",uid={uid},gid={uid}" if uid is not None else "")
    try:
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, opts)
    except OSError:
        return False
    return True


def umount(path: Path) -> None:
    _libc.umount2(str(path).encode(), MNT_DETACH)


def world_reachable(path: Path) -> bool:
    """Whether a process of any uid can reach ``path`` (every directory on the way searchable by
    others, and ``path`` itself readable by others)."""
    for parent in reversed(path.parents):
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
    mode = os.stat(path).st_mode
    need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
    return mode & need == need
