"""The rollout orchestrator: replay buffer, Sample Mixer, staleness, partial rollout, the step ledger.

One object serves both modes with the same records and functions:

- ``sync`` — each step dispatches its groups, waits for all of them, and (with ``refill``)
  dispatches more of any source still short of its target, until every target is met or the
  step has dispatched ``dispatch_cap`` × the target (then the shortfall is counted).
- ``async`` — a dispatcher keeps the pipeline full while the trainer steps; ``collect`` only
  waits until the buffer holds each source's target of accepted groups. Weight updates pause
  the engine: in-flight turns stop at their next token and the gateway session continues them
  under the new weights by re-prefilling (``partial rollout``); every token keeps the log-prob
  and policy version it was sampled with.

**Replay buffer.** Every dispatched group (one task × ``group_size`` sequences) is a ``Group``
in state pending → running → finished (evaluated by ``rlonce.algo.learning_signal``: accepted,
no-contrast-filtered or penalty-rejected; infrastructure failures excluded from its statistics)
or failed (every sequence an infrastructure failure). ``collect`` takes accepted groups
oldest-first.

**Staleness.** A group dispatched at step d is dropped at step s when ``s - d + 1 > staleness``
(whether still running or waiting), and refilled. Since weights advance once per step, every
trained token then lags the trainer by at most ``staleness - 1`` versions; the lag of every
trained token is measured and reported per step, and a violation is counted.

**Ledger** (per step and source, in sequences) — checked every step:

    carried_in + dispatched = infra_failed + no_contrast_filtered + penalty_rejected
                              + stale_dropped + retained + carried_over

**Admission.** New groups start greedily by mixer weight under per-source concurrency budgets
(Little's law, ``SampleMixer.concurrency``), a cap on concurrent sessions and a budget of
predicted KV tokens (the source's mean context length × group size).

The executor runs one group. ``LocalExecutor`` runs its sequences on this event loop and hands
them back; the orchestrator judges them here (``judge``). ``RayExecutor``
(``rlonce.dist.pools.RayExecutor``) runs the group in a harness-pool actor, which calls the same
``judge`` where the tokens are and returns a ``Judged`` whose sequences are metadata only (no
contexts) and whose rows stay in Ray's object store until the trainer fetches them (``payload``).
An executor failure becomes an infrastructure failure of every sequence of the group, with the
exception's ``category`` when it has one (a lost actor, a timed-out call).

The group record, ``Judge`` and a group's plain-data form live in ``rlonce.rollout.groups``,
admission in ``rlonce.rollout.admission``; both are used from here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from rlonce.algo.signal import SignalSettings
from rlonce.core.ledger import LedgerEntry
from rlonce.core.records import FailureCategory, Sample, Sequence, Status, TrainingRow
from rlonce.rollout.admission import dispatch_round
from rlonce.rollout.groups import (
    FAILED,
    FINISHED,
    PENDING,
    RUNNING,
    Group,
    Judge,
    Judged,
    materialize,
    replayed_group,
    waiting_state,
)
from rlonce.rollout.mixer import SampleMixer

__all__ = ["FAILED", "FINISHED", "PENDING", "RUNNING", "Executor", "Group", "Judge", "Judged", "Orchestrator",
           "OrchestratorSettings", "StepResult"]

log = logging.getLogger("rlonce.orchestrator")


class Executor(Protocol):
    async def run_group(self, group: Group, group_size: int) -> list[Sequence] | Judged: ...


@dataclass
class StepResult:
    rows: list[TrainingRow]
    ledger: dict[str, LedgerEntry]
    samples: list[Sample]
    """The groups trained on."""
    finished: list[Sequence]
    """Every sequence that ended during the step (kept, filtered, rejected or failed)."""
    metrics: dict[str, float]
    payloads: list = field(default_factory=list)
    """Remote payloads of the groups trained on (``Group.payload``), in the order of ``samples``;
    their rows are not in ``rows``: the trainer fetches them."""

    @property
    def row_count(self) -> int:
        return len(self.rows) + sum(p.rows for p in self.payloads)


@dataclass
class OrchestratorSettings:
    mode: str = "sync"
    group_size: int = 8
    staleness: int = 1
    """Largest dispatch age (in steps, counting the current one) a trained group may have."""
    refill: bool = True
    """Sync mode: dispatch more of a source still short of its target after filtering."""
    max_refill_rounds: int = 4
    dispatch_cap: float | None = None
    """Sync: the most groups a step dispatches per source, as a multiple of its target (None: only
    ``max_refill_rounds`` bounds the refills). A batch still short then is counted (``groups_short``)."""
    max_sessions: int = 64
    kv_budget: float = float("inf")
    """Predicted KV tokens in flight (mean context tokens of the source × group size)."""
    fixed_quota: dict[str, int] | None = None
    """Sync without the mixer: the first round dispatches exactly this many groups per source."""
    group_by_arm: bool = False
    """Judge each group's siblings per harness arm (``split_by_arm``)."""


class Orchestrator:
    def __init__(self, executor: Executor, tasks: Callable[[str, int], object], mixer: SampleMixer,
                 signal: SignalSettings, settings: OrchestratorSettings, *, decode=None):
        self.executor = executor
        self.tasks = tasks
        self.mixer = mixer
        self.s = settings
        self.decode = decode
        self.judge = Judge(signal, settings.group_by_arm)
        self.groups: dict[str, Group] = {}
        self.next_index: dict[str, int] = {n: 0 for n in mixer.sources}
        self.order = 0
        self.step = 1
        self.window: dict[str, LedgerEntry] = {}
        self.signal_stats: Counter = Counter()
        self.finished: list[Sequence] = []
        self.changed = asyncio.Event()
        self._dispatcher: asyncio.Task | None = None
        self._stopping = False
        self._replay: list[dict] = []
        self._reissue: list[dict] = []
        self.replayed = 0
        self.reissued = 0
        self.step_interval: float | None = None
        """Moving average of the time between collections (async admission's unit of latency)."""
        self._last_collect: float | None = None
        self.snapshot: dict = {}
        """``state_dict()`` taken when the last step closed — what a checkpoint should hold."""

    # ---- bookkeeping ---------------------------------------------------------------------
    def _entry(self, source: str) -> LedgerEntry:
        return self.window.setdefault(source, LedgerEntry(self.step, source))

    def _open(self, source: str | None = None) -> list[Group]:
        return [g for g in self.groups.values() if (source is None or g.source == source)
                and (g.state in (PENDING, RUNNING) or (g.state == FINISHED and g.accepted))]

    def _open_count(self, g: Group) -> int:
        """Sequences of ``g`` not yet accounted for: all of a running group; the non-infra ones
        of a finished group (its infrastructure failures were counted when it finished)."""
        return self.s.group_size if g.state != FINISHED else sum(not s.infra_failed for s in g.sequences)

    def in_flight(self, source: str | None = None) -> list[Group]:
        return [g for g in self.groups.values() if g.state in (PENDING, RUNNING)
                and (source is None or g.source == source)]

    def _short(self) -> bool:
        """Some source has fewer accepted groups waiting than its target."""
        acc = Counter(g.source for g in self.groups.values() if g.state == FINISHED and g.accepted)
        return any(acc[n] < s.target for n, s in self.mixer.sources.items())

    def accepted(self, source: str) -> list[Group]:
        return sorted((g for g in self.groups.values() if g.source == source and g.state == FINISHED and g.accepted),
                      key=lambda g: g.order)

    # ---- dispatch ------------------------------------------------------------------------
    def dispatch(self, source: str, *, index: int | None = None, counted: bool = True) -> Group:
        """Start a group of ``source``'s next task (or of task ``index``, reissued after a restart:
        its age restamped, its sequences already counted as carried in, not dispatched)."""
        i = index if index is not None else self.next_index[source]
        if index is None:
            self.next_index[source] = i + 1
        task = self.tasks(source, i)
        g = Group(f"{source}:{i}@{self.step}", task, source, self.step, self.order, index=i)
        self.order += 1
        self.groups[g.gid] = g
        if counted:
            self._entry(source).dispatched += self.s.group_size
        g.state = RUNNING
        g.job = asyncio.create_task(self._run(g))
        return g

    async def _run(self, g: Group) -> None:
        t0 = time.perf_counter()
        tid = getattr(g.task, "task_id", g.gid)
        try:
            out = await self.executor.run_group(g, self.s.group_size)
        except asyncio.CancelledError:
            return
        except Exception as exc:  # noqa: BLE001 - the executor failed, not the model: every sequence is infra
            category = getattr(exc, "category", FailureCategory.HARNESS_ERROR)
            log.warning("executor failed on group %s; its sequences are infra (%s): %s", g.gid, category.value, exc,
                        exc_info=category is FailureCategory.HARNESS_ERROR)
            out = [Sequence(tid, "?", status=Status.INFRA, failure=category) for _ in range(self.s.group_size)]
        g.seconds = time.perf_counter() - t0
        if g.gid not in self.groups:  # dropped as stale while it ran
            self.changed.set()
            return
        judged = out if isinstance(out, Judged) else self.judge(tid, g.source, g.dispatch_step, out, self.decode)
        self._evaluate(g, judged)
        self.changed.set()

    def _evaluate(self, g: Group, judged: Judged) -> None:
        seqs, rows, ev, stats = judged.sequences, judged.rows, judged.entry, judged.stats
        g.sequences = seqs
        g.payload = judged.payload
        self.finished += seqs
        w = self._entry(g.source)
        w.finished += ev.finished
        w.infra_failed += ev.infra_failed
        for k, v in ev.infra_by_category.items():
            w.infra_by_category[k] = w.infra_by_category.get(k, 0) + v
        w.no_contrast_filtered += ev.no_contrast_filtered
        w.penalty_rejected += ev.penalty_rejected
        for k in ("hack_zeroed", "length_penalized", "zero_advantage", "contexts_dropped", "unfinished_masked"):
            setattr(w, k, getattr(w, k) + getattr(ev, k))
        self.signal_stats.update(stats)
        g.rows, g.accepted = rows, ev.retained > 0
        g.state = FINISHED if ev.finished else FAILED
        if ev.finished:  # infrastructure failures say nothing about the source's acceptance
            tokens = sum(s.metrics.get("context_tokens", 0.0) for s in seqs) / max(len(seqs), 1)
            self.mixer.observe(g.source, accepted=g.accepted, duration=g.seconds, tokens=tokens)
        if not g.accepted:
            del self.groups[g.gid]

    def _dispatch_round(self) -> int:
        """Start every group admission allows now (``rlonce.rollout.admission``); returns how many."""
        return dispatch_round(self.groups.values(), self.mixer, self.s, self.step_interval, self.dispatch)

    async def _dispatch_loop(self) -> None:
        while not self._stopping:
            self.changed.clear()
            self._dispatch_round()
            await self.changed.wait()

    # ---- one step ------------------------------------------------------------------------
    def _evict_stale(self) -> None:
        for g in list(self.groups.values()):
            if self.step - g.dispatch_step + 1 > self.s.staleness:
                self._entry(g.source).stale_dropped += self._open_count(g)
                if g.job is not None and not g.job.done():
                    g.job.cancel()
                del self.groups[g.gid]

    async def _dispatch_within(self, todo: dict[str, int]) -> None:
        """Dispatch ``todo[source]`` groups per source as the session cap allows, then drain."""
        queue = [n for n, k in todo.items() for _ in range(k)]
        while queue:
            if self.in_flight() and (len(self.in_flight()) + 1) * self.s.group_size > self.s.max_sessions:
                self.changed.clear()
                await self.changed.wait()
                continue
            self.dispatch(queue.pop(0))
        await self._drain()

    async def _sync_fill(self) -> None:
        """Seed 001: "The mixer has to buy the batch it promised": refill each source short of its
        target (by its measured acceptance), within the rounds and the dispatch cap; count the rest."""
        sent = dict(self.s.fixed_quota or self.mixer.quotas())
        await self._dispatch_within(sent)
        cap = {n: float("inf") if self.s.dispatch_cap is None else self.s.dispatch_cap * s.target
               for n, s in self.mixer.sources.items()}
        for _ in range(self.s.max_refill_rounds if self.s.refill else 0):
            short = {n: int(s.target) - len(self.accepted(n)) for n, s in self.mixer.sources.items()}
            r = {n: max(self.mixer.sources[n].acceptance, self.mixer.settings.min_acceptance) for n in short}
            todo = {n: int(min(max(1, round(k / r[n])), cap[n] - sent.get(n, 0))) for n, k in short.items() if k > 0}
            if not any(k > 0 for k in todo.values()):
                break
            todo = {n: k for n, k in todo.items() if k > 0}
            sent.update({n: sent.get(n, 0) + k for n, k in todo.items()})
            await self._dispatch_within(todo)
        for n, s in self.mixer.sources.items():
            self._entry(n).groups_short += max(0, int(s.target) - len(self.accepted(n)))

    async def _drain(self) -> None:
        jobs = [g.job for g in self.in_flight() if g.job is not None]
        if jobs:
            await asyncio.gather(*jobs, return_exceptions=True)

    async def collect(self, step: int, *, max_wait: float | None = None) -> StepResult:
        """The batch for trainer step ``step``: each source's target of accepted groups, oldest first."""
        self.step = step
        for e in self.window.values():
            e.step = step
        self._restore_open_work()
        self._evict_stale()
        if self.s.mode == "sync":
            await self._sync_fill()
        else:
            if self._dispatcher is None:
                self._dispatcher = asyncio.create_task(self._dispatch_loop())
            self.changed.set()
            deadline = None if max_wait is None else time.perf_counter() + max_wait
            while self._short():
                self.changed.clear()
                timeout = None if deadline is None else max(0.0, deadline - time.perf_counter())
                if timeout == 0.0:
                    break
                try:
                    await asyncio.wait_for(self.changed.wait(), timeout)
                except asyncio.TimeoutError:
                    break
        taken: list[Group] = []
        for n, s in self.mixer.sources.items():
            pool = self.accepted(n)
            taken += pool[: int(s.target)]
        taken.sort(key=lambda g: g.order)
        for g in taken:
            self._entry(g.source).retained += self._open_count(g)
            del self.groups[g.gid]
        return self._close_step(step, taken)

    def _close_step(self, step: int, taken: list[Group]) -> StepResult:
        now = time.perf_counter()
        if self._last_collect is not None:
            dt = now - self._last_collect
            self.step_interval = dt if self.step_interval is None else 0.8 * self.step_interval + 0.2 * dt
        self._last_collect = now
        rows, batch_stats = self.judge.batch(taken)
        open_seqs: Counter = Counter()
        for g in self._open():
            open_seqs[g.source] += self._open_count(g)
        ledger = {}
        for n in self.mixer.sources:
            e = self._entry(n)
            e.step = step
            e.carried_over = open_seqs[n]
            e.check()
            ledger[n] = e
        self.window = {n: LedgerEntry(step + 1, n, carried_in=ledger[n].carried_over) for n in ledger}
        self.snapshot = self.state_dict()  # consistent with this step's ledger: its open work is carried_over
        stats = {**self.signal_stats, **batch_stats}
        self.signal_stats = Counter()
        stats["groups_taken"] = float(len(taken))
        stats["groups_in_flight"] = float(len(self.in_flight()))
        samples = [Sample(getattr(g.task, "task_id", g.gid), g.source, g.dispatch_step, g.sequences) for g in taken]
        finished, self.finished = self.finished, []
        return StepResult(rows, ledger, samples, finished, stats, [g.payload for g in taken if g.payload is not None])

    async def close(self) -> None:
        self._stopping = True
        self.changed.set()
        if self._dispatcher is not None:
            self._dispatcher.cancel()
        for g in self.in_flight():
            if g.job is not None:
                g.job.cancel()
        await asyncio.gather(*(g.job for g in self.groups.values() if g.job is not None), return_exceptions=True)
        if self._dispatcher is not None:
            await asyncio.gather(self._dispatcher, return_exceptions=True)

    # ---- persistence ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        """What a restart needs: the mixer's estimates, per-source task positions, the accepted
        groups still waiting (replayed within the staleness bound) and the prompts in flight
        (reissued with their age restamped). Plain data, for the trainer's checkpoint."""
        waiting, flight = [], []
        for g in sorted(self.groups.values(), key=lambda g: g.order):
            if g.state == FINISHED and g.accepted:
                waiting.append(waiting_state(g))
            elif g.state in (PENDING, RUNNING):
                flight.append({"source": g.source, "index": g.index})
        return {"mixer": self.mixer.state_dict(), "next_index": dict(self.next_index), "order": self.order,
                "waiting": waiting, "in_flight": flight}

    materialize = staticmethod(materialize)

    def load_state_dict(self, state: dict) -> None:
        """Restore; the restored open work is the next step's ``carried_in``."""
        self.mixer.load_state_dict(state.get("mixer", {}))
        self.next_index.update(state.get("next_index", {}))
        self.order = state.get("order", self.order)
        self._replay = list(state.get("waiting", []))
        self._reissue = list(state.get("in_flight", []))

    def _restore_open_work(self) -> None:
        """At the first collect after a restart: replay accepted groups, reissue in-flight prompts."""
        for w in self._replay:
            g = replayed_group(w, self.tasks, self.order)
            self.order += 1
            self.groups[g.gid] = g
            self._entry(g.source).carried_in += self._open_count(g)
            self.replayed += 1
        for f in self._reissue:
            g = self.dispatch(f["source"], index=f["index"], counted=False)
            self._entry(g.source).carried_in += self.s.group_size
            self.reissued += 1
        self._replay, self._reissue = [], []
