"""Whose failure a hidden-test run without a usable report is (``failed_run_owner``): only a run that
ran out its timeout can be the loaded machine's; one that crashed early is the agent's however slow
the clean run was (a crash route on a busy CI machine was booked as infrastructure before)."""

import pytest

from rlonce.envs.code.env import failed_run_owner

HEALTHY_SLOW = {"tests": {}, "seconds": 20.0}  # a clean run that took over half of a 30 s timeout
HEALTHY_FAST = {"tests": {}, "seconds": 2.0}


@pytest.mark.parametrize(("rep", "seconds", "clean", "owner"), [
    (None, 1.5, HEALTHY_SLOW, "crash"),      # crashed in 1.5 s: the agent's, though the machine is slow
    (None, 30.0, HEALTHY_SLOW, "loaded"),    # ran out its 30 s and the clean run needed 20: cannot tell
    (None, 30.0, HEALTHY_FAST, "crash"),     # ran out its time while the clean run took 2 s: the agent's hang
    (None, 1.5, None, "testbed"),            # the run without the change fails too
    (None, 1.5, {"tests": {}, "seconds": 1.0, "tampered": "x"}, "testbed"),
    ({"tests": {}, "tampered": "pytest patched"}, 1.0, HEALTHY_SLOW, "hack"),
    ({"tests": {}, "tampered": "pytest patched"}, 30.0, HEALTHY_SLOW, "hack"),  # a report says what it saw
])
def test_only_a_timed_out_run_on_a_slow_machine_is_infrastructure(rep, seconds, clean, owner):
    assert failed_run_owner(rep, seconds, clean, 30.0) == owner
