"""Host-side access to trees a sandboxed agent wrote: safe by construction.

Everything inside a workspace is hostile input. The host (running as root) must never follow a
link the agent planted, block on a FIFO or device it left at a path the grader reads, read a
file of unbounded size, or recurse into a tree a thousand levels deep. Every function here:

  * walks paths one component at a time with ``O_NOFOLLOW`` relative to an open directory
    (``dir_fd``), so no symlink is followed anywhere on the way, and no path can leave ``root``;
  * opens files with ``O_NONBLOCK`` and checks ``fstat`` before reading: only regular files are
    read, FIFOs, sockets and devices are refused without ever blocking;
  * reads at most ``max_bytes`` (a bigger file is refused, not truncated silently);
  * walks trees iteratively (an explicit stack, never Python recursion), so depth is no weapon.

``HostileFile`` means the agent made the path unsafe: the agent's failure, never an
infrastructure failure. Python's ``openat2(RESOLVE_BENEATH)`` is not exposed in the standard
library, hence the component walk.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from rlonce.errors import PolicyInputError, input_problem

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class HostileFile(PolicyInputError):
    """A path the agent made unsafe (a symlink on the way, a FIFO or device, too large, too
    many entries, a NUL or a lone surrogate in its name): the agent's failure, never infra."""


def _parts(rel: str | os.PathLike) -> list[str]:
    if isinstance(rel, str) and (problem := input_problem(rel)):
        raise HostileFile(f"path {rel[:200]!r}: {problem}")
    parts = [p for p in Path(rel).parts if p not in ("", ".", "/")]
    if any(p == ".." for p in parts):
        raise HostileFile(f"path {str(rel)!r} climbs out of its root")
    return parts


def _open_dir(parent_fd: int, name: str) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise HostileFile(f"{name!r} is a symlink or not a directory") from None
        raise


def _walk_to_parent(root: Path, rel: str, *, create: bool = False) -> tuple[int, str]:
    """An open fd of the directory holding ``rel``'s last component (caller closes), and that
    component's name. No symlink is followed; ``create`` makes missing directories."""
    parts = _parts(rel)
    if not parts:
        raise HostileFile(f"path {rel!r} names the root itself")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            if create:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            nxt = _open_dir(fd, name)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


@contextlib.contextmanager
def opened_dir(root: Path, rel: str) -> Iterator[Path]:
    """``root/rel`` reached one component at a time without following a link (HostileFile for a
    link on the way or a climb out of ``root``), held open while the block runs and named by its
    ``/proc/self/fd`` path: what is walked and read below it stays inside it, whatever the agent
    renames or relinks meanwhile. An empty ``rel`` is ``root`` itself."""
    if not _parts(rel):
        yield root
        return
    parent, name = _walk_to_parent(root, rel)
    try:
        fd = _open_dir(parent, name)
    finally:
        os.close(parent)
    try:
        yield Path(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def read_file(root: Path, rel: str, max_bytes: int) -> bytes:
    """The bytes of regular file ``root/rel``. FileNotFoundError if absent; HostileFile for a
    symlink anywhere on the path, a non-regular file, or a file over ``max_bytes``."""
    parent, name = _walk_to_parent(root, rel)
    try:
        try:
            fd = os.open(name, FILE_FLAGS, dir_fd=parent)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise HostileFile(f"{rel!r} is a symlink") from None
            if e.errno == errno.ENXIO:  # a FIFO with no writer, or a socket
                raise HostileFile(f"{rel!r} is not a regular file") from None
            raise
    finally:
        os.close(parent)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HostileFile(f"{rel!r} is not a regular file")
        if st.st_size > max_bytes:
            raise HostileFile(f"{rel!r} holds {st.st_size} bytes, over the {max_bytes}-byte cap")
        chunks, left = [], max_bytes + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise HostileFile(f"{rel!r} grew past the {max_bytes}-byte cap while being read")
        return data
    finally:
        os.close(fd)


def write_file(root: Path, rel: str, data: bytes) -> None:
    """Write ``data`` to ``root/rel``, making missing parent directories. Whatever stands at the
    leaf (a file, a link, a FIFO) is replaced, never written through; a symlink or non-directory
    on the way is HostileFile."""
    parent, name = _walk_to_parent(root, rel, create=True)
    try:
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat.S_ISDIR(st.st_mode):
                raise HostileFile(f"{rel!r} is a directory")
            os.unlink(name, dir_fd=parent)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                     dir_fd=parent)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    finally:
        os.close(parent)


def walk(root: Path, skip: frozenset[str] = frozenset(), max_depth: int = 256) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry below ``root`` as (relative POSIX path, lstat), parents before children,
    iteratively and without following links; names in ``skip`` are left out with everything
    below them. Entries that vanish while walking are skipped; a tree deeper than ``max_depth``
    is HostileFile (no real repository nests that deep; paths past it near the kernel's limit)."""
    stack = [("", 0)]
    while stack:
        rel, depth = stack.pop()
        try:
            with os.scandir(os.path.join(root, rel) if rel else root) as it:
                entries = list(it)
        except (NotADirectoryError, FileNotFoundError, PermissionError):
            continue
        except OSError as e:
            raise _too_long(root, e) from None
        for e in entries:
            if e.name in skip:
                continue
            sub = f"{rel}/{e.name}" if rel else e.name
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            except OSError as err:
                raise _too_long(root, err) from None
            yield sub, st
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 >= max_depth:
                    raise HostileFile(f"{root} nests directories deeper than {max_depth} levels")
                stack.append((sub, depth + 1))


def _too_long(root: Path, err: OSError) -> Exception:
    if err.errno == errno.ENAMETOOLONG:
        return HostileFile(f"{root} holds paths longer than the system allows")
    return err


def remove_tree(path: Path) -> None:
    """Remove ``path`` and everything below it, following no link; a missing path is fine.
    Works at any depth with one open directory at a time (descend by name, climb by ``..``), so
    neither Python's recursion limit, the open-file limit nor PATH_MAX is reached; directories
    an agent made unreadable are opened up first (matters when not root)."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        path.unlink(missing_ok=True)
        return
    os.chmod(path, 0o700)
    fd = os.open(path, DIR_FLAGS)
    names: list[str] = []
    try:
        while True:
            sub = None
            for e in list(os.scandir(fd)):
                if e.is_dir(follow_symlinks=False):
                    sub = e.name
                    break
                try:
                    os.unlink(e.name, dir_fd=fd)
                except FileNotFoundError:
                    pass
            if sub is not None:
                os.chmod(sub, 0o700, dir_fd=fd)
                child = os.open(sub, DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd, _ = child, names.append(sub)
                continue
            if not names:
                break
            parent = os.open("..", DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(names.pop(), dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)


def copy_tree(src: Path, dest: Path, *, regular_only: bool = False, skip: frozenset[str] = frozenset(),
              max_bytes: int | None = None, max_entries: int | None = None) -> None:
    """Copy ``src`` into ``dest`` iteratively. Directories and regular files are copied (modes
    kept, content read through ``read_file``'s rules); symlinks are copied as links unless
    ``regular_only`` (then left out); FIFOs, sockets and devices are always left out. Names in
    ``skip`` are left out at any depth. HostileFile once the copy passes ``max_bytes`` in all or
    ``max_entries`` entries."""
    src, dest = Path(src), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    total = count = 0
    for rel, st in walk(src, skip):
        count += 1
        if max_entries is not None and count > max_entries:
            raise HostileFile(f"{src} holds more than {max_entries} entries")
        target = dest / rel
        if stat.S_ISDIR(st.st_mode):
            target.mkdir(exist_ok=True)
            os.chmod(target, (st.st_mode & 0o777) | 0o700)
        elif stat.S_ISREG(st.st_mode):
            total += st.st_size
            if max_bytes is not None and total > max_bytes:
                raise HostileFile(f"{src} holds more than {max_bytes} bytes")
            try:
                data = read_file(src, rel, max_bytes if max_bytes is not None else st.st_size + (1 << 20))
            except FileNotFoundError:
                continue
            target.write_bytes(data)
            os.chmod(target, st.st_mode & 0o777)
        elif stat.S_ISLNK(st.st_mode) and not regular_only:
            try:
                os.symlink(os.readlink(src / rel), target)
            except FileNotFoundError:
                continue
