"""Lockstep waves: a schedule for the engine's batches that does not depend on timing.

A batched engine's numbers depend on the batch: a row's logits differ in the last bits with the
rows beside it and their padding (measured on the embedded model: up to 1e-5). So a run whose
waves are formed by arrival time — sandboxes and graders finishing when they happen to — samples
other tokens, with other log-probs, each time it runs, and a resumed run cannot equal an
uninterrupted one. ``Lockstep`` wraps an engine and forms each wave from a fixed set instead:

    reserve(n)          the dispatcher announces n sequences, synchronously, before any of them runs
    member(key)         a sequence joins (its episode runs inside); it leaves when its episode ends
    generate(...)       a member's request waits until every member has one pending, or has left,
                        and no announced sequence is still to join; then all pending requests go
                        to the engine as one wave, ordered by key

Which requests share a wave is then a function of the sequences' own histories, and with seeded
sampling (``SamplingParams.seed``) so are the tokens and log-probs. The price is the barrier: a
wave waits for the slowest tool call of its turn. Requests from outside a member (a served HTTP
client, an evaluation without lockstep) pass straight through. ``runtime.deterministic`` turns it
on for sync runs on the local executor (``rlonce.train.backend.LocalBackend``).
"""

from __future__ import annotations

import asyncio
import contextlib
from contextvars import ContextVar

from rlonce.engine.base import Engine, Generation, SamplingParams, Watch

_MEMBER: ContextVar[tuple | None] = ContextVar("rlonce_lockstep_member", default=None)


class Ticket:
    """``n`` announced sequences: each joins with ``member``; ``release`` gives up the ones that
    never joined (a group whose executor failed first)."""

    def __init__(self, lockstep: Lockstep, n: int):
        self.lockstep, self.left = lockstep, n

    @contextlib.asynccontextmanager
    async def member(self, key: tuple):
        ls = self.lockstep
        if self.left <= 0:
            raise RuntimeError("more members joined than the ticket announced")
        self.left -= 1
        ls.unjoined -= 1
        ls.active.add(key)
        token = _MEMBER.set((ls, key))
        try:
            yield
        finally:
            _MEMBER.reset(token)
            ls.active.discard(key)
            ls.pending.pop(key, None)
            ls.maybe_fire()

    def release(self) -> None:
        self.lockstep.unjoined -= self.left
        self.left = 0
        self.lockstep.maybe_fire()


class Lockstep:
    """An engine whose members' requests go out in waves of a fixed membership (module docstring);
    everything else an engine has is the wrapped engine's."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.unjoined = 0
        """Announced sequences that have not joined yet: no wave starts while any is due."""
        self.active: set[tuple] = set()
        self.pending: dict[tuple, tuple] = {}
        """Member key → (prompt ids, sampling, watch, future)."""
        self.waves = 0

    def __getattr__(self, name):  # version, load_weights, pause, resume, close, stats: the engine's
        return getattr(self.engine, name)

    def reserve(self, n: int) -> Ticket:
        if not self.active and self.unjoined == 0 and hasattr(self.engine, "forget_waves"):
            self.engine.forget_waves()  # a new round: no cache kept from an earlier one is reused
        self.unjoined += n
        return Ticket(self, n)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, watch: Watch | None = None) -> Generation:
        me = _MEMBER.get()
        if me is None or me[0] is not self:
            return await self.engine.generate(prompt_ids, sampling, watch)
        key = me[1]
        if key in self.pending:
            raise RuntimeError(f"lockstep member {key} sent a second request before the first was answered")
        fut = asyncio.get_running_loop().create_future()
        self.pending[key] = (prompt_ids, sampling, watch, fut)
        self.maybe_fire()
        return await fut

    def maybe_fire(self) -> None:
        """Send the pending requests as one wave once no member or announced sequence can add one."""
        if self.unjoined > 0 or not self.pending or any(k not in self.pending for k in self.active):
            return
        wave = [self.pending[k] for k in sorted(self.pending, key=repr)]
        self.pending = {}
        self.waves += 1
        asyncio.get_running_loop().create_task(self._run(wave))

    async def _run(self, wave: list[tuple]) -> None:
        batch = [(p, s, w) for p, s, w, _ in wave]
        many = getattr(self.engine, "generate_wave", None)
        try:
            if many is not None:
                results = await many(batch)
            else:  # an engine without whole waves (scripted, vLLM): requests in key order
                results = await asyncio.gather(*(self.engine.generate(*r) for r in batch), return_exceptions=True)
        except Exception as e:  # noqa: BLE001 - delivered to every caller, as the engine would
            results = [e] * len(wave)
        for (*_, fut), res in zip(wave, results):
            if fut.done():
                continue
            if isinstance(res, BaseException):
                fut.set_exception(res)
            else:
                fut.set_result(res)
