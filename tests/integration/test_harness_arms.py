"""The four harness arms with the scripted expert, in real sandboxes, through the in-process gateway;
and mini-swe-agent (PyPI) as an outside harness over HTTP."""

import asyncio
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlonce.core.records import Role, Status
from rlonce.engine.base import SamplingParams
from rlonce.engine.scripted import ScriptedEngine
from rlonce.envs.toolfind.env import ToolfindEnv
from rlonce.envs.toolfind.expert import expert_turns
from rlonce.envs.toolfind.tasks import make_task, make_tasks
from rlonce.gateway.core import Gateway
from rlonce.gateway.http import AsyncServer, make_app
from rlonce.gateway.session import Budgets, GatewaySettings
from rlonce.harness.arms import ARMS, get_arm
from rlonce.harness.loop import HarnessLimits
from rlonce.harness.outside import run_outside
from rlonce.model.chat import ToolCall, get_format
from rlonce.rollout.runner import RolloutSpec, run_sequence

pytestmark = pytest.mark.sandbox
FMT = get_format("hermes")


def _spec(lm, **kw):
    return RolloutSpec(encode=lm.encode, decode=lm.decode, chat_format=FMT, sampling=SamplingParams(max_tokens=64),
                       limits=HarnessLimits(max_turns=20, **kw), max_context=1024)


@pytest.mark.parametrize("arm", [a for a in ARMS if not ARMS[a].single_turn])  # single-turn: test_reasoning_domain
def test_every_arm_solves_tasks_with_the_scripted_expert(lm, arm):
    rng = random.Random(1)
    translate = get_arm(arm).translate
    for task in make_tasks("train", 40, 4):
        turns = expert_turns(task, rng, FMT, translate=translate)
        seq = asyncio.run(run_sequence(task, ToolfindEnv, ScriptedEngine(turns, lm.encode), _spec(lm), arm=arm))
        assert (seq.status, seq.reward, seq.arm) == (Status.SUBMITTED, 1.0, arm), task.task_id
        model = [lm.decode(s.token_ids) for s in seq.contexts[0].segments if s.role is Role.MODEL]
        assert model == turns  # what the model "sampled", exactly, under every protocol


def test_arm_tools_act_inside_the_sandbox(lm):
    """claude-code's Write/Edit/Read and codex's apply_patch change real files in the workspace."""
    task = make_task("train", 2)
    patch = "*** Begin Patch\n*** Add File: notes.txt\n+alpha\n+beta\n*** End Patch"
    upd = "*** Begin Patch\n*** Update File: notes.txt\n@@\n alpha\n-beta\n+gamma\n*** End Patch"
    scripts = {
        "mini-claude-code": [ToolCall("Write", {"file_path": "a.txt", "content": "one two\n"}),
                             ToolCall("Edit", {"file_path": "a.txt", "old_string": "two", "new_string": "three"}),
                             ToolCall("Read", {"file_path": "a.txt"}), ToolCall("Glob", {"pattern": "*.txt"}),
                             ToolCall("submit", {"answer": "x"})],
        "mini-codex": [ToolCall("apply_patch", {"input": patch}), ToolCall("apply_patch", {"input": upd}),
                       ToolCall("exec_command", {"cmd": "cat notes.txt"}), ToolCall("submit", {"answer": "x"})],
        "mini-mimocode": [ToolCall("str_replace_editor", {"command": "create", "path": "m.txt", "file_text": "a\nb\n"}),
                          ToolCall("str_replace_editor", {"command": "insert", "path": "m.txt", "insert_line": 1,
                                                          "new_str": "mid"}),
                          ToolCall("str_replace_editor", {"command": "view", "path": "m.txt"}),
                          ToolCall("submit", {"answer": "x"})],
    }
    expect = {"mini-claude-code": ["wrote a.txt", "edited a.txt", "one three", "a.txt"],
              "mini-codex": ["A notes.txt", "M notes.txt", "alpha\ngamma"],
              "mini-mimocode": ["created m.txt", "inserted into m.txt", "     2\tmid"]}
    for arm, calls in scripts.items():
        turns = [FMT.assistant_text("", [c]) for c in calls]
        seq = asyncio.run(run_sequence(task, ToolfindEnv, ScriptedEngine(turns, lm.encode), _spec(lm), arm=arm))
        obs = [lm.decode(s.token_ids) for s in seq.contexts[0].segments if s.role is Role.OBSERVATION]
        for o, want in zip(obs, expect[arm]):
            assert want in o, (arm, o)


def test_claude_code_compacts_into_a_new_context_near_the_budget(lm):
    task = make_task("train", 11)
    rng = random.Random(3)
    turns = expert_turns(task, rng, FMT, translate=get_arm("mini-claude-code").translate, detour_p=0.0)
    seq = asyncio.run(run_sequence(task, ToolfindEnv, ScriptedEngine(turns, lm.encode), _spec(lm, compact_at=0.05),
                                   arm="mini-claude-code"))
    assert seq.passed and len(seq.contexts) == len(turns)  # every turn overflowed the tiny threshold
    assert seq.metrics["branches"] == len(turns) - 1
    later = lm.decode(seq.contexts[1].segments[0].token_ids)
    assert "compacted" in later and seq.contexts[1].segments[0].role is Role.PROMPT


def test_mini_swe_agent_completes_a_task_as_an_outside_harness(lm):
    """mini-swe-agent (its own agent loop, litellm client, bash tool and submission rule) talks to
    the gateway over HTTP from inside a bubblewrap sandbox over the task's workspace."""
    task = make_task("heldout", 21)
    calls = [ToolCall("bash", {"command": f"grep -r {key} docs"}) for key, _ in task.chain]
    calls.append(ToolCall("bash", {"command": f"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && echo {task.answer}"}))
    engine = ScriptedEngine([FMT.assistant_text("", [c]) for c in calls], lm.encode)
    gw = Gateway(GatewaySettings(engine=engine, encode=lm.encode, decode=lm.decode, fmt=FMT,
                                 sampling=SamplingParams(max_tokens=64), offload=ThreadPoolExecutor(4)))

    async def go():
        async with AsyncServer(make_app(gw)) as srv:
            return await run_outside(task, ToolfindEnv, gw, srv.base_url, "python -m rlonce.harness.mswea",
                                     name="mini-swe-agent", timeout=120)

    seq = asyncio.run(go())
    assert (seq.status, seq.reward, seq.answer) == (Status.SUBMITTED, 1.0, task.answer), seq.metrics
    assert seq.turns == len(calls) and seq.arm == "mini-swe-agent"
    segs = seq.contexts[0].segments
    assert [s.role for s in segs].count(Role.MODEL) == len(calls)
    # the agent's observations (real grep output, in mini-swe-agent's own format) carry no loss
    obs = [lm.decode(s.token_ids) for s in segs if s.role is Role.OBSERVATION]
    assert f"{task.chain[0][0]} = {task.chain[0][1]}" in obs[0] and all(
        s.logprobs is None for s in segs if s.role is not Role.MODEL)


def test_mini_swe_agent_against_the_embedded_model_runs_to_its_end_and_is_recorded(lm):
    """The real embedded model was never trained on mini-swe-agent's prompts: whatever it says,
    the outside episode ends by mini-swe-agent's own rules and every turn is on record."""
    from rlonce.engine.torch_engine import TorchEngine

    engine = TorchEngine(lm.model, eos_token_ids=lm.eos_token_ids, pad_token_id=0, seed=0, version=2)
    gw = Gateway(GatewaySettings(engine=engine, encode=lm.encode, decode=lm.decode, fmt=FMT,
                                 sampling=SamplingParams(max_tokens=32), budgets=Budgets(32, 1024),
                                 offload=ThreadPoolExecutor(4)))
    task = make_task("heldout", 22)

    async def go():
        async with AsyncServer(make_app(gw)) as srv:
            return await run_outside(task, ToolfindEnv, gw, srv.base_url, "python -m rlonce.harness.mswea",
                                     name="mini-swe-agent", timeout=120)

    try:
        seq = asyncio.run(go())
    finally:
        engine.close()
    assert seq.status in (Status.SUBMITTED, Status.LIMITS) and seq.turns >= 1, seq.metrics
    model = [s for c in seq.contexts for s in c.segments if s.role is Role.MODEL]
    assert len(model) == seq.turns and all(v == 2 for s in model for v in s.versions)
