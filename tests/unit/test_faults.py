"""``RLONCE_FAULTS``: kill points fire on the n-th visit, raise points fail a seeded share of
calls with the layer's own error, and a mistyped plan is a one-line usage error."""

import os
import signal
import subprocess
import sys

import pytest

from rlonce.core import faults
from rlonce.errors import UsageError

PROBE = "from rlonce.core import faults\nfor i in range(5):\n    print(i, flush=True)\n    faults.point('grade')\n"


def test_a_kill_point_sigkills_the_process_on_its_nth_visit():
    env = {**os.environ, "RLONCE_FAULTS": "grade:3"}
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == -signal.SIGKILL and r.stdout.split() == ["0", "1", "2"]  # no clean-up ran after
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                       env={**os.environ, "RLONCE_FAULTS": ""}, timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["0", "1", "2", "3", "4"]


def test_a_raise_point_fails_a_seeded_share_of_calls(monkeypatch):
    def failures():
        monkeypatch.setattr(faults, "_plan", faults._parse("sandbox.exec:raise@0.25"))
        out = []
        for _ in range(400):
            try:
                faults.point("sandbox.exec", ConnectionError)
                out.append(0)
            except ConnectionError as e:
                assert str(e) == "injected fault at sandbox.exec (RLONCE_FAULTS)"
                out.append(1)
        return out

    first = failures()
    assert first == failures()  # the same calls fail each run
    assert 70 <= sum(first) <= 130  # about a quarter of 400
    faults.point("sandbox.exec")  # without an error to raise, a raise point does nothing


@pytest.mark.parametrize("plan, says", [
    ("gradee", "unknown fault point 'gradee'; known: sft.batch,"),
    ("grade:0", "'grade:0': write point, point:N (N >= 1) or point:raise@P"),
    ("grade:raise@2", "'grade:raise@2': write point:raise@P with 0 < P <= 1"),
])
def test_a_bad_plan_is_a_one_line_usage_error(plan, says):
    with pytest.raises(UsageError, match="RLONCE_FAULTS: ") as e:
        faults._parse(plan)
    assert says in str(e.value) and "\n" not in str(e.value)
    r = subprocess.run([sys.executable, "-m", "rlonce.cli", "doctor"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "RLONCE_FAULTS": plan})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
