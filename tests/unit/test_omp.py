"""``rlonce.model.omp``: a thread hands back its OpenMP team; the engine's idle worker and the
trainer do; concurrent use stays correct."""

import os
import queue
import threading
import time

import pytest
import torch

from rlonce.model import omp

pytestmark = pytest.mark.skipif(omp._libgomp() is None, reason="torch here does not run on libgomp")


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _tids() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _parallel_op() -> torch.Tensor:
    torch.set_num_threads(2)
    x = torch.randn(256, 256)
    return x @ x  # large enough for torch to open a parallel region with two threads


def test_release_frees_the_calling_threads_team_and_the_next_op_builds_a_new_one():
    out = {}

    def work():  # by thread id: threads other tests left in this process may start or end meanwhile
        before = _tids()
        _parallel_op()
        out["new"] = _tids() - before
        out["released"] = omp.release()
        out["gone"] = out["new"] - _tids()
        y = _parallel_op()  # a fresh team: still correct
        out["ok"] = torch.allclose(y, y.clone())
        omp.release()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out["released"] is True
    assert len(out["gone"]) == 1, out  # the one helper thread of a 2-thread team is gone
    assert out["ok"]


def test_get_idle_releases_only_when_it_would_wait():
    """A worker with a team keeps it while work is queued, and hands it back once it would wait:
    its helper thread is gone while it waits on the empty queue (watched from here, so a busy
    machine cannot reorder the wait and the put)."""
    q = queue.Queue()
    out, waiting = {}, threading.Event()

    def worker():
        _parallel_op()
        out["with_team"] = _threads()
        q.put("ready")
        out["first"] = omp.get_idle(q)  # queued: no wait, the team stays
        out["kept"] = _threads()
        waiting.set()
        out["second"] = omp.get_idle(q)  # empty until the test has seen the team go

    t = threading.Thread(target=worker)
    t.start()
    assert waiting.wait(60)
    deadline = time.monotonic() + 60
    while _threads() != out["with_team"] - 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    out["while_waiting"] = _threads()
    q.put("later")
    t.join()
    assert (out["first"], out["second"]) == ("ready", "later")
    assert out["kept"] == out["with_team"]
    assert out["while_waiting"] == out["with_team"] - 1


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
