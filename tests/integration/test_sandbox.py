"""The bubblewrap sandbox, for real: isolation, limits, snapshots."""

import asyncio
import os
from pathlib import Path

import pytest
from conftest import slack

from rlonce.sandbox.base import SandboxError
from rlonce.sandbox.bwrap import BwrapSandbox, Limits

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parents[2]


def run(sb, cmd, **kw):
    return asyncio.run(sb.exec(cmd, **kw))


@pytest.fixture
def sb():
    box = BwrapSandbox(Limits(wall_seconds=3, output_bytes=1000, file_size_mb=1))
    yield box
    box.close()


def test_workspace_files_and_commands(sb):
    sb.put_file("docs/a.txt", "falcon.color = red\n")
    r = run(sb, "grep -r falcon.color docs && echo made > out.txt")
    assert r.exit_code == 0 and r.output == "docs/a.txt:falcon.color = red\n"
    assert sb.get_file("out.txt") == b"made\n"
    assert run(sb, "false").exit_code == 1
    with pytest.raises(ValueError):
        sb.put_file("../escape", "x")


def test_host_home_project_and_runs_are_invisible(sb):
    home = os.path.expanduser("~")
    r = run(sb, f"ls {home} {REPO} /work/.. ; cat {REPO}/pyproject.toml; id -u")
    assert "No such file" in r.output
    assert "rlonce" not in r.output  # pyproject.toml content is unreachable
    assert r.output.strip().endswith("1000")  # not root inside
    visible = set(run(sb, "ls /").output.split())
    assert {"usr", "work", "tmp", "proc"} <= visible
    assert visible <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "proc", "sbin", "tmp", "usr", "work"}


def test_wall_clock_timeout_kills_the_tree(sb):
    r = run(sb, "sleep 30 & sleep 30; echo never", timeout=1)
    assert r.timed_out and "never" not in r.output
    assert r.seconds < slack(5)


def test_output_cap_and_file_size_limit(sb):
    r = run(sb, "yes | head -c 100000")
    assert r.truncated and len(r.output) == 1000
    r = run(sb, "head -c 3000000 /dev/zero > big; echo rc=$?; wc -c < big")
    assert "rc=0" not in r.output  # SIGXFSZ / EFBIG at 1 MiB
    assert int(r.output.strip().split()[-1]) <= 1 << 20


def test_snapshot_restore(sb):
    sb.put_file("f", "one")
    sid = sb.snapshot()
    run(sb, "echo two > f; touch g")
    sb.restore(sid)
    assert sb.get_file("f") == b"one"
    assert run(sb, "ls").output.split() == ["f"]


def test_closed_sandbox_refuses(sb):
    sb.close()
    with pytest.raises(SandboxError):
        run(sb, "true")


def test_no_writes_outside_the_workspace(sb, tmp_path):
    marker = f"rlonce-escape-{os.getpid()}"
    r = run(sb, f"for d in /usr /usr/lib /etc/alternatives /bin; do touch $d/{marker} 2>/dev/null && echo wrote:$d; "
                f"done; for d in /dev / /etc; do touch $d/{marker} 2>/dev/null && echo wrote:$d; done; "
                f"for d in /tmp /dev/shm; do touch $d/{marker} && echo private:$d; done; touch /work/{marker}")
    assert "wrote:" not in r.output  # the system directories, the root and /dev are read-only
    assert r.output.split() == ["private:/tmp", "private:/dev/shm"]  # per-command, size-capped tmpfs
    assert not any(Path(d, marker).exists() for d in ("/usr", "/etc", "/tmp", "/dev", "/"))
    assert (sb.workspace / marker).exists()  # the workspace is the one host directory it writes


def test_fork_bomb_and_memory_bomb_are_contained():
    box = BwrapSandbox(Limits(wall_seconds=8, processes=32, address_space_mb=256))
    try:
        r = run(box, "bomb() { bomb | bomb & }; bomb; sleep 1; echo survived")
        assert r.seconds < slack(10)  # the process limit stops it; the wall clock ends the rest
        r = run(box, "python3 -c \"x = bytearray(2 << 30); print('allocated')\"")
        assert "MemoryError" in r.output and "allocated" not in r.output
    finally:
        box.close()
    assert run(BwrapSandbox(), "echo alive").output == "alive\n"  # the host still forks


def test_many_processes_together_stay_under_the_sandboxs_memory_cap():
    """RLIMIT_AS bounds each process; the sandbox's memory cgroup bounds them together: four
    processes of 120 MiB each, every one under its own 256 MiB rlimit, in a sandbox capped at
    256 MiB — the kernel kills inside the sandbox, its peak stays at the cap, the host is untouched."""
    from rlonce.sandbox import memcg

    box = BwrapSandbox(Limits(wall_seconds=20, processes=32, address_space_mb=256, memory_mb=256))
    if not box.memory_capped:
        box.close()
        pytest.skip("no memory cgroup here (needs root and the cgroup v1 memory controller)")
    try:
        hog = "python3 -c \"import time; b = bytearray(120 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(4)\""
        r = run(box, f"for i in 1 2 3 4; do {hog} & done; wait; echo done")
        assert r.output.strip().endswith("done")
        assert memcg.oom_kills(box.cgroup) >= 1
        assert memcg.peak_memory_mb(box.cgroup) <= 256 + 1
    finally:
        box.close()
    assert not box.cgroup.exists()  # removed with the sandbox


def test_nothing_left_running_after_close():
    import subprocess

    marker = f"rlonce-orphan-{os.getpid()}"
    box = BwrapSandbox(Limits(wall_seconds=3))
    sleeper = f"python3 -c 'import time; time.sleep(300)' {marker}"
    r = run(box, f"(setsid {sleeper} &) ; nohup {sleeper} >/dev/null 2>&1 & sleep 0.5; pgrep -fc {marker}")
    assert int(r.output.strip()) >= 2  # both were running when the command returned
    box.close()
    import time

    time.sleep(0.5)
    ps = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert ps.stdout.strip() == ""


def test_the_launch_chain_keeps_the_seccomp_descriptor_open_whatever_its_number():
    """The launch chain parks stderr on a spare descriptor; that must never be the one bwrap
    reads its seccomp filter from (a collision once failed one exec in ~200 under load)."""
    import subprocess

    box = BwrapSandbox()
    opened = []
    try:
        for fd in range(3, 13):
            try:
                os.fstat(fd)
            except OSError:  # free here: put something on it
                os.dup2(os.open(os.devnull, os.O_RDONLY), fd)
                opened.append(fd)
            r = subprocess.run([*box._launcher(fd), "/bin/sh", "-c", f"test -e /proc/self/fd/{fd} && echo open"],
                               pass_fds=(fd,), capture_output=True, text=True)
            assert r.stdout == "open\n", (fd, r.stderr)
    finally:
        for fd in opened:
            os.close(fd)
        box.close()


def test_many_concurrent_commands_all_run():
    boxes = [BwrapSandbox(Limits(wall_seconds=20)) for _ in range(24)]

    async def go():
        return await asyncio.gather(*(b.exec(f"echo {i}") for i, b in enumerate(boxes)))

    try:
        assert [r.output for r in asyncio.run(go())] == [f"{i}\n" for i in range(24)]
    finally:
        for b in boxes:
            b.close()


def test_toolfind_commands_are_not_cut_by_a_tight_wall_clock():
    """A command's CPU is bounded (5 s); its wall clock is not the tight limit, so a command
    slowed by the host's load (many sessions' commands at once) is not the agent's timeout."""
    from rlonce.envs.toolfind.env import ToolfindEnv
    from rlonce.envs.toolfind.tasks import make_task

    env = ToolfindEnv(make_task("train", 0))
    assert env.limits.cpu_seconds == 5

    async def go():
        await env.setup()
        try:
            return await env.call_tool("bash", {"command": "sleep 5.5; echo waited"})
        finally:
            await env.cleanup()

    assert asyncio.run(go()) == "waited"


def test_an_agent_command_is_bounded_by_cpu_not_by_a_wall_clock_equal_to_it():
    """``command_limits``: a command that waits past its CPU limit completes; one that computes
    past it is killed by that limit, long before the wall clock."""
    from rlonce.sandbox.limits import COMMAND_WALL_S, CPU_EXHAUSTED, command_limits

    assert command_limits(5).wall_seconds == COMMAND_WALL_S == 60.0
    assert command_limits(60).wall_seconds == 120.0
    box = BwrapSandbox(command_limits(1))
    try:
        waited = run(box, "sleep 1.5; echo waited")
        assert (waited.exit_code, waited.output, waited.timed_out) == (0, "waited\n", False)
        spun = run(box, "python3 -c 'while True: pass'")
        assert spun.exit_code == CPU_EXHAUSTED == 152 and not spun.timed_out and spun.seconds < slack(30)
    finally:
        box.close()


def test_every_domain_gives_agent_commands_the_load_tolerant_limits():
    from rlonce.envs.cyber import oracle
    from rlonce.envs.cyber.env import CyberEnv
    from rlonce.envs.general.env import GeneralEnv
    from rlonce.envs.general.tasks import make_task as general_task
    from rlonce.envs.music.env import MusicEnv
    from rlonce.envs.music.tasks import make_task as music_task
    from rlonce.envs.toolfind.env import COMMAND_LIMITS
    from rlonce.envs.visual.env import VisualEnv
    from rlonce.envs.visual.tasks import make_task as visual_task
    from rlonce.sandbox.limits import command_limits

    assert (COMMAND_LIMITS.cpu_seconds, COMMAND_LIMITS.wall_seconds) == (5, 60.0)
    envs = {10: GeneralEnv(general_task("train", 0)), 20: VisualEnv(visual_task("train", 0)),
            60: MusicEnv(music_task("train", 0))}
    for cpu, env in envs.items():
        assert env.limits == command_limits(cpu, output_bytes=8192), type(env).__name__
    assert CyberEnv(None).limits == command_limits(10, output_bytes=8192)
    assert (oracle.limits().cpu_seconds, oracle.limits().wall_seconds) == (10, 60.0)


def _mounted(path: Path) -> bool:
    from rlonce.sandbox.sweep import mounts_under

    return bool(mounts_under(path))


def test_a_killed_process_s_sandboxes_are_swept_and_a_live_one_s_are_kept(tmp_path):
    """A process SIGKILLed with a sandbox open leaves its directory, workspace tmpfs and memory
    cgroup behind; the next process's first sandbox removes them, and leaves a live process's."""
    import signal
    import subprocess
    import sys

    make = ("import os, sys\nfrom rlonce.sandbox.bwrap import BwrapSandbox\n"
            f"box = BwrapSandbox(root={str(tmp_path)!r})\n"
            "print(box._host_dir, box.cgroup, box.workspace_capped, flush=True)\n")
    live = subprocess.Popen([sys.executable, "-c", make + "sys.stdin.read()\n"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        live_line = live.stdout.readline().split()  # its sandbox is open (and its own sweep is done)
        dead = subprocess.run([sys.executable, "-c", make + "os.kill(os.getpid(), 9)\n"], capture_output=True,
                              text=True)
        assert dead.returncode == -signal.SIGKILL, dead.stderr
        left = [(Path(h), None if c == "None" else Path(c), w == "True")
                for h, c, w in (dead.stdout.split(), live_line)]
        for host, cgroup, capped in left:
            assert host.is_dir() and (cgroup is None or cgroup.is_dir()) and _mounted(host / "work") == capped
        box = BwrapSandbox(root=str(tmp_path))  # this process's first sandbox under tmp_path sweeps
        try:
            (host, cgroup, _), (live_host, live_cgroup, live_capped) = left
            assert not host.exists() and not _mounted(host) and (cgroup is None or not cgroup.exists())
            assert live_host.is_dir() and _mounted(live_host / "work") == live_capped
            assert live_cgroup is None or live_cgroup.is_dir()
            assert box.workspace.is_dir()
        finally:
            box.close()
    finally:
        live.communicate("")  # it closes its sandbox and exits
    assert live.returncode == 0 and not left[1][0].exists()
