"""The layered wall-clock limits on their own: defaults, the config's mapping, which layer names
an expiry, late results, and the agent idle watch (``rlonce.core.timeouts``)."""

import asyncio
import time

import pytest
from conftest import slack

from rlonce.config import TimeoutsConfig, load_config
from rlonce.core.records import FailureCategory
from rlonce.core.timeouts import Clock, Expired, Timeouts, within
from rlonce.rollout.builders import timeouts


def test_defaults_are_the_seed_values_and_zero_is_unbounded():
    assert Timeouts() == Timeouts(trajectory=4800.0, setup=900.0, reward=1500.0, model=3600.0, agent_idle=720.0)
    assert timeouts(TimeoutsConfig()) == Timeouts()
    cfg = load_config(None, ["timeouts.trajectory_s=0", "timeouts.agent_idle_s=1.5"])
    assert timeouts(cfg.timeouts) == Timeouts(trajectory=None, agent_idle=1.5)
    with pytest.raises(Exception, match="timeouts.setup_s"):
        load_config(None, ["timeouts.setup_s=-1"])


def _expiry(coro) -> FailureCategory:
    with pytest.raises(Expired) as e:
        asyncio.run(coro)
    return e.value.category


def test_the_layer_that_ends_first_names_the_expiry():
    async def phase(t: Timeouts, seconds: float):
        return await t.start().setup(asyncio.sleep(seconds))

    assert _expiry(phase(Timeouts(trajectory=10, setup=0.05), 1)) is FailureCategory.SETUP_TIMEOUT
    assert _expiry(phase(Timeouts(trajectory=0.05, setup=10), 1)) is FailureCategory.TRAJECTORY_TIMEOUT
    assert _expiry(phase(Timeouts(trajectory=0.05, setup=None), 1)) is FailureCategory.TRAJECTORY_TIMEOUT
    assert asyncio.run(phase(Timeouts(trajectory=None, setup=None), 0.01)) is None
    # what is left of the trajectory bounds a later phase: 0.15 s gone, 0.1 s left of 0.25 s
    clock = Clock(Timeouts(trajectory=0.25, reward=10), time.monotonic() - 0.15)
    t0 = time.monotonic()
    assert _expiry(clock.reward(asyncio.sleep(1))) is FailureCategory.TRAJECTORY_TIMEOUT
    assert 0.05 < time.monotonic() - t0 < slack(0.5)


def test_a_result_that_arrives_late_is_expired_even_if_nothing_could_interrupt_it():
    async def blocking():
        time.sleep(0.2)  # never yields to the event loop
        return "late"

    assert _expiry(within(blocking(), 0.05, FailureCategory.REWARD_TIMEOUT)) is FailureCategory.REWARD_TIMEOUT
    assert asyncio.run(within(blocking(), 5, FailureCategory.REWARD_TIMEOUT)) == "late"


def test_agent_idle_counts_from_the_last_request_and_not_while_one_is_in_flight():
    async def agent(state: dict, pauses: list[float]):
        for p in pauses:
            state["last"] = None  # a request in flight
            await asyncio.sleep(p)
            state["last"] = time.monotonic()  # the answer came back; the agent works
            await asyncio.sleep(0.05)
        return "done"

    async def go(limit: float, pauses: list[float]):
        state = {"last": time.monotonic()}
        return await Timeouts(agent_idle=limit).start().agent(agent(state, pauses), lambda: state["last"])

    assert asyncio.run(go(0.3, [0.6, 0.6])) == "done"  # long requests are the model limit's business

    async def idle():
        await asyncio.sleep(5)

    t0 = time.monotonic()
    assert _expiry(Timeouts(agent_idle=0.2).start().agent(idle(), lambda: 0.0)) is FailureCategory.AGENT_IDLE_TIMEOUT
    assert time.monotonic() - t0 < slack(1.0)
