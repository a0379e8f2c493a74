"""The rollout orchestrator: replay buffer, Sample Mixer, staleness, partial rollout, the step
ledger — one object for both modes (docs/orchestrator.md has the whole account).

- ``sync`` — each step dispatches its groups, waits for them, and (with ``refill``) dispatches
  more of any source still short of its target, until every target is met or the source has
  had its ``dispatch_cap`` × target (then the shortfall is counted).
- ``async`` — a dispatcher keeps the pipeline full while the trainer steps; ``collect`` waits
  until each source has its target of accepted groups, or has finished its cap's worth this
  step without it (counted). Weight updates pause the engine; the gateway continues in-flight
  turns under the new weights (partial rollout); every token keeps its log-prob and version.

**Replay buffer.** A dispatched group (a task × ``group_size`` sequences) goes pending → running
→ finished (judged by ``rlonce.algo.learning_signal``) or failed (all infra); ``collect`` takes
accepted groups oldest-first. **Sources**: per-source targets are ``batch`` split by share
(``SampleMixer.plan_step``); each source has its own ``SourceRules`` (staleness, stale policy,
difficulty filter, dispatch cap). **Staleness**: a group dispatched at step d is dropped at step
s when ``s - d + 1 > staleness`` (running or waiting; under ``reissue`` its task runs again).
**Ledger** (per step and source, in sequences), checked every step::

    carried_in + dispatched = infra_failed + no_contrast_filtered + penalty_rejected
                              + unfinished_dropped + stale_dropped + retained + carried_over

The executor runs one group (``LocalExecutor`` here; ``RayExecutor`` in a harness-pool actor,
which judges where the tokens are and leaves the rows in the object store). An executor failure
is an infrastructure failure of every sequence of the group; a failure of judging is ours
(``internal_error``), never a group left running. Groups and ``Judge``: ``rollout.groups``;
admission: ``rollout.admission``; settings: ``rollout.settings``; ``rollout.difficulty``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

from rlonce.algo.signal import SignalSettings
from rlonce.core.ledger import LedgerEntry
from rlonce.core.records import FailureCategory, Sample, Sequence, Status, staleness_violations
from rlonce.errors import note_internal
from rlonce.rollout.admission import dispatch_round
from rlonce.rollout.difficulty import DifficultyFilter
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
from rlonce.rollout.settings import MAX_SKIPS, Executor, OrchestratorSettings, SourceRules, StepResult

__all__ = ["FAILED", "FINISHED", "PENDING", "RUNNING", "Executor", "Group", "Judge", "Judged", "Orchestrator",
           "OrchestratorSettings", "SourceRules", "StepResult"]

log = logging.getLogger("rlonce.orchestrator")


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
        self.step_finished: Counter = Counter()  # per source: groups finished since this collect began
        self.ended: list[tuple[int, str, list[Sequence]]] = []  # the step's groups: (order, source, sequences)
        self.changed = asyncio.Event()
        self._dispatcher: asyncio.Task | None = None
        self._stopping = False
        self._replay: list[dict] = []
        self._reissue: list[dict] = []
        self.replayed = self.reissued = 0
        self.step_interval: float | None = None
        """Moving average of the time between collections (async admission's unit of latency)."""
        self._last_collect: float | None = None
        self.snapshot: dict = {}
        """``state_dict()`` taken when the last step closed — what a checkpoint should hold."""
        self.difficulty = {n: DifficultyFilter(settings.rule(n).difficulty_window) for n in mixer.sources}
        self.requeue: dict[str, list[int]] = {n: [] for n in mixer.sources}  # ``reissue``: stale tasks first

    # ---- bookkeeping ---------------------------------------------------------------------
    def staleness(self, source: str) -> int:
        """The largest dispatch age (steps) a trained group of ``source`` may have."""
        return self.s.rule(source).staleness

    def staleness_violations(self, samples: list, rows: list, trained_version: int) -> int:
        """Trained tokens whose policy lag broke their own source's staleness bound (``rows`` of
        ``samples``' groups, trained at ``trained_version``): a check of the bound this orchestrator
        keeps, counted in the step record."""
        limit = {x.group_id: self.staleness(x.source) for x in samples}
        return staleness_violations(rows, trained_version, lambda g: limit.get(g, self.s.staleness))

    def _entry(self, source: str) -> LedgerEntry:
        return self.window.setdefault(source, LedgerEntry(self.step, source))

    def _open(self, source: str | None = None) -> list[Group]:
        return [g for g in self.groups.values() if (source is None or g.source == source)
                and (g.state in (PENDING, RUNNING) or (g.state == FINISHED and g.accepted))]

    def _open_count(self, g: Group) -> int:
        """Sequences of ``g`` not yet accounted for: all of a running group; the retained ones of
        a finished group (its infrastructure failures and filtered arms were counted when it finished)."""
        return self.s.size(g.source) if g.state != FINISHED else g.retained

    def in_flight(self, source: str | None = None) -> list[Group]:
        return [g for g in self.groups.values() if g.state in (PENDING, RUNNING)
                and (source is None or g.source == source)]

    def _cap(self, source: str) -> float:  # the most groups of ``source`` a step pays for, × its target
        return self.s.rule(source).dispatch_cap or self.s.dispatch_cap or float("inf")

    def _short(self) -> bool:
        """Some source has fewer accepted groups waiting than its target and has not yet finished
        its cap's worth of groups this step (a source that accepts nothing does not stall a step)."""
        acc = Counter(g.source for g in self.groups.values() if g.state == FINISHED and g.accepted)
        return any(acc[n] < s.target and self.step_finished[n] < self._cap(n) * max(s.target, 1)
                   for n, s in self.mixer.sources.items())

    def accepted(self, source: str) -> list[Group]:
        return sorted((g for g in self.groups.values() if g.source == source and g.state == FINISHED and g.accepted),
                      key=lambda g: g.order)

    # ---- dispatch ------------------------------------------------------------------------
    def dispatch(self, source: str, *, index: int | None = None, counted: bool = True, again: bool = False) -> Group:
        """Start a group of ``source``'s next task (or of task ``index``, reissued after a restart: its
        age restamped, its sequences counted as carried in, not dispatched; ``again``: a reissue)."""
        i, task, again = (index, self.tasks(source, index), again) if index is not None else self._next_task(source)
        g = Group(f"{source}:{i}@{self.step}", task, source, self.step, self.order, index=i, again=again)
        self.order += 1
        self.groups[g.gid] = g
        if counted:
            self._entry(source).dispatched += self.s.size(source)
        g.state = RUNNING
        if hasattr(self.executor, "reserve"):  # lockstep waves: its sequences are announced now
            self.executor.reserve(g, self.s.size(source))
        g.job = asyncio.create_task(self._run(g))
        return g

    def _next_task(self, source: str) -> tuple[int, object, bool]:
        """The source's next task and whether it is reissued: a reissued one first, then the
        stream, past tasks the difficulty filter skips (each counted; at most ``MAX_SKIPS``)."""
        if self.requeue[source]:
            i = self.requeue[source].pop(0)
            return i, self.tasks(source, i), True
        f = self.difficulty[source]
        for tries in range(MAX_SKIPS + 1):
            i = self.next_index[source]
            self.next_index[source] = i + 1
            task = self.tasks(source, i)
            if tries == MAX_SKIPS or not f.skip(getattr(task, "task_id", f"{source}:{i}")):
                return i, task, False
            self._entry(source).difficulty_skipped += 1

    async def _run(self, g: Group) -> None:
        t0 = time.perf_counter()
        tid = getattr(g.task, "task_id", g.gid)
        try:
            out = await self.executor.run_group(g, self.s.size(g.source))
        except asyncio.CancelledError:
            return
        except Exception as exc:  # noqa: BLE001 - the executor failed, not the model: every sequence is infra
            category = getattr(exc, "category", FailureCategory.HARNESS_ERROR)
            log.warning("executor failed on group %s; its sequences are infra (%s): %s", g.gid, category.value, exc,
                        exc_info=category is FailureCategory.HARNESS_ERROR)
            out = self._all_infra(tid, category, self.s.size(g.source))
        g.seconds = time.perf_counter() - t0
        if g.gid not in self.groups:  # dropped as stale while it ran
            self.changed.set()
            return
        try:
            judged = out if isinstance(out, Judged) else self.judge(tid, g.source, g.dispatch_step, out, self.decode)
        except Exception as exc:  # noqa: BLE001 - our bug in judging must not leave the group running forever
            log.error("judging group %s failed: %s", g.gid, note_internal(exc), exc_info=True)
            lost = self._all_infra(tid, FailureCategory.INTERNAL_ERROR, self.s.size(g.source))
            judged = self.judge(tid, g.source, g.dispatch_step, lost, self.decode)
        self._evaluate(g, judged)
        self.changed.set()

    @staticmethod
    def _all_infra(task_id: str, category: FailureCategory, size: int) -> list[Sequence]:
        return [Sequence(task_id, "?", status=Status.INFRA, failure=category) for _ in range(size)]

    def _evaluate(self, g: Group, judged: Judged) -> None:
        seqs, rows, ev, stats = judged.sequences, judged.rows, judged.entry, judged.stats
        g.sequences, g.signal = seqs, judged.signal
        g.payload = judged.payload
        self.ended.append((g.order, g.source, seqs))
        w = self._entry(g.source)
        w.finished += ev.finished
        w.infra_failed += ev.infra_failed
        for k, v in ev.infra_by_category.items():
            w.infra_by_category[k] = w.infra_by_category.get(k, 0) + v
        for k in ("no_contrast_filtered", "no_contrast_all_passed", "penalty_rejected", "unfinished_dropped",
                  "hack_zeroed", "length_penalized", "zero_advantage", "contexts_dropped", "unfinished_masked",
                  "policy_input_errors"):
            setattr(w, k, getattr(w, k) + getattr(ev, k))
        self.signal_stats.update(stats)
        g.rows, g.accepted, g.retained = rows, ev.retained > 0, ev.retained
        g.state = FINISHED if ev.finished else FAILED
        if ev.finished:  # infrastructure failures say nothing about the source's acceptance or difficulty
            self.step_finished[g.source] += 1
            tokens = sum(s.metrics.get("context_tokens", 0.0) for s in seqs) / max(len(seqs), 1)
            self.mixer.observe(g.source, accepted=g.accepted, tokens=tokens,  # deterministic: tokens, not time
                               duration=tokens if self.s.deterministic else g.seconds)
            valid = [s.passed for s in seqs if not s.infra_failed]
            self.difficulty[g.source].observe(getattr(g.task, "task_id", f"{g.source}:{g.index}"),
                                              sum(valid) / len(valid))
        if not g.accepted:
            del self.groups[g.gid]

    def _dispatch_round(self) -> int:
        """Start every group admission allows now (``rlonce.rollout.admission``); returns how many."""
        return dispatch_round(self.groups.values(), self.mixer, self.s, self.step_interval, self.dispatch)

    async def _dispatch_loop(self) -> None:
        try:
            while not self._stopping:
                self.changed.clear()
                self._dispatch_round()
                await self.changed.wait()
        finally:  # a dispatcher that died (a task stream that raised) wakes collect, which raises its error
            self.changed.set()

    # ---- one step ------------------------------------------------------------------------
    def _evict_stale(self) -> None:
        for g in list(self.groups.values()):
            rule = self.s.rule(g.source)
            if self.step - g.dispatch_step + 1 > rule.staleness:
                self._entry(g.source).stale_dropped += self._open_count(g)
                if g.job is not None and not g.job.done():
                    g.job.cancel()
                del self.groups[g.gid]
                if rule.stale_policy == "reissue" and not g.again:  # once: a task that never fits is dropped
                    self.requeue[g.source].append(g.index)
                    self._entry(g.source).stale_reissued += 1

    async def _dispatch_within(self, todo: dict[str, int]) -> None:
        """Dispatch ``todo[source]`` groups per source as the session cap allows, then drain."""
        queue = [n for n, k in todo.items() for _ in range(k)]
        while queue:
            running = sum(self.s.size(g.source) for g in self.in_flight())
            if running and running + self.s.size(queue[0]) > self.s.max_sessions:
                self.changed.clear()  # deterministic: whole rounds, so waves never depend on who ends first
                await (self._drain() if self.s.deterministic else self.changed.wait())
                continue
            self.dispatch(queue.pop(0))
        await self._drain()

    async def _sync_fill(self) -> None:
        """Seed 001: "The mixer has to buy the batch it promised": refill each source short of its
        target (by its measured acceptance), within the rounds and the dispatch cap; count the rest."""
        first = ({n: int(s.target) for n, s in self.mixer.sources.items()} if self.s.batch
                 else self.mixer.quotas())
        sent = dict(first)
        await self._dispatch_within(sent)
        cap = {n: self._cap(n) * s.target for n, s in self.mixer.sources.items()}
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
        if self.s.batch:
            self.mixer.plan_step(self.s.batch)
        self.step_finished = Counter()
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
                if self._dispatcher.done():
                    self._dispatcher.result()  # the dispatcher's error, not a wait that never ends
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
            pool = self.accepted(n)[: int(s.target)]
            taken += pool
            if self.s.mode != "sync":  # sync counts its shortfall when its refills end
                self._entry(n).groups_short += int(s.target) - len(pool)
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
        samples = [Sample(getattr(g.task, "task_id", g.gid), g.source, g.dispatch_step, g.sequences, g.signal) for g in
                   taken]
        ended, self.ended = sorted(self.ended, key=lambda e: e[0]), []
        finished, labels = [s for *_, x in ended for s in x], [n for _, n, x in ended for _ in x]
        return StepResult(rows, ledger, samples, finished, stats, [g.payload for g in taken if g.payload is not None],
                          labels)

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
                flight.append({"source": g.source, "index": g.index, "again": g.again})
        return {"mixer": self.mixer.state_dict(), "next_index": dict(self.next_index), "order": self.order,
                "waiting": waiting, "in_flight": flight, "requeue": {n: list(q) for n, q in self.requeue.items()},
                "difficulty": {n: f.state_dict() for n, f in self.difficulty.items()}}

    materialize = staticmethod(materialize)

    def load_state_dict(self, state: dict) -> None:
        """Restore; the restored open work is the next step's ``carried_in``."""
        self.mixer.load_state_dict(state.get("mixer", {}))
        self.next_index.update(state.get("next_index", {}))
        self.order = state.get("order", self.order)
        self._replay = list(state.get("waiting", []))
        self._reissue = list(state.get("in_flight", []))
        for n, q in state.get("requeue", {}).items():
            if n in self.requeue:
                self.requeue[n] = list(q)
        for n, f in state.get("difficulty", {}).items():
            if n in self.difficulty:
                self.difficulty[n].load_state_dict(f)

    def _restore_open_work(self) -> None:
        """At the first collect after a restart: replay accepted groups, reissue in-flight prompts."""
        for w in self._replay:
            g = replayed_group(w, self.tasks, self.order)
            self.order += 1
            self.groups[g.gid] = g
            self._entry(g.source).carried_in += self._open_count(g)
            self.replayed += 1
        for f in self._reissue:
            g = self.dispatch(f["source"], index=f["index"], counted=False, again=f.get("again", False))
            self._entry(g.source).carried_in += self.s.size(g.source)
            self.reissued += 1
        self._replay, self._reissue = [], []
