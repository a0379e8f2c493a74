"""``rlonce.model.omp``: a thread hands back its OpenMP team; the engine's idle worker and the
trainer do; concurrent use stays correct."""

import ctypes
import os
import queue
import threading
import time

import pytest
import torch

from rlonce.model import omp

pytestmark = pytest.mark.skipif(omp._libgomp() is None, reason="torch here does not run on libgomp")


_libc = ctypes.CDLL(None)
PR_SET_NAME = 15


def _name_this_thread(name: str) -> None:
    """Name the calling OS thread; the OpenMP helpers it starts inherit the name."""
    _libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _named(name: str) -> int:
    """Threads of this process named ``name``: one worker and its team's helpers, whatever other
    threads (left by other tests in this process) start or end meanwhile."""
    count = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                count += f.read().strip() == name
        except OSError:  # the thread ended while we listed
            continue
    return count


def _parallel_op() -> torch.Tensor:
    torch.set_num_threads(2)
    x = torch.randn(256, 256)
    return x @ x  # large enough for torch to open a parallel region with two threads


def test_release_frees_the_calling_threads_team_and_the_next_op_builds_a_new_one():
    out = {}
    name = f"omp-rel-{os.getpid() % 10000}"

    def work():  # by thread name: threads other tests left in this process may start or end meanwhile
        _name_this_thread(name)
        _parallel_op()
        out["with_team"] = _named(name)
        out["released"] = omp.release()
        out["after"] = _named(name)
        y = _parallel_op()  # a fresh team: still correct
        out["ok"] = torch.allclose(y, y.clone())
        out["rebuilt"] = _named(name)
        omp.release()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out["released"] is True
    assert (out["with_team"], out["after"], out["rebuilt"]) == (2, 1, 2), out  # one helper, gone, back
    assert out["ok"]


def test_get_idle_releases_only_when_it_would_wait():
    """A worker with a team keeps it while work is queued, and hands it back once it would wait:
    its helper thread is gone while it waits on the empty queue (watched from here by thread
    name, so a busy machine cannot reorder the wait and the put, and threads other tests left in
    this process do not count)."""
    q = queue.Queue()
    out, waiting = {}, threading.Event()
    name = f"omp-idle-{os.getpid() % 10000}"

    def worker():
        _name_this_thread(name)
        _parallel_op()
        out["with_team"] = _named(name)
        q.put("ready")
        out["first"] = omp.get_idle(q)  # queued: no wait, the team stays
        out["kept"] = _named(name)
        waiting.set()
        out["second"] = omp.get_idle(q)  # empty until the test has seen the team go

    t = threading.Thread(target=worker)
    t.start()
    assert waiting.wait(60)
    deadline = time.monotonic() + 60
    while _named(name) != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    out["while_waiting"] = _named(name)
    q.put("later")
    t.join()
    assert (out["first"], out["second"]) == ("ready", "later")
    assert out["with_team"] == 2  # the worker and the one helper of its 2-thread team
    assert out["kept"] == 2
    assert out["while_waiting"] == 1  # the worker alone, waiting on the queue


def test_releasing_while_another_thread_computes_keeps_both_correct():
    torch.manual_seed(0)
    a = torch.randn(300, 300)
    want = a @ a
    errors = []

    def compute():
        torch.set_num_threads(2)
        for _ in range(40):
            if not torch.allclose(a @ a, want, atol=1e-3):
                errors.append("wrong product")

    def churn():
        for _ in range(40):
            _parallel_op()
            omp.release()

    threads = [threading.Thread(target=compute), threading.Thread(target=churn)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
