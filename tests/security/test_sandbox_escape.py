"""Attack probes against the bubblewrap sandbox, run as the policy would run them: shell commands
inside a real sandbox, with rlonce running as root (the documented set-up). Each probe is one
defence of ``rlonce.sandbox.bwrap``; docs/security.md counts them.

Network probes reach only this machine's loopback and the sandbox's own namespace: no probe
sends a packet to any other address.
"""

import asyncio
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import slack

from rlonce.sandbox.bwrap import UID_BASE, BwrapSandbox, Limits

pytestmark = pytest.mark.sandbox
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(
    not ROOT, reason="the unprivileged-uid and workspace-cap defences apply when rlonce runs as root")


def run(sb, cmd, **kw):
    return asyncio.run(sb.exec(cmd, **kw))


@pytest.fixture(scope="module")
def sb():
    box = BwrapSandbox(Limits(wall_seconds=10, output_bytes=1 << 16))
    yield box
    box.close()


def syscall(nr: int, *args: int) -> str:
    """A python3 command that makes raw system call ``nr`` and prints 'ret errno'."""
    a = ", ".join(str(x) for x in args)
    return ("python3 -c \"import ctypes; l = ctypes.CDLL(None, use_errno=True); "
            f"l.syscall.restype = ctypes.c_long; r = l.syscall({nr}{', ' + a if a else ''}); "
            "print(r, ctypes.get_errno())\"")


EPERM, ENOSYS, EAFNOSUPPORT = "-1 1", "-1 38", "-1 97"

# name -> (command, what the output must show). Each is one system call the seccomp filter denies.
DENIED_SYSCALLS = {
    "unshare_user_namespace": (syscall(272, 0x10000000), EPERM),
    "clone_new_user_namespace": (syscall(56, 0x10000000 | 17, 0, 0, 0, 0), EPERM),
    "clone3_falls_back": (syscall(435, 0, 0), ENOSYS),
    "setns": (syscall(308, 0, 0), EPERM),
    "mount": (syscall(165, 0, 0, 0, 0, 0), EPERM),
    "new_mount_api_fsopen": (syscall(430, 0, 0), EPERM),
    "open_tree": (syscall(428, -100, 0, 0), EPERM),
    "keyctl_session_keyring": (syscall(250, 0, -3, 0), EPERM),
    "add_key": (syscall(248, 0, 0, 0, 0, -3), EPERM),
    "request_key": (syscall(249, 0, 0, 0, 0), EPERM),
    "io_uring_setup": (syscall(425, 8, 0), EPERM),
    "ptrace_traceme": (syscall(101, 0, 0, 0, 0), EPERM),
    "process_vm_readv": (syscall(310, 1, 0, 0, 0, 0, 0), EPERM),
    "perf_event_open": (syscall(298, 0, 0, -1, -1, 0), EPERM),
    "bpf": (syscall(321, 0, 0, 0), EPERM),
    "userfaultfd": (syscall(323, 0), EPERM),
    "kexec_load": (syscall(246, 0, 0, 0, 0), EPERM),
    "init_module": (syscall(175, 0, 0, 0), EPERM),
    "reboot": (syscall(169, 0, 0, 0, 0), EPERM),
    "syslog_read_kernel_log": (syscall(103, 3, 0, 0), EPERM),
    "settimeofday": (syscall(164, 0, 0), EPERM),
    "open_by_handle_at": (syscall(304, 0, 0, 0), EPERM),
    "chroot": (syscall(161, 0), EPERM),
    "socket_vsock_to_the_hypervisor": (syscall(41, 40, 1, 0), EAFNOSUPPORT),  # AF_VSOCK has no namespace
    "socketpair_vsock": (syscall(53, 40, 1, 0, 0), EAFNOSUPPORT),
    "socket_packet": (syscall(41, 17, 3, 0), EAFNOSUPPORT),
    "socket_bluetooth": (syscall(41, 31, 1, 0), EAFNOSUPPORT),
}


@pytest.mark.parametrize("name", sorted(DENIED_SYSCALLS))
def test_seccomp_denies(sb, name):
    cmd, want = DENIED_SYSCALLS[name]
    r = run(sb, cmd)
    assert r.output.strip() == want, r.output


def test_the_socket_families_agents_use_still_open(sb):
    code = ("import socket; [socket.socket(f, t).close() for f, t in ((socket.AF_UNIX, 1), (socket.AF_INET, 1), "
            "(socket.AF_INET6, 2), (socket.AF_NETLINK, 3))]; a, b = socket.socketpair(); print('opened')")
    assert run(sb, f'python3 -c "{code}"').output.strip() == "opened"


def test_32_bit_syscall_entry_kills_the_process(sb):
    """``int 0x80`` from a 64-bit process uses the i386 table, a classic way around a filter."""
    code = ("import ctypes, mmap; m = mmap.mmap(-1, 4096, prot=7); "
            "m.write(bytes([0xb8, 0x14, 0, 0, 0, 0xcd, 0x80, 0xc3])); "
            "f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m))); "
            "print('returned', f())")
    r = run(sb, f'python3 -c "{code}"; echo rc=$?')
    assert "returned" not in r.output and "rc=159" in r.output  # SIGSYS


def test_x32_abi_syscall_kills_the_process(sb):
    r = run(sb, syscall(0x40000000 | 39) + "; echo rc=$?")
    assert "rc=159" in r.output


def test_core_pattern_write_fails_and_the_host_value_is_unchanged(sb):
    before = Path("/proc/sys/kernel/core_pattern").read_text()
    r = run(sb, 'echo "$(cat /proc/sys/kernel/core_pattern)" > /proc/sys/kernel/core_pattern; echo rc=$?; '
                "echo '|/proc/%P/root/work/payload' > /proc/sys/kernel/core_pattern; echo rc=$?")
    assert r.output.count("rc=0") == 0 and r.output.count("rc=") == 2
    assert Path("/proc/sys/kernel/core_pattern").read_text() == before


def test_no_proc_sys_file_is_writable(sb):
    r = run(sb, "find /proc/sys -type f -writable 2>/dev/null | wc -l; "
                "for f in $(find /proc/sys -type f 2>/dev/null | head -400); do "
                "(cat $f > $f) 2>/dev/null && echo WROTE:$f; done; true", timeout=30)
    assert r.output.split()[0] == "0" and "WROTE" not in r.output


def test_sysrq_trigger_and_kernel_memory(sb):
    r = run(sb, "echo h > /proc/sysrq-trigger; echo rc=$?; head -c 1 /proc/kcore; echo rc=$?; "
                "head -c 1 /proc/kmsg; echo rc=$?; ls /sys 2>&1 | wc -l")
    assert "rc=0" not in r.output
    assert r.output.split()[-1] in ("0", "1")  # /sys is not mounted (ls: cannot access)


def test_no_capabilities_inside(sb):
    r = run(sb, "grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status")
    assert [line.split()[1] for line in r.output.splitlines()] == ["0000000000000000"] * 4


def test_nested_user_namespace_is_refused(sb):
    r = run(sb, "unshare -Ur id 2>&1; echo rc=$?; unshare -U true; echo rc=$?; cat /proc/sys/user/max_user_namespaces")
    assert "uid=0" not in r.output and r.output.count("rc=0") == 0


@needs_root
def test_sandboxed_processes_run_as_an_unprivileged_host_uid(sb):
    marker = f"rlonce-uid-{os.getpid()}"

    async def go():
        job = asyncio.create_task(sb.exec(f"python3 -c 'import time; time.sleep(5)' {marker}"))
        await asyncio.sleep(1.0)
        uids = []
        for pid in subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split():
            status = Path(f"/proc/{pid}/status").read_text()
            uids.append(int(next(x for x in status.splitlines() if x.startswith("Uid:")).split()[1]))
        job.cancel()
        return uids

    uids = asyncio.run(go())
    assert uids and all(u == sb.uid for u in uids) and sb.uid >= UID_BASE


@needs_root
def test_each_sandbox_has_its_own_uid_and_workspace_owner():
    a, b = BwrapSandbox(), BwrapSandbox()
    try:
        assert a.uid != b.uid and min(a.uid, b.uid) >= UID_BASE
        a.put_file("f", "x")
        run(a, "touch g")
        assert {p.stat().st_uid for p in a.workspace.iterdir()} == {a.uid}
    finally:
        a.close()
        b.close()


def test_host_environment_does_not_leak(sb, monkeypatch):
    monkeypatch.setenv("RLONCE_PROBE_SECRET", "hunter2-api-key")
    r = run(sb, "cat /proc/1/environ /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; env")
    assert "hunter2" not in r.output
    names = {line.split("=", 1)[0] for line in r.output.splitlines() if "=" in line}
    assert names <= {"PATH", "HOME", "LANG", "PWD", "SHLVL", "_", "OLDPWD"}


def test_host_session_keyring_is_unreachable(sb):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    key = libc.syscall(248, b"user", b"rlonce-probe", b"s3cret-key", 10, -3)  # add_key to the session keyring
    if key < 0:
        pytest.skip(f"the host cannot add a key here (errno {ctypes.get_errno()})")
    r = run(sb, "keyctl search @s user rlonce-probe 2>&1; keyctl print %user:rlonce-probe 2>&1; "
                "cat /proc/keys 2>&1; echo done")
    assert "s3cret" not in r.output and "done" in r.output
    libc.syscall(250, 3, key)  # KEYCTL_REVOKE


def test_host_home_project_and_run_directories_are_invisible(sb):
    repo = Path(__file__).resolve().parents[2]
    r = run(sb, f"ls /root {repo} {repo}/runs /work/.. 2>&1; "
                "cat /etc/shadow /etc/passwd 2>&1 | head -2; ls /run /var 2>&1")
    assert "pyproject" not in r.output and "root:" not in r.output


def test_host_processes_are_invisible(sb):
    r = run(sb, "ls /proc | grep -cE '^[0-9]+$'")
    assert int(r.output.strip()) < 8


def test_no_interface_or_route_but_loopback(sb):
    r = run(sb, "cat /proc/net/dev; echo ROUTES; tail -n +2 /proc/net/route; cat /etc/resolv.conf 2>&1")
    ifaces = [line.split(":")[0].strip() for line in r.output.split("ROUTES")[0].splitlines() if ":" in line]
    assert ifaces == ["lo"]
    assert r.output.split("ROUTES")[1].strip().startswith("cat:")  # no route; no resolver configured


@pytest.fixture
def host_tcp_service():
    srv = socket.create_server(("127.0.0.1", 0))
    hits, done = [], threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not done.is_set():
            try:
                conn, _ = srv.accept()
                hits.append(1)
                conn.close()
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1], hits
    done.set()
    t.join()
    srv.close()


def test_host_loopback_services_are_unreachable(sb, host_tcp_service):
    port, hits = host_tcp_service
    r = run(sb, f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\" "
                "2>&1 | tail -1")
    assert "ConnectionRefused" in r.output and not hits


def test_package_index_on_the_host_is_unreachable(sb, host_tcp_service):
    port, hits = host_tcp_service
    r = run(sb, f"python3 -m pip download --no-deps --retries 0 --timeout 2 --disable-pip-version-check "
                f"--index-url http://127.0.0.1:{port}/simple -d /tmp/x six 2>&1 | tail -2", timeout=30)
    assert "Successfully downloaded" not in r.output and not hits


def test_host_abstract_unix_sockets_are_unreachable(sb):
    name = f"\0rlonce-probe-{os.getpid()}"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(name)
    srv.listen()
    try:
        r = run(sb, f"python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('\\0{name[1:]}')\" "
                    "2>&1 | tail -1")
        assert "ConnectionRefused" in r.output
    finally:
        srv.close()


@pytest.mark.parametrize("cmd", ["yes", "cat /dev/zero", "yes | tr y x", "while :; do echo x; done"])
def test_fast_output_returns_at_the_wall_clock(cmd):
    box = BwrapSandbox(Limits(wall_seconds=3, output_bytes=1000))
    try:
        t0 = time.monotonic()
        r = run(box, cmd)
        assert time.monotonic() - t0 < slack(4.0) and r.timed_out and r.truncated and len(r.output) == 1000
    finally:
        box.close()


def test_fast_output_through_the_environment_tool():
    from rlonce.envs.toolfind.env import ToolfindEnv
    from rlonce.envs.toolfind.tasks import make_task

    env = ToolfindEnv(make_task("train", 0), Limits(wall_seconds=3, output_bytes=1000))

    async def go():
        await env.setup()
        try:
            t0 = time.monotonic()
            out = await env.call_tool("bash", {"command": "yes"})
            return out, time.monotonic() - t0
        finally:
            await env.cleanup()

    out, seconds = asyncio.run(go())
    assert seconds < slack(4.0) and out.endswith("[command timed out]")


def test_close_while_a_command_runs_kills_everything():
    marker = f"rlonce-close-{os.getpid()}"
    box = BwrapSandbox(Limits(wall_seconds=60))

    async def go():
        sleeper = f"python3 -c 'import time; time.sleep(300)' {marker}"
        job = asyncio.create_task(box.exec(f"(setsid {sleeper} &); {sleeper}"))
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        box.close()
        await asyncio.wait_for(job, 5)
        return time.monotonic() - t0

    assert asyncio.run(go()) < 5
    time.sleep(0.3)
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.strip() == ""


@pytest.mark.parametrize("where", ["/tmp", "/dev/shm"])
def test_tmpfs_mounts_are_size_capped(where):
    box = BwrapSandbox(Limits(tmp_mb=8, file_size_mb=64, wall_seconds=10))
    try:
        r = run(box, f"head -c 20000000 /dev/zero > {where}/fill; echo rc=$?; du -k {where}/fill | cut -f1")
        assert "rc=0" not in r.output and int(r.output.split()[-1]) <= 8 * 1024
    finally:
        box.close()


def test_root_and_dev_are_read_only(sb):
    r = run(sb, "touch /x; echo rc=$?; mkdir /dev/x; echo rc=$?; touch /dev/x; echo rc=$?; "
                "echo ok > /dev/null; echo rc=$?")
    assert r.output.split().count("rc=0") == 1  # only the write to /dev/null


@needs_root
def test_workspace_is_size_capped():
    box = BwrapSandbox(Limits(workspace_mb=8, file_size_mb=64, wall_seconds=10))
    try:
        assert box.workspace_capped
        r = run(box, "head -c 20000000 /dev/zero > fill; echo rc=$?; du -k fill | cut -f1; "
                     "for i in $(seq 1 100); do head -c 200000 /dev/zero > f$i 2>/dev/null || break; done; "
                     "du -sk . | cut -f1")
        assert "rc=0" not in r.output and all(int(x) <= 8 * 1024 for x in r.output.split()[-2:])
    finally:
        box.close()


def test_one_sandboxes_process_limit_does_not_starve_another():
    a, b = BwrapSandbox(Limits(processes=16, wall_seconds=5)), BwrapSandbox(Limits(processes=16, wall_seconds=5))

    async def go():
        bomb = asyncio.create_task(a.exec("for i in $(seq 1 40); do sleep 4 & done; wait"))
        await asyncio.sleep(1.0)
        other = await b.exec("for i in 1 2 3 4 5 6 7 8; do sleep 0.1 & done; wait; echo ok")
        await bomb
        return other

    try:
        assert asyncio.run(go()).output.strip() == "ok"
    finally:
        a.close()
        b.close()


# ---- the host reading what a sandbox left behind -----------------------------------------------

from rlonce.sandbox.hostfs import HostileFile  # noqa: E402


@pytest.fixture
def box():
    b = BwrapSandbox(Limits(wall_seconds=10))
    yield b
    b.close()


def test_get_file_through_a_symlink_to_a_root_only_file(box, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("root-only")
    secret.chmod(0o600)
    run(box, f"ln -s {secret} link; mkdir d; ln -s {tmp_path} d/up")
    for path in ("link", "d/up/secret"):
        with pytest.raises(HostileFile):
            box.get_file(path)


def test_put_file_through_a_symlinked_directory(box, tmp_path):
    run(box, f"ln -s {tmp_path} out")
    with pytest.raises(HostileFile):
        box.put_file("out/planted", "x")
    assert not (tmp_path / "planted").exists()


def test_put_file_replaces_a_planted_leaf_symlink(box, tmp_path):
    target = tmp_path / "target"
    target.write_text("host")
    run(box, f"ln -s {target} report.json")
    box.put_file("report.json", "ours")
    assert target.read_text() == "host" and box.get_file("report.json") == b"ours"


@pytest.mark.parametrize("plant", ["mkfifo report.json", "ln -s /dev/zero report.json", "ln -s /dev/stdin report.json",
                                   "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('report.json')\"",
                                   "mkdir report.json"])
def test_special_files_at_a_read_path_never_block(box, plant):
    run(box, plant)
    t0 = time.monotonic()
    with pytest.raises((HostileFile, IsADirectoryError, OSError)):
        box.get_file("report.json")
    assert time.monotonic() - t0 < slack(1.0)


def test_a_huge_file_is_refused_not_read(box):
    run(box, "head -c 3000000 /dev/zero > big")
    with pytest.raises(HostileFile):
        box.get_file("big", max_bytes=1 << 20)
    assert len(box.get_file("big", max_bytes=4 << 20)) == 3000000


def test_deep_and_locked_trees_are_cleaned_up():
    box = BwrapSandbox(Limits(wall_seconds=30))
    run(box, "python3 -c \"import os\nfor i in range(1100): os.mkdir('d'); os.chdir('d')\nopen('f','w').write('x')\"; "
             "mkdir -p locked/inner && touch locked/inner/f && chmod 000 locked/inner locked", timeout=30)
    with pytest.raises(HostileFile):
        box.snapshot()  # refused, not a RecursionError
    host_dir = box._host_dir
    box.close()
    assert not host_dir.exists()


def test_snapshot_keeps_links_as_links_and_skips_fifos(box):
    run(box, "echo data > f; ln -s /etc/hostname link; mkfifo pipe")
    sid = box.snapshot()
    run(box, "rm -f f link pipe; echo changed > g")
    box.restore(sid)
    names = sorted(p.name for p in box.workspace.iterdir())
    assert names == ["f", "link"] and (box.workspace / "link").is_symlink()


@needs_root
def test_a_bind_source_behind_a_private_directory_is_staged_read_only_and_unmounted_on_close(tmp_path):
    private = tmp_path / "private"
    (private / "data").mkdir(parents=True)
    (private / "data" / "f").write_text("visible")
    private.chmod(0o700)  # the sandbox uid cannot traverse it
    box = BwrapSandbox(ro_binds={str(private / "data"): "/opt/data"})
    try:
        r = run(box, "cat /opt/data/f; touch /opt/data/g; echo rc=$?")
        assert r.output.startswith("visible") and "rc=0" not in r.output
        staged = [m for m in Path("/proc/self/mounts").read_text().splitlines() if str(box._host_dir) in m]
        assert len(staged) == 2  # the workspace tmpfs and the staged bind
    finally:
        box.close()
    assert str(box._host_dir) not in Path("/proc/self/mounts").read_text() and not box._host_dir.exists()


def test_an_unclosed_sandbox_leaves_no_mount_after_the_process_exits(tmp_path):
    code = ("import asyncio; from rlonce.sandbox.bwrap import BwrapSandbox; b = BwrapSandbox(); "
            "asyncio.run(b.exec('echo x > f')); print(b._host_dir)")
    host_dir = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True,
                              check=True).stdout.strip()
    assert host_dir not in Path("/proc/self/mounts").read_text() and not Path(host_dir).exists()


@needs_root
def test_workspace_inodes_are_capped():
    box = BwrapSandbox(Limits(workspace_mb=8, wall_seconds=20))
    try:
        r = run(box, "python3 -c \"\nn = 0\ntry:\n    while n < 5000:\n        open(f'f{n}', 'w').close(); n += 1\n"
                     "except OSError as e:\n    print('stopped', n, e.errno)\"", timeout=20)
        assert r.output.startswith("stopped") and int(r.output.split()[1]) <= 8 * 128
    finally:
        box.close()


def test_fast_output_tool_call_does_not_hang_the_sequence(lm):
    """One ``yes`` tool call once hung ``run_sequence`` with nothing above it timing out."""
    from rlonce.core.records import Status
    from rlonce.engine.base import SamplingParams
    from rlonce.engine.scripted import ScriptedEngine
    from rlonce.envs.toolfind.env import ToolfindEnv
    from rlonce.envs.toolfind.tasks import make_task
    from rlonce.harness.loop import HarnessLimits
    from rlonce.model.chat import ToolCall, get_format
    from rlonce.rollout.runner import RolloutSpec, run_sequence

    fmt = get_format("hermes")
    task = make_task("train", 1)
    turns = [fmt.assistant_text("", [ToolCall("bash", {"command": "yes"})]),
             fmt.assistant_text("", [ToolCall("submit", {"answer": "x"})])]
    spec = RolloutSpec(encode=lm.encode, decode=lm.decode, chat_format=fmt, sampling=SamplingParams(max_tokens=64),
                       limits=HarnessLimits(max_turns=4), max_context=1024)

    def env_factory(t):
        return ToolfindEnv(t, Limits(wall_seconds=2, output_bytes=2000))

    t0 = time.monotonic()
    seq = asyncio.run(run_sequence(task, env_factory, ScriptedEngine(turns, lm.encode), spec))
    assert time.monotonic() - t0 < slack(6) and seq.status is Status.SUBMITTED and seq.reward == 0.0
