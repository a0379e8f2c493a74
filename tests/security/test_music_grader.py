"""Attacks on the music grader: what a policy submits (a path with tools, ABC text) is hostile."""

import asyncio
import time

import pytest

from rlonce.core.records import Sequence
from rlonce.envs.music import abc
from rlonce.envs.music.env import MusicEnv
from rlonce.envs.music.tasks import make_task

pytestmark = [pytest.mark.sandbox, pytest.mark.abcmidi]


def _grade(commands, answer):
    async def go():
        env = MusicEnv(make_task("heldout", 0))
        try:
            for c in commands:
                await env.call_tool("bash", {"command": c})
            seq = Sequence("music/heldout/0", "attack")
            seq.answer = answer
            t0 = time.perf_counter()
            return await env.grade(seq), time.perf_counter() - t0
        finally:
            await env.cleanup()

    return asyncio.run(go())


@pytest.mark.parametrize("cmd", ["ln -s /etc/passwd tune.abc", "mkfifo tune.abc",
                                 "head -c 300000 /dev/zero | tr '\\0' 'C' > tune.abc", "mkdir tune.abc"])
def test_hostile_submitted_files_score_zero_without_blocking(cmd):
    grade, seconds = _grade([cmd], "tune.abc")
    assert grade.reward == 0.0 and "rejected by the gate" in grade.transcript and seconds < 10


def test_paths_outside_the_workspace_are_not_read():
    grade, _ = _grade(["echo hi > x"], "../../../../etc/passwd")
    assert grade.reward == 0.0 and "could not read" in grade.transcript


def test_abc2midi_runs_sandboxed_on_hostile_text():
    # a tune that names host paths as output and include files: the conversion sees only its own workspace
    text = "X:1\nT:/etc/passwd\n%%abc-include /etc/shadow\nM:4/4\nL:1/8\nK:C\nCDEF GABc|\n"
    conv = asyncio.run(abc.convert(text))
    assert "root:" not in conv.log
    assert abc.static_gate("X:1\nK:C\n" + "C" * (abc.MAX_ABC_CHARS + 1)) == "too_long"
