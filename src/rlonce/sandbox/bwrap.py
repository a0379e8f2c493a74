"""Bubblewrap sandbox: each command runs in fresh Linux namespaces over a private workspace.

Threat model: everything a sandboxed process does is hostile — it was written by a policy under
training that is rewarded for outcomes, and rlonce itself usually runs as root. The sandbox must
keep that process from gaining host privilege, reading host secrets, exhausting the host, or
reaching anything but its own workspace; and the host side must treat what the process leaves
behind as hostile too (``rlonce.sandbox.hostfs``).

What it defends, and how:
  * **no host privilege**: when rlonce runs as root, the whole launch chain drops to an
    unprivileged host uid before bubblewrap starts (``setpriv``; a fresh uid from
    ``UID_BASE`` per sandbox, owning only that sandbox's workspace), so bwrap runs
    unprivileged and uid 1000 inside maps to that host uid — never to host root. Nothing inside
    holds a capability over the host's namespaces; nested user namespaces are disabled
    (``--disable-userns``) and also denied by the seccomp filter;
  * **kernel knobs**: a fresh procfs whose ``/proc/sys``, ``/proc/sysrq-trigger`` and similar
    entries bwrap covers read-only, and which the unprivileged uid could not write anyway;
    ``/sys`` is not mounted;
  * **system calls**: a seccomp deny-list (``rlonce.sandbox.seccomp``: namespaces, mounts,
    keyrings, io_uring, ptrace and other processes' memory, bpf, perf, modules, clocks, …);
  * **secrets**: bwrap itself starts with an empty environment (its ``/proc/1/environ`` is
    visible inside), the command gets only the variables the sandbox sets; a fresh anonymous
    session keyring when ``keyctl`` (keyutils) is installed, and keyring system calls are
    denied inside either way. Only system directories tools need are visible, read-only
    (``/usr`` and the merged-usr links, ``/etc/alternatives``, ``/etc/ld.so.cache``) plus the
    explicit ``ro_binds``; the host's home, the project, run directories and task packs are not;
  * **the network**: a new, empty network namespace (loopback only). A sandbox that must reach
    a service (an outside harness and its gateway) gets a Unix socket bound in, never the
    host's network;
  * **exhaustion**: rlimits on CPU seconds, address space, processes (per sandbox, since each
    sandbox has its own uid) and file size; size-capped tmpfs for ``/tmp`` and ``/dev/shm``; ``/`` and ``/dev``
    read-only; the workspace is a size-capped tmpfs of its own when rlonce runs as root; a
    wall clock that returns from ``exec`` on time whatever the output rate, and a cap on
    captured output. ``close()`` kills every process a command left behind.

What it does not defend against:
  * kernel exploits through the allowed system calls (namespaces share the host kernel: use
    gVisor, Firecracker or VMs for code that may carry a kernel 0-day);
  * when rlonce does not run as root: sandboxes run as the invoking user (their workspace is a
    plain directory without a size cap; the file-size rlimit still holds);
  * timing side channels and CPU contention between sandboxes;
  * reading the system directories that are mounted (public software, not secrets).

The workspace persists across ``exec`` calls of one sandbox; ``snapshot``/``restore`` copy it.
"""

from __future__ import annotations

import asyncio
import atexit
import errno
import os
import secrets
import shutil
import signal
import tempfile
import time
import uuid
import weakref
from pathlib import Path

from rlonce.core import faults
from rlonce.errors import PolicyInputError, input_problem
from rlonce.sandbox import hostfs, memcg, mounts, seccomp, sweep
from rlonce.sandbox.base import ExecResult, SandboxError
from rlonce.sandbox.limits import Limits

WORKDIR = "/work"
COMMAND_CHARS = 120_000
"""The longest command a sandbox runs: ``/bin/sh -c CMD`` hands CMD to ``execve`` as one argument,
which the kernel caps at 128 KiB. Longer (the policy's) is a ``PolicyInputError``."""


def workspace_rel(path: str) -> str:
    """``path`` as the sandbox names it (``poc.bin``, ``./poc.bin``, ``/work/poc.bin``) relative to
    the workspace; ``hostfs.HostileFile`` (the policy's failure) for any other absolute path, a
    climb out with ``..``, the workspace itself, a NUL or a lone surrogate."""
    if problem := input_problem(path):
        raise hostfs.HostileFile(f"path {path[:200]!r}: {problem}")
    rel = Path(path.strip())
    if rel.is_absolute():
        rel = rel.relative_to(WORKDIR) if str(rel).startswith(WORKDIR + "/") else None
    if rel is None or ".." in rel.parts or not rel.parts or rel.as_posix() == ".":
        raise hostfs.HostileFile(f"path {path[:200]!r} is outside the sandbox workspace {WORKDIR}")
    return rel.as_posix()
UID_BASE = 2_000_000_000
"""Sandboxes started by root run as host uid ``UID_BASE + k`` (k random below ``UID_SPAN``): ids
no account uses, one per sandbox, so one sandbox's processes and files are not another's."""
UID_SPAN = 1 << 24
LAUNCH_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
"""The whole environment bwrap starts with (and so what ``/proc/1/environ`` shows inside)."""


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


class BwrapSandbox:
    """``ro_binds`` maps extra host paths to read-only paths inside (e.g. a test runner's
    site-packages, a gateway's Unix socket); ``hide`` lists visible paths to cover with an empty
    tmpfs (e.g. a system copy of a package under test); ``env`` adds environment variables;
    ``workspace`` and ``uid`` share another sandbox's workspace (its ``workspace`` and ``uid``;
    it stays that sandbox's to remove)."""

    def __init__(self, limits: Limits | None = None, *, root: str | None = None,
                 ro_binds: dict[str, str] | None = None, hide: list[str] | None = None,
                 env: dict[str, str] | None = None, workspace: Path | None = None, uid: int | None = None,
                 cgroup_prefix: str = "rlonce-sandbox"):
        self.limits = limits or Limits()
        self.hide = list(hide or [])
        self.env = dict(env or {})
        self._bwrap = find_bwrap()
        self._prlimit = shutil.which("prlimit")
        self._keyctl = shutil.which("keyctl")
        self._seccomp = seccomp.program()
        self._as_root = os.geteuid() == 0
        self.uid = uid if uid is not None else (UID_BASE + secrets.randbelow(UID_SPAN) if self._as_root else None)
        """The host uid sandboxed processes run as (None: the invoking user's)."""
        self._setpriv = shutil.which("setpriv") if self.uid is not None else None
        if self.uid is not None and self._setpriv is None:
            raise SandboxError("setpriv (util-linux) is missing: it is needed to drop root before bwrap starts")
        sweep.once(Path(root or tempfile.gettempdir()), cgroup_prefix)  # what SIGKILLed processes left
        self._host_dir = Path(tempfile.mkdtemp(prefix=f"{sweep.DIR_PREFIX}{os.getpid()}-", dir=root))
        os.chmod(self._host_dir, 0o711)  # the sandbox uid traverses it to reach its workspace
        self._mounts: list[Path] = []
        self.ro_binds = {self._reachable(Path(host), i): dest
                         for i, (host, dest) in enumerate((ro_binds or {}).items())}
        self.workspace_capped = False
        """Whether the workspace is a size-capped tmpfs (rlonce running as root)."""
        if workspace is not None:
            self.workspace = Path(workspace)
        else:
            self.workspace = self._host_dir / "work"
            self.workspace.mkdir(mode=0o700)
            if self._as_root:
                self.workspace_capped = mounts.mount_tmpfs(self.workspace, self.limits.workspace_mb, self.uid)
                if self.workspace_capped:
                    self._mounts.append(self.workspace)
        self.cgroup = memcg.make_cgroup(self.limits.memory_mb, cgroup_prefix) if self.limits.memory_mb else None
        self.memory_capped = self.cgroup is not None
        """Whether the sandbox's processes share a memory cgroup capped at ``Limits.memory_mb``."""
        self._snapshots: dict[str, Path] = {}
        self._running: set[int] = set()
        self._closed = False
        _LIVE.add(self)

    def _reachable(self, host: Path, i: int) -> str:
        """``host`` as a path the unprivileged sandbox uid can reach: itself when every directory
        on the way is searchable by others, else a read-only bind mount of it staged under this
        sandbox's host directory (root only)."""
        host = host.resolve()
        if not host.exists():
            raise SandboxError(f"sandbox mount source {host} does not exist")
        if self.uid is None or mounts.world_reachable(host):
            return str(host)
        stage = self._host_dir / f"bind-{i}"
        stage.mkdir() if host.is_dir() else stage.touch()
        try:
            mounts.mount(str(host), stage, None, mounts.MS_BIND | mounts.MS_REC)
        except OSError as e:
            raise SandboxError(f"sandbox mount source {host} is not readable by the sandbox uid and could not be "
                               f"staged ({e.strerror}); make its parent directories searchable (chmod o+x)") from e
        self._mounts.append(stage)
        return str(stage)

    # ---- files ---------------------------------------------------------------------------
    def put_file(self, path: str, data: bytes | str) -> None:
        """Write a file into the workspace from the host, following no link the agent planted."""
        hostfs.write_file(self.workspace, workspace_rel(path), data.encode() if isinstance(data, str) else data)

    def get_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read a workspace file from the host: regular files only, no link followed, at most
        ``max_bytes`` (default: the file-size limit). ``hostfs.HostileFile`` otherwise."""
        cap = max_bytes if max_bytes is not None else self.limits.file_size_mb << 20
        return hostfs.read_file(self.workspace, workspace_rel(path), cap)

    # ---- snapshots -----------------------------------------------------------------------
    def snapshot(self) -> str:
        sid = uuid.uuid4().hex[:12]
        dest = self._host_dir / f"snap-{sid}"
        hostfs.copy_tree(self.workspace, dest, max_bytes=self.limits.workspace_mb << 20)
        self._snapshots[sid] = dest
        return sid

    def restore(self, snapshot_id: str) -> None:
        try:
            src = self._snapshots[snapshot_id]
        except KeyError:
            raise ValueError(f"unknown snapshot {snapshot_id!r}") from None
        for entry in list(self.workspace.iterdir()):
            hostfs.remove_tree(entry)
        hostfs.copy_tree(src, self.workspace)

    # ---- execution -----------------------------------------------------------------------
    def command(self, cmd: str, seccomp_fd: int) -> list[str]:
        """The bwrap argv (after the launch chain) that runs ``cmd``."""
        lim = self.limits
        argv = [self._bwrap, "--ro-bind", "/usr", "/usr"]
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
            "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev",
            "--size", str(lim.tmp_mb << 20), "--tmpfs", "/tmp",
            "--size", str(lim.tmp_mb << 20), "--tmpfs", "/dev/shm",
            "--bind", str(self.workspace), WORKDIR, "--chdir", WORKDIR,
            "--remount-ro", "/", "--remount-ro", "/dev",
            "--unshare-all", "--unshare-user", "--disable-userns",
            "--uid", "1000", "--gid", "1000",
            "--hostname", "sandbox", "--cap-drop", "ALL",
            "--die-with-parent", "--new-session", "--clearenv",
            "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
            "--setenv", "HOME", WORKDIR, "--setenv", "LANG", "C.UTF-8",
        ]
        for k, v in self.env.items():  # after --clearenv, which bwrap applies where it stands
            argv += ["--setenv", k, v]
        argv += ["--seccomp", str(seccomp_fd), "--", "/bin/sh", "-c", cmd]
        return argv

    def _launcher(self, keep_fd: int) -> list[str]:
        """What runs before bwrap: a fresh anonymous session keyring, drop to the sandbox uid, set
        rlimits. Each step execs the next (one process); keyctl's "Joined session keyring" notice
        is kept out of the command's output (stderr parked on a spare fd other than ``keep_fd``).
        RLIMIT_NPROC counts the processes of one real uid, so with a uid per sandbox it is a
        per-sandbox process cap."""
        lim = self.limits
        spare = 3 if keep_fd != 3 else 4
        argv = memcg.enter(self.cgroup)  # as root, before anything drops to the sandbox uid
        if self._keyctl:
            argv += ["/bin/sh", "-c", f'exec {spare}>&2 2>/dev/null; exec "$@"', "sh", self._keyctl, "session", "-"]
        if self._setpriv:
            argv += [self._setpriv, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups"]
        if self._prlimit:
            cpu = f"--cpu={lim.cpu_seconds}:{lim.cpu_seconds + 1}"  # SIGXCPU (CPU_EXHAUSTED), SIGKILL a second later
            argv += [self._prlimit, cpu, "--core=0", f"--as={lim.address_space_mb << 20 or 'unlimited'}",
                     f"--nproc={lim.processes}", f"--fsize={lim.file_size_mb << 20}", "--"]
        if self._keyctl:
            argv += ["/bin/sh", "-c", f'exec 2>&{spare} {spare}>&-; exec "$@"', "sh"]
        return argv

    def _hand_over(self) -> None:
        """Give the sandbox uid what the host wrote into the workspace since the last command."""
        if self.uid is None:
            return
        os.chown(self.workspace, self.uid, self.uid)
        try:
            for rel, st in hostfs.walk(self.workspace, max_depth=64):
                if st.st_uid != self.uid:
                    os.chown(self.workspace / rel, self.uid, self.uid, follow_symlinks=False)
        except (hostfs.HostileFile, FileNotFoundError):
            pass  # deeper than any host write: the agent's own tree, already its uid's

    async def exec(self, cmd: str, timeout: float | None = None) -> ExecResult:
        if self._closed:
            raise SandboxError("sandbox is closed")
        faults.point("sandbox.exec", SandboxError)
        wall = timeout if timeout is not None else self.limits.wall_seconds
        t0 = time.perf_counter()
        proc = await self._start(cmd, asyncio.subprocess.PIPE)
        try:  # whatever the command left running dies with its pid namespace
            return await self._wait(proc, wall, t0)
        finally:
            self._running.discard(proc.pid)

    async def spawn(self, cmd: str, pass_fds: tuple[int, ...] = ()):
        """Start ``cmd`` as a long-lived process (a service) with ``pass_fds`` (each >= ``SPAWN_MIN_FD``)
        open in it and its output discarded; it runs until it exits or ``close()`` kills it."""
        if self._closed:
            raise SandboxError("sandbox is closed")
        if any(fd < SPAWN_MIN_FD for fd in pass_fds):
            raise ValueError(f"pass file descriptors numbered {SPAWN_MIN_FD} or more")
        return await self._start(cmd, asyncio.subprocess.DEVNULL, pass_fds)

    async def _start(self, cmd: str, stdout, pass_fds: tuple[int, ...] = ()):
        self._hand_over()
        if problem := input_problem(cmd, limit=COMMAND_CHARS):
            raise PolicyInputError(f"the command cannot run: {problem.replace('arguments hold', 'command holds')}")
        r = _seccomp_fd(self._seccomp)
        piped = stdout == asyncio.subprocess.PIPE
        try:
            argv = self._launcher(r) + self.command(cmd, r)
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=stdout,
                stderr=asyncio.subprocess.STDOUT if piped else asyncio.subprocess.DEVNULL,
                start_new_session=True, pass_fds=(r, *pass_fds), env=LAUNCH_ENV)
        except OSError as e:
            if e.errno == errno.E2BIG:  # the policy's command (or its environment) is over execve's limit
                raise PolicyInputError(f"the command of {len(cmd)} characters is over the kernel's argument "
                                       "limit") from None
            raise SandboxError(f"could not start bwrap: {e}") from e
        finally:
            os.close(r)
        self._running.add(proc.pid)
        return proc

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
                await asyncio.sleep(0)  # a full pipe never suspends read(): let the wall clock fire
            await proc.wait()

        try:
            await asyncio.wait_for(pump(), wall)
        except asyncio.TimeoutError:
            timed_out = True
            _kill_tree(proc.pid)
            try:  # read to EOF: a paused pipe keeps asyncio from reporting the exit
                await asyncio.wait_for(_drain(proc), 5)
            except asyncio.TimeoutError:
                pass
        except asyncio.CancelledError:  # e.g. a wall-clock limit of the sequence ran out
            _kill_tree(proc.pid)
            try:  # reap it on this loop, or its transport is closed after the loop is
                await asyncio.wait_for(_drain(proc), 5)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                pass
            raise
        code = proc.returncode if proc.returncode is not None else -9
        if code == 1 and buf.startswith(b"bwrap: "):
            raise SandboxError(f"bwrap failed: {buf.decode(errors='replace').strip()}")
        return ExecResult(code, buf.decode("utf-8", errors="replace"), timed_out, truncated,
                          time.perf_counter() - t0)

    def close(self) -> None:
        """Kill every process a command of this sandbox left running, then remove its files."""
        if self._closed:
            return
        self._closed = True
        for pid in list(self._running):
            _kill_tree(pid)  # bwrap dies, so its pid namespace and everything in it
        for mount in reversed(self._mounts):
            mounts.umount(mount)
        self._mounts.clear()
        if self.cgroup is not None:
            memcg.remove_cgroup(self.cgroup)
        hostfs.remove_tree(self._host_dir)

    def __del__(self) -> None:  # best effort; close() is the contract (and atexit closes the rest)
        try:
            self.close()
        except Exception:
            pass


SPAWN_MIN_FD = 10
"""``spawn``'s passed descriptors start here, clear of the launcher's 3 or 4."""


def _seccomp_fd(program: bytes) -> int:
    """The read end of a pipe holding the filter (it fits in a pipe's buffer), for ``--seccomp``."""
    r, w = os.pipe()
    try:
        os.write(w, program)
    finally:
        os.close(w)
    return r


async def _drain(proc) -> None:
    while await proc.stdout.read(1 << 20):
        pass
    await proc.wait()


_LIVE: weakref.WeakSet[BwrapSandbox] = weakref.WeakSet()
"""Sandboxes not yet closed: closed at interpreter exit, so no workspace mount outlives the process."""


@atexit.register
def _close_live() -> None:
    for box in list(_LIVE):
        box.close()


# ---- process clean-up ---------------------------------------------------------------------
def _kill_tree(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
