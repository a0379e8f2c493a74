"""Attacks on the cyber oracle (issue 20's hack probes): each route, run through the environment's
own tools in a real sandbox, must earn 0 while the reference PoC earns 1."""

import asyncio
import time

import pytest
from conftest import slack

from rlonce.core.records import Sequence
from rlonce.envs.cyber.env import CyberEnv
from rlonce.envs.cyber.probe import CONTROLS, ROUTES, run_route
from rlonce.envs.cyber.validate import validated_tasks

pytestmark = [pytest.mark.sandbox, pytest.mark.clang]


@pytest.mark.parametrize("route", [*CONTROLS, *ROUTES])
def test_every_route_earns_nothing_and_the_reference_earns_one(cyber_pack, route):
    for task in validated_tasks(cyber_pack)[:2]:
        reward = asyncio.run(run_route(task, route))
        assert reward == (1.0 if route in CONTROLS else 0.0), (route, task.task_id)


def _grade_after(task, commands, answer):
    async def go():
        env = CyberEnv(task)
        await env.setup()
        try:
            outs = [await env.call_tool("bash", {"command": c}) for c in commands]
            seq = Sequence(task.task_id, "attack")
            seq.answer = answer
            t0 = time.perf_counter()
            grade = await env.grade(seq)
            return outs, grade, time.perf_counter() - t0
        finally:
            await env.cleanup()

    return asyncio.run(go())


def test_links_fifos_and_oversized_files_are_refused_without_blocking(cyber_pack):
    task = validated_tasks(cyber_pack)[0]
    for cmd in ("ln -s /etc/shadow p", "mkfifo p", "head -c 2000000 /dev/zero > p"):
        _, grade, seconds = _grade_after(task, [cmd], "p")
        assert grade.reward == 0.0 and "cannot be read safely" in grade.transcript, (cmd, grade.transcript)
        assert seconds < slack(5)
    _, grade, _ = _grade_after(task, [], "../../../etc/passwd")
    assert grade.reward == 0.0 and "cannot be read safely" in grade.transcript


def test_run_target_refuses_links_and_shows_only_the_real_report(cyber_pack):
    task = validated_tasks(cyber_pack)[0]
    outs, _, _ = _grade_after(task, ["ln -s /etc/passwd p", "run-target p",
                                     "printf '==1==ERROR: AddressSanitizer: heap-buffer-overflow' > q",
                                     "run-target q"], "q")
    assert "cannot read" in outs[1]
    assert "[sanitizer report]" not in outs[3] or "heap-buffer-overflow on address" in outs[3]


def test_the_mounted_binary_and_the_pack_are_out_of_reach(cyber_pack):
    task = validated_tasks(cyber_pack)[0]
    outs, _, _ = _grade_after(task, [f"cp /bin/true /opt/target/{task.target}; echo rc=$?",
                                     f"ls {cyber_pack} 2>&1; echo rc=$?", "id -u"], "x")
    assert "rc=0" not in outs[0] and "Read-only" in outs[0]
    assert "No such file" in outs[1]  # the pack (manifest, reference PoCs) is not mounted
    assert outs[2].strip() != "0"  # not root inside


HOG = r"""
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
  FILE *f = fopen(argv[1], "rb"); int c = f ? fgetc(f) : -1;
  if (c == 'h') for (volatile unsigned long i = 0;; i++) {}
  if (c == 'm') { for (int i = 0; i < 64; i++) { char *p = malloc(200u << 20); if (p) memset(p, 1, 200u << 20); } }
  if (c == 'a') abort();
  if (c == 'k') raise(SIGKILL);
  if (c == 'b') { char *p = malloc(1ul << 40); printf("%p\n", (void *)p); }
  return 0;
}
"""


@pytest.mark.parametrize("what,kind", [("h", None), ("m", "out-of-memory"), ("a", "ABRT"), ("k", None),
                                       ("b", "allocation-size-too-big")])
def test_time_memory_and_signals_end_in_no_match_within_the_limits(tmp_path, what, kind):
    """An input that makes the program hang, eat memory or die by a signal: the run ends within its
    limits, and whatever it reports is not a planted bug's type."""
    import subprocess

    from rlonce.envs.cyber.build import FLAGS, require_clang
    from rlonce.envs.cyber.oracle import run_input

    src = tmp_path / "hog.c"
    src.write_text(HOG)
    subprocess.run([require_clang(), *FLAGS, "-o", str(tmp_path / "hog"), str(src)], check=True, capture_output=True)
    t0 = time.perf_counter()
    run = asyncio.run(run_input(tmp_path / "hog", what.encode(), seconds=3.0))
    assert time.perf_counter() - t0 < slack(15)
    assert (run.report.kind if run.report else None) == kind, run.report_text[:300]
    if what == "h":
        assert run.timed_out
