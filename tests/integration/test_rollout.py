"""Harness + session + sandbox with a scripted deterministic model."""

import asyncio
import random

import pytest

from rlonce.core.records import FailureCategory, Role, Status
from rlonce.engine.base import EngineError, SamplingParams
from rlonce.engine.scripted import ScriptedEngine
from rlonce.envs.toolfind.env import ToolfindEnv
from rlonce.envs.toolfind.expert import expert_turns, optimal_calls
from rlonce.envs.toolfind.tasks import make_task, make_tasks
from rlonce.harness.loop import HarnessLimits
from rlonce.model.chat import get_format
from rlonce.rollout.runner import RolloutSpec, run_sequence

pytestmark = pytest.mark.sandbox
FMT = get_format("hermes")


def spec(lm, turns=3):
    return RolloutSpec(encode=lm.encode, decode=lm.decode, chat_format=FMT, sampling=SamplingParams(max_tokens=64),
                       limits=HarnessLimits(max_turns=turns))


def run(lm, task, turns_text, max_turns=3):
    return asyncio.run(run_sequence(task, ToolfindEnv, ScriptedEngine(turns_text, lm.encode), spec(lm, max_turns)))


def test_the_expert_solves_every_task_in_real_sandboxes(lm):
    rng = random.Random(0)
    for task in make_tasks("train", 0, 20):
        seq = run(lm, task, expert_turns(task, rng, FMT), max_turns=20)
        assert seq.status is Status.SUBMITTED and seq.reward == 1.0, task.task_id


def test_tokens_are_recorded_exactly_and_observations_carry_no_loss(lm):
    task = make_task("train", 3)
    turns = [FMT.assistant_text("", [c]) for c in optimal_calls(task)]
    engine = ScriptedEngine(list(turns), lm.encode)
    seq = asyncio.run(run_sequence(task, ToolfindEnv, engine, spec(lm, 5)))
    assert seq.passed and seq.reward == 1.0 and seq.turns == len(turns)
    segs = seq.contexts[0].segments
    model = [s for s in segs if s.role is Role.MODEL]
    assert [lm.decode(s.token_ids) for s in model] == turns  # exactly what was sampled
    assert all(s.logprobs == [0.0] * len(s.token_ids) for s in model)
    obs = [s for s in segs if s.role is Role.OBSERVATION]
    assert len(obs) == len(turns) - 1 and all(s.logprobs is None for s in obs)
    first_obs = lm.decode(obs[0].token_ids)
    assert f"{task.chain[0][0]} = {task.chain[0][1]}" in first_obs  # real grep output from the sandbox
    # each engine call saw exactly the context so far: the prefix never shifts
    ids = seq.contexts[0].token_ids()
    for prompt in engine.prompts:
        assert ids[: len(prompt)] == prompt


def test_limits_format_errors_and_wrong_answers(lm):
    task = make_task("train", 5)
    ls = FMT.assistant_text("", [optimal_calls(task)[0].__class__("bash", {"command": "ls docs"})])
    assert run(lm, task, [ls] * 5).status is Status.LIMITS
    bad = run(lm, task, ["<tool_call>\n{oops}\n</tool_call><|im_end|>"])
    assert bad.status is Status.FORMAT_ERROR and bad.reward == 0.0
    flagged = [s for s in bad.contexts[0].segments if s.role is Role.MODEL][0]
    assert flagged.flags == {"malformed_tool_call": True}
    wrong = run(lm, task, ['<tool_call>\n{"name": "submit", "arguments": {"answer": "nothing"}}\n'
                           '</tool_call><|im_end|>'])
    assert wrong.status is Status.SUBMITTED and wrong.reward == 0.0


@pytest.mark.parametrize("protocol_arm", ["mini-bash", "mini-claude-code", "mini-codex"])
def test_format_retries_answer_a_turn_without_a_usable_call_and_the_agent_goes_on(lm, protocol_arm):
    """``harness.format_retries``: a call of a tool that does not exist is answered with the tools'
    names (in each wire protocol), the turn stays flagged for the penalties, and the agent solves
    the task; past the retries such a turn ends the sequence as a format error."""
    import dataclasses

    from rlonce.harness.arms import get_arm

    task = make_task("train", 3)
    arm = get_arm(protocol_arm)
    good = [FMT.assistant_text("", [arm.translate(c)]) for c in optimal_calls(task)]
    bogus = '<tool_call>\n{"name": "grep_everything", "arguments": {}}\n</tool_call><|im_end|>'
    s = dataclasses.replace(spec(lm, len(good) + 1), limits=HarnessLimits(max_turns=len(good) + 1, format_retries=1),
                            arms=(protocol_arm,))
    engine = ScriptedEngine([bogus, *good], lm.encode)
    seq = asyncio.run(run_sequence(task, ToolfindEnv, engine, s, arm=protocol_arm))
    assert seq.status is Status.SUBMITTED and seq.passed and seq.metrics["format_retries"] == 1.0
    hint = lm.decode(engine.prompts[1][len(engine.prompts[0]):])
    assert "[error: no usable tool call; call one of these tools: " in hint and "submit" in hint
    assert [s.flags for s in seq.contexts[0].segments if s.role is Role.MODEL][0] == {"unknown_tool": True,
                                                                                     "malformed_tool_call": True}
    twice = asyncio.run(run_sequence(task, ToolfindEnv, ScriptedEngine([bogus, bogus, *good], lm.encode), s,
                                     arm=protocol_arm))
    assert twice.status is Status.FORMAT_ERROR and twice.metrics["format_retries"] == 1.0


class BrokenEngine(ScriptedEngine):
    async def generate(self, prompt_ids, sampling):
        raise EngineError("engine died")


def test_infrastructure_failures_are_never_scored(lm):
    task = make_task("train", 7)
    seq = asyncio.run(run_sequence(task, ToolfindEnv, BrokenEngine([], lm.encode), spec(lm)))
    assert seq.status is Status.INFRA and seq.failure is FailureCategory.ENGINE_ERROR and seq.reward is None


    assert seq.cause == "EngineError: engine died"


class GraderDown(ToolfindEnv):
    async def grade(self, sequence):
        raise ConnectionError("grading service unreachable")


class MisreadTools(ToolfindEnv):
    def tools(self):  # a tool without its name: rlonce's harness code fails on it (a KeyError of ours)
        return [{k: v for k, v in t.items() if k != "name"} for t in super().tools()]


def test_infrastructure_failures_carry_their_cause_and_our_bugs_are_internal_errors(lm):
    from rlonce.core.records import sequence_from_dict, sequence_to_dict
    from rlonce.errors import INTERNAL_ERRORS

    task = make_task("train", 7)
    turns = [FMT.assistant_text("", [c]) for c in optimal_calls(task)]
    down = asyncio.run(run_sequence(task, GraderDown, ScriptedEngine(list(turns), lm.encode), spec(lm, 5)))
    assert down.status is Status.INFRA and down.failure is FailureCategory.GRADER_UNAVAILABLE and down.reward is None
    assert down.cause == "ConnectionError: grading service unreachable"
    assert sequence_from_dict(sequence_to_dict(down)).cause == down.cause  # checkpoints and remote payloads keep it

    bug = asyncio.run(run_sequence(task, MisreadTools, ScriptedEngine(list(turns), lm.encode), spec(lm, 5)))
    assert bug.status is Status.INFRA and bug.failure is FailureCategory.INTERNAL_ERROR and bug.reward is None
    assert bug.cause.startswith("KeyError: 'name' at ") and INTERNAL_ERRORS == [bug.cause]
    INTERNAL_ERRORS.clear()  # provoked on purpose: the suite's guard (tests/conftest.py) would fail the test


class ComparingGrader(ToolfindEnv):
    """A grader that compares siblings: the group's best answer keeps its reward, the others get
    half of theirs (an example of a hook only a whole group can evaluate)."""

    @staticmethod
    async def grade_group(task, sequences):
        best = max(s.reward for s in sequences)
        for s in sequences:
            s.metrics["group_rank_first"] = float(s.reward == best)
            s.reward = s.reward if s.reward == best else s.reward / 2


class BrokenGroupGrader(ToolfindEnv):
    @staticmethod
    async def grade_group(task, sequences):
        raise TimeoutError("judge model did not answer")


def test_a_group_grader_sees_the_siblings_together_and_its_failure_is_infrastructure(lm):
    from rlonce.rollout.runner import LocalExecutor, collect

    task = make_task("train", 9)
    submit = '<tool_call>\n{{"name": "submit", "arguments": {{"answer": "{}"}}}}\n</tool_call><|im_end|>'
    turns = [submit.format(task.answer), submit.format("nothing")]
    (sample,) = asyncio.run(collect([task], 2, ComparingGrader, ScriptedEngine(list(turns), lm.encode), spec(lm),
                                    progress=False))
    assert sorted(s.reward for s in sample.sequences) == [0.0, 1.0]
    assert sorted(s.metrics["group_rank_first"] for s in sample.sequences) == [0.0, 1.0]

    from rlonce.rollout.groups import Group

    ex = LocalExecutor(BrokenGroupGrader, ScriptedEngine(list(turns), lm.encode), spec(lm))
    seqs = asyncio.run(ex.run_group(Group("g", task, task.source, 1, 0), 2))
    assert all(s.status is Status.INFRA and s.failure is FailureCategory.GRADER_UNAVAILABLE and s.reward is None
               for s in seqs)
    assert {s.cause for s in seqs} == {"TimeoutError: judge model did not answer"}
