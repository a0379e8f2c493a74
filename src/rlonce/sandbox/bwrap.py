"""Bubblewrap sandbox: each command runs in fresh Linux namespaces over a private workspace.

What it protects against:
  * reading the host: only system directories tools need are visible, read-only (``/usr`` and
    the merged-usr links, ``/etc/alternatives``, ``/etc/ld.so.cache``); the host's home, the
    project checkout, run directories and task packs are not mounted, so hidden tests and
    reference answers cannot be reached by any path;
  * the network: a new, empty network namespace (loopback only);
  * other processes: own pid, ipc, uts and user namespaces; inside, the agent is uid 1000
    with no capabilities; ``/tmp`` is a fresh tmpfs per command;
  * runaway commands: rlimits on CPU seconds, address space, process count and file size
    (via ``prlimit``), a wall-clock timeout that kills the whole process tree (bwrap's pid 1
    dies, so the namespace dies), and a cap on captured output. RLIMIT_NPROC is not enforced
    for root, so when the host's cgroup-v1 ``pids`` hierarchy is writable every command runs in
    its own pids cgroup (``pids.max`` = the process limit), which also lets the sandbox kill
    every process the command left behind.

What it does not protect against:
  * kernel exploits: namespaces share the host kernel (use gVisor/Firecracker/VMs for hostile code);
  * fork bombs when running as root on a host without a writable pids cgroup (only the
    wall clock stops them there);
  * disk exhaustion beyond one file's size limit: the workspace lives on a host directory;
  * timing side channels and CPU contention with other sandboxes;
  * reading the system directories that are mounted (they are public software, not secrets).

The workspace persists across ``exec`` calls of one sandbox; ``snapshot``/``restore`` copy it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from rlonce.sandbox.base import ExecResult, SandboxError

WORKDIR = "/work"


class BubblewrapMissing(SandboxError):
    pass


def find_bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise BubblewrapMissing(
            "bubblewrap (bwrap) is not installed; install it with `apt-get install bubblewrap` "
            "(or run `make quickstart` as root, which installs it)"
        )
    return path


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 10
    address_space_mb: int = 1024
    processes: int = 64
    file_size_mb: int = 16
    wall_seconds: float = 10.0
    output_bytes: int = 16384


class BwrapSandbox:
    """``ro_binds`` maps extra host directories to read-only paths inside (e.g. a test runner's
    site-packages); ``hide`` lists visible paths to cover with an empty tmpfs (e.g. a system
    copy of a package under test); ``env`` adds environment variables."""

    def __init__(self, limits: Limits | None = None, *, root: str | None = None,
                 ro_binds: dict[str, str] | None = None, hide: list[str] | None = None,
                 env: dict[str, str] | None = None, workspace: Path | None = None, share_net: bool = False):
        self.limits = limits or Limits()
        self.share_net = share_net
        """Keep the host's network namespace (an outside agent must reach the gateway on loopback)."""
        self.ro_binds = dict(ro_binds or {})
        self.hide = list(hide or [])
        self.env = dict(env or {})
        self._bwrap = find_bwrap()
        self._prlimit = shutil.which("prlimit")
        self._host_dir = Path(tempfile.mkdtemp(prefix="rlonce-sbx-", dir=root))
        if workspace is not None:  # another sandbox's workspace, shared (not removed on close)
            self.workspace = Path(workspace)
        else:
            self.workspace = self._host_dir / "work"
            self.workspace.mkdir()
        self._snapshots: dict[str, Path] = {}
        self._closed = False

    # ---- files ---------------------------------------------------------------------------
    def _host_path(self, path: str) -> Path:
        rel = Path(path)
        if rel.is_absolute():
            rel = rel.relative_to(WORKDIR) if str(rel).startswith(WORKDIR + "/") else None
        if rel is None or ".." in rel.parts:
            raise ValueError(f"path {path!r} is outside the sandbox workspace {WORKDIR}")
        return self.workspace / rel

    def put_file(self, path: str, data: bytes | str) -> None:
        dest = self._host_path(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data.encode() if isinstance(data, str) else data)

    def get_file(self, path: str) -> bytes:
        return self._host_path(path).read_bytes()

    # ---- snapshots -----------------------------------------------------------------------
    def snapshot(self) -> str:
        sid = uuid.uuid4().hex[:12]
        dest = self._host_dir / f"snap-{sid}"
        shutil.copytree(self.workspace, dest, symlinks=True)
        self._snapshots[sid] = dest
        return sid

    def restore(self, snapshot_id: str) -> None:
        try:
            src = self._snapshots[snapshot_id]
        except KeyError:
            raise ValueError(f"unknown snapshot {snapshot_id!r}") from None
        shutil.rmtree(self.workspace)
        shutil.copytree(src, self.workspace, symlinks=True)

    # ---- execution -----------------------------------------------------------------------
    def command(self, cmd: str) -> list[str]:
        lim = self.limits
        argv = []
        if self._prlimit:
            argv += [
                self._prlimit,
                f"--cpu={lim.cpu_seconds}",
                f"--as={lim.address_space_mb << 20}",
                f"--nproc={lim.processes}",
                f"--fsize={lim.file_size_mb << 20}",
                "--",
            ]
        argv += [self._bwrap, "--ro-bind", "/usr", "/usr"]
        for link, target in (("/bin", "usr/bin"), ("/sbin", "usr/sbin"), ("/lib", "usr/lib"),
                             ("/lib64", "usr/lib64"), ("/lib32", "usr/lib32")):
            if os.path.islink(link):
                argv += ["--symlink", target, link]
        for etc in ("/etc/alternatives", "/etc/ld.so.cache"):
            if os.path.exists(etc):
                argv += ["--ro-bind", etc, etc]
        for host, dest in self.ro_binds.items():
            argv += ["--ro-bind", host, dest]
        for path in self.hide:
            if os.path.exists(path):
                argv += ["--tmpfs", path] if os.path.isdir(path) else ["--ro-bind", "/dev/null", path]
        argv += [
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--bind", str(self.workspace), WORKDIR, "--chdir", WORKDIR,
            *(["--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
              if self.share_net else ["--unshare-all", "--unshare-user"]),
            "--uid", "1000", "--gid", "1000",
            "--hostname", "sandbox", "--cap-drop", "ALL",
            "--die-with-parent", "--new-session", "--clearenv",
            "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
            "--setenv", "HOME", WORKDIR, "--setenv", "LANG", "C.UTF-8",
        ]
        for k, v in self.env.items():  # after --clearenv, which bwrap applies where it stands
            argv += ["--setenv", k, v]
        argv += ["--", "/bin/sh", "-c", cmd]
        return argv

    async def exec(self, cmd: str, timeout: float | None = None) -> ExecResult:
        if self._closed:
            raise SandboxError("sandbox is closed")
        wall = timeout if timeout is not None else self.limits.wall_seconds
        t0 = time.perf_counter()
        argv = self.command(cmd)
        group = _pids_cgroup(self.limits.processes)
        if group is not None:  # join the cgroup before anything forks
            argv = ["/bin/sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *argv]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            )
        except OSError as e:
            _remove_cgroup(group)
            raise SandboxError(f"could not start bwrap: {e}") from e
        try:
            return await self._wait(proc, wall, t0)
        finally:
            _remove_cgroup(group)

    async def _wait(self, proc, wall: float, t0: float) -> ExecResult:
        cap = self.limits.output_bytes
        buf = bytearray()
        truncated = timed_out = False

        async def pump() -> None:
            nonlocal truncated
            assert proc.stdout is not None
            while chunk := await proc.stdout.read(65536):
                room = max(cap - len(buf), 0)
                truncated = truncated or len(chunk) > room
                buf.extend(chunk[:room])
            await proc.wait()

        try:
            await asyncio.wait_for(pump(), wall)
        except asyncio.TimeoutError:
            timed_out = True
            _kill_tree(proc.pid)
            await proc.wait()
        except asyncio.CancelledError:
            _kill_tree(proc.pid)
            raise
        code = proc.returncode if proc.returncode is not None else -9
        if code == 1 and buf.startswith(b"bwrap: "):
            raise SandboxError(f"bwrap failed: {buf.decode(errors='replace').strip()}")
        return ExecResult(code, buf.decode("utf-8", errors="replace"), timed_out, truncated,
                          time.perf_counter() - t0)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            shutil.rmtree(self._host_dir, ignore_errors=True)

    def __del__(self) -> None:  # best effort; close() is the contract
        try:
            self.close()
        except Exception:
            pass


PIDS_ROOT = Path("/sys/fs/cgroup/pids")


def _pids_cgroup(limit: int) -> Path | None:
    """A fresh cgroup-v1 pids group capped at ``limit`` processes, or None where unavailable."""
    if not os.access(PIDS_ROOT, os.W_OK):
        return None
    group = PIDS_ROOT / f"rlonce-{uuid.uuid4().hex[:12]}"
    try:
        group.mkdir()
        (group / "pids.max").write_text(str(limit))
    except OSError:
        return None
    return group


def _remove_cgroup(group: Path | None) -> None:
    """Kill whatever the command left in its group, then remove the group."""
    if group is None:
        return
    for _ in range(50):
        try:
            pids = [int(x) for x in (group / "cgroup.procs").read_text().split()]
        except OSError:
            return
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    try:
        group.rmdir()
    except OSError:
        pass


def _kill_tree(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass

