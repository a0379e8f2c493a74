"""Each wall-clock limit, run out for real: a scripted model (slow where the test says), real
bubblewrap sandboxes, the gateway over HTTP for an outside agent. Every expiry is an
infrastructure failure of its own category, never a reward — also when the model's answer was
right — and the ledger counts it by category."""

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import slack

from rlonce.algo.signal import SignalSettings
from rlonce.core.records import FailureCategory, Role, Status
from rlonce.core.timeouts import Timeouts
from rlonce.engine.base import SamplingParams
from rlonce.engine.scripted import ScriptedEngine
from rlonce.envs.toolfind.env import ToolfindEnv
from rlonce.envs.toolfind.expert import optimal_calls
from rlonce.envs.toolfind.tasks import make_task
from rlonce.gateway.http import AsyncServer, make_app
from rlonce.harness.loop import HarnessLimits
from rlonce.harness.outside import run_outside
from rlonce.model.chat import ToolCall, get_format
from rlonce.rollout.mixer import MixerSettings, SampleMixer, SourceStats
from rlonce.rollout.orchestrator import Orchestrator, OrchestratorSettings
from rlonce.rollout.runner import LocalExecutor, RolloutSpec, collect, run_sequence

pytestmark = pytest.mark.sandbox
FMT = get_format("hermes")
UNBOUNDED = Timeouts(None, None, None, None, None)
ONE_HOP = make_task("train", 0)  # one look-up, then submit


def spec(lm, **limits) -> RolloutSpec:
    return RolloutSpec(encode=lm.encode, decode=lm.decode, chat_format=FMT, sampling=SamplingParams(max_tokens=64),
                       limits=HarnessLimits(max_turns=5), timeouts=Timeouts(**{**UNBOUNDED.__dict__, **limits}))


def solve(task) -> list[str]:
    """The scripted model's turns: the look-ups, then the right answer."""
    return [FMT.assistant_text("", [c]) for c in optimal_calls(task)]


def run(lm, env=ToolfindEnv, task=ONE_HOP, turns=None, latency=0.0, **limits):
    engine = ScriptedEngine(solve(task) if turns is None else turns, lm.encode, latency=latency)
    return asyncio.run(run_sequence(task, env, engine, spec(lm, **limits))), engine


def _infra(seq, category: FailureCategory) -> None:
    assert (seq.status, seq.failure, seq.reward) == (Status.INFRA, category, None), seq.cause
    assert seq.cause.startswith(f"Expired: {category.value}")


def test_unbounded_the_script_solves_the_task(lm):
    seq, _ = run(lm, latency=0.2)
    assert seq.status is Status.SUBMITTED and seq.reward == 1.0


def test_a_model_request_past_its_limit_is_model_timeout_and_leaves_no_turn(lm):
    seq, engine = run(lm, latency=1.0, model=0.2)
    _infra(seq, FailureCategory.MODEL_TIMEOUT)
    assert len(engine.prompts) == 1 and seq.turns == 0
    assert [s.role for c in seq.contexts for s in c.segments].count(Role.MODEL) == 0
    assert seq.metrics["seconds"] < slack(1.0)


def test_a_trajectory_past_its_limit_is_trajectory_timeout_though_each_request_was_in_time(lm):
    task = make_task("train", 1)  # two look-ups: three turns of 0.2 s each
    assert len(task.chain) == 2
    seq, engine = run(lm, task=task, latency=0.2, model=1.0, trajectory=0.5)
    _infra(seq, FailureCategory.TRAJECTORY_TIMEOUT)
    assert 1 <= seq.turns < 3 and seq.metrics["seconds"] < slack(1.0)


class SlowSetup(ToolfindEnv):
    async def setup(self):
        await asyncio.sleep(1.0)  # waiting on a slow resource
        await super().setup()


class BlockingSetup(ToolfindEnv):
    async def setup(self):
        time.sleep(0.3)  # work that never yields to the event loop
        await super().setup()


def test_setup_past_its_limit_is_setup_timeout_and_the_model_is_never_asked(lm):
    seq, engine = run(lm, env=SlowSetup, setup=0.2)
    _infra(seq, FailureCategory.SETUP_TIMEOUT)
    assert engine.prompts == [] and seq.metrics["seconds"] < slack(0.9)
    seq, engine = run(lm, env=BlockingSetup, setup=0.1)  # a late result is expired too
    _infra(seq, FailureCategory.SETUP_TIMEOUT)
    assert engine.prompts == []
    seq, _ = run(lm, env=SlowSetup, setup=5.0, trajectory=0.2)  # the trajectory ends first
    _infra(seq, FailureCategory.TRAJECTORY_TIMEOUT)


class SlowGrade(ToolfindEnv):
    async def grade(self, sequence):
        await asyncio.sleep(1.0)
        return await super().grade(sequence)


def test_grading_past_its_limit_is_reward_timeout_even_for_a_right_answer(lm):
    seq, _ = run(lm, env=SlowGrade, reward=0.2)
    assert seq.answer == ONE_HOP.answer  # the model was right; that is not scored either way
    _infra(seq, FailureCategory.REWARD_TIMEOUT)


class SlowGroupGrade(ToolfindEnv):
    @staticmethod
    async def grade_group(task, sequences):
        await asyncio.sleep(1.0)


def test_a_group_grader_past_the_reward_limit_makes_the_group_reward_timeout(lm):
    submit = FMT.assistant_text("", [ToolCall("submit", {"answer": ONE_HOP.answer})])
    engine = ScriptedEngine([submit, submit], lm.encode)
    (sample,) = asyncio.run(collect([ONE_HOP], 2, SlowGroupGrade, engine, spec(lm, reward=0.2), progress=False))
    for seq in sample.sequences:
        assert (seq.status, seq.failure, seq.reward) == (Status.INFRA, FailureCategory.REWARD_TIMEOUT, None)


def test_a_built_in_agent_idle_in_a_tool_past_its_limit_is_agent_idle_timeout(lm):
    sleep = FMT.assistant_text("", [ToolCall("bash", {"command": "sleep 4"})])
    seq, _ = run(lm, turns=[sleep, *solve(ONE_HOP)], agent_idle=0.5)
    _infra(seq, FailureCategory.AGENT_IDLE_TIMEOUT)
    assert seq.turns == 1 and seq.metrics["seconds"] < slack(2.5)  # the sandbox command was stopped


def test_a_slow_model_request_is_not_agent_idleness(lm):
    seq, _ = run(lm, latency=1.0, agent_idle=0.6, model=5.0)
    assert seq.status is Status.SUBMITTED and seq.reward == 1.0


def _outside(lm, command: str, latency: float = 0.0, **limits):
    engine = ScriptedEngine(solve(ONE_HOP), lm.encode, latency=latency)
    gw = spec(lm, **limits).gateway(engine, offload=ThreadPoolExecutor(4))

    async def go():
        async with AsyncServer(make_app(gw)) as srv:
            return await run_outside(ONE_HOP, ToolfindEnv, gw, srv.base_url, command, timeout=60,
                                     timeouts=spec(lm, **limits).timeouts)

    return asyncio.run(go())


def test_an_outside_agent_that_sends_no_request_is_stopped_as_agent_idle_timeout(lm):
    seq = _outside(lm, "sleep 20", agent_idle=0.5)
    _infra(seq, FailureCategory.AGENT_IDLE_TIMEOUT)
    assert seq.metrics["seconds"] < slack(5)


ASK = """python3 - <<'EOF'
import json, os, urllib.error, urllib.request
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", method="POST",
                             data=json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(),
                             headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                      "Content-Type": "application/json"})
try:
    status = urllib.request.urlopen(req, timeout=30).status
except urllib.error.HTTPError as e:
    status = e.code
open(os.environ["RLONCE_ANSWER_FILE"], "w").write(str(status))
EOF"""


def test_a_model_request_the_gateway_gave_up_on_makes_an_outside_sequence_model_timeout(lm):
    seq = _outside(lm, ASK, latency=1.5, model=0.3)
    _infra(seq, FailureCategory.MODEL_TIMEOUT)  # though the agent went on and wrote an answer
    seq = _outside(lm, ASK, latency=0.1, model=5.0)
    assert seq.status is Status.SUBMITTED and seq.answer == "200"


def test_the_ledger_counts_each_expiry_under_its_category(lm):
    submit = FMT.assistant_text("", [ToolCall("submit", {"answer": ONE_HOP.answer})])
    engine = ScriptedEngine([submit] * 4, lm.encode, latency=1.0)
    executor = LocalExecutor(ToolfindEnv, engine, spec(lm, model=0.2))
    mixer = SampleMixer({"s": SourceStats(target=1, share=1.0)}, MixerSettings(budget=1.0))
    orch = Orchestrator(executor, lambda _s, i: make_task("train", i), mixer, SignalSettings(),
                        OrchestratorSettings(group_size=4, batch=1, refill=False, max_sessions=8))

    async def go():
        res = await orch.collect(1)
        await orch.close()
        return res

    e = asyncio.run(go()).ledger["s"]
    assert e.dispatched == 4 and e.infra_failed == 4 and e.infra_by_category == {"model_timeout": 4}
    assert e.retained == 0
    e.check()
