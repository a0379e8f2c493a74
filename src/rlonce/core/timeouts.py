"""Layered wall-clock limits of one sequence, and the typed expiry each one raises.

Seed 001 gives the Code recipe a trajectory timeout of 4,800 s, a model-request timeout of
3,600 s and an agent idle timeout of 720 s, and other recipes bound setup (900 s) and reward
(1,500 s) as well; it warns that "a timeout at one layer cannot be diagnosed reliably by
looking at another layer's budget". So every layer here has its own limit and its own
``FailureCategory``:

    trajectory   the whole sequence: setup, the agent's run, grading    trajectory_timeout
    setup        creating the environment (sandbox, workspace)          setup_timeout
    reward       grading                                                reward_timeout
    model        one engine call through the gateway                    model_timeout
    agent_idle   no model request from the agent for this long          agent_idle_timeout

A phase runs under its own limit and under what is left of the trajectory, whichever ends
first names the expiry. Every expiry is an infrastructure failure: the sequence is never
graded, so a slow machine never becomes a low reward. ``None`` (0 in the config) leaves a
layer unbounded. These are wall-clock limits of this process only; they do not stop work a
remote service keeps doing (the engine drops a cancelled request, a sandbox command is killed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from rlonce.core.records import FailureCategory

T = TypeVar("T")


class Expired(Exception):
    """A layer's wall-clock limit ran out; ``category`` names the layer."""

    def __init__(self, category: FailureCategory, seconds: float):
        super().__init__(f"{category.value}: no result within {seconds:g} s")
        self.category = category
        self.seconds = seconds


@dataclass(frozen=True)
class Timeouts:
    """The limits, in seconds (``None``: unbounded). Defaults: seed 001's values."""

    trajectory: float | None = 4800.0
    setup: float | None = 900.0
    reward: float | None = 1500.0
    model: float | None = 3600.0
    agent_idle: float | None = 720.0

    def start(self) -> Clock:
        """The clock of one sequence, started now."""
        return Clock(self, time.monotonic())


async def within(aw: Awaitable[T], seconds: float | None, category: FailureCategory) -> T:
    """``await aw``, or ``Expired(category)`` once ``seconds`` have passed (``None``: no limit).
    A result that arrives late — work that ran past the limit without yielding to the event
    loop, so it could not be interrupted — is expired too."""
    if seconds is None:
        return await aw
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    try:
        async with asyncio.timeout_at(end) as cm:
            out = await aw
    except TimeoutError:
        if cm.expired():
            raise Expired(category, seconds) from None
        raise
    if loop.time() > end:
        raise Expired(category, seconds)
    return out


@dataclass(frozen=True)
class Clock:
    """One sequence's clock: the trajectory's end, and each phase's limit under it."""

    timeouts: Timeouts
    started: float

    def left(self) -> float | None:
        """Seconds left of the trajectory (``None``: unbounded)."""
        t = self.timeouts.trajectory
        return None if t is None else t - (time.monotonic() - self.started)

    async def bound(self, aw: Awaitable[T], seconds: float | None = None,
                    category: FailureCategory = FailureCategory.TRAJECTORY_TIMEOUT) -> T:
        """``await aw`` within ``seconds`` (its expiry: ``category``) and within the rest of the
        trajectory (``trajectory_timeout``), whichever ends first."""
        left = self.left()
        if left is not None and (seconds is None or left <= seconds):
            seconds, category = max(left, 0.0), FailureCategory.TRAJECTORY_TIMEOUT
        return await within(aw, seconds, category)

    async def setup(self, aw: Awaitable[T]) -> T:
        return await self.bound(aw, self.timeouts.setup, FailureCategory.SETUP_TIMEOUT)

    async def reward(self, aw: Awaitable[T]) -> T:
        return await self.bound(aw, self.timeouts.reward, FailureCategory.REWARD_TIMEOUT)

    async def agent(self, aw: Awaitable[T], last_request: Callable[[], float | None]) -> T:
        """Run the agent (``aw``) within the rest of the trajectory, and stop it with
        ``agent_idle_timeout`` once it has sent no model request for ``agent_idle`` seconds.
        ``last_request()``: when the last request ended (``time.monotonic``), ``None`` while one
        is in flight (a slow engine is the model limit's to catch, not this one's). The idle
        clock starts when the agent does."""
        limit = self.timeouts.agent_idle
        if limit is None:
            return await self.bound(aw)
        task = asyncio.ensure_future(self.bound(aw))
        since = time.monotonic()
        try:
            while True:
                last = last_request()
                idle = 0.0 if last is None else time.monotonic() - max(last, since)
                if idle >= limit:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    raise Expired(FailureCategory.AGENT_IDLE_TIMEOUT, limit)
                done, _ = await asyncio.wait({task}, timeout=limit - idle)
                if done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()
