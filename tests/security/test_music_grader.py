"""Attacks on the music grader: what a policy submits (a path with tools, ABC text) is hostile."""

import asyncio
import time

import pytest
from conftest import slack

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
    assert grade.reward == 0.0 and "rejected by the gate" in grade.transcript and seconds < slack(10)


def test_paths_outside_the_workspace_are_not_read():
    grade, _ = _grade(["echo hi > x"], "../../../../etc/passwd")
    assert grade.reward == 0.0 and "could not read" in grade.transcript


def test_abc2midi_runs_sandboxed_on_hostile_text():
    # a tune that names host paths as output and include files: the conversion sees only its own workspace
    text = "X:1\nT:/etc/passwd\n%%abc-include /etc/shadow\nM:4/4\nL:1/8\nK:C\nCDEF GABc|\n"
    conv = asyncio.run(abc.convert(text))
    assert "root:" not in conv.log
    assert abc.static_gate("X:1\nK:C\n" + "C" * (abc.MAX_ABC_CHARS + 1)) == "too_long"


def test_degenerate_tunes_earn_at_most_0_6_of_the_experts_median():
    """Well-formed tunes with the requested header, form and chord symbols but no music in them
    (``probe.DEGENERATE``) against the scripted expert on the same tasks, under the default grader;
    with adherence weight 0 the seed's public scorer is returned unchanged."""
    import random
    import statistics

    from rlonce.envs.music.expert import expert_reply
    from rlonce.envs.music.probe import DEGENERATE, DEGENERATE_RATIO, ROUTES, grade_reply

    tasks = [make_task("heldout", i) for i in range(4)]

    async def go():
        rng = random.Random(0)
        expert = [(await grade_reply(t, expert_reply(t, rng)))[0] for t in tasks]
        routes = {}
        for name in DEGENERATE:
            rng = random.Random(0)
            routes[name] = [(await grade_reply(t, ROUTES[name](t, rng)))[0] for t in tasks]
        public, metrics = await grade_reply(tasks[0], ROUTES["tonic_arpeggios"](tasks[0], random.Random(0)),
                                            adherence_weight=0.0)
        return expert, routes, public, metrics

    expert, routes, public, metrics = asyncio.run(go())
    median = statistics.median(expert)
    assert median > 0.85
    for name, rewards in routes.items():
        assert max(rewards) <= DEGENERATE_RATIO * median, (name, rewards, median)
    assert metrics["grade/substance"] < 0.6 and public == metrics["grade/music_score"] > 0.8
