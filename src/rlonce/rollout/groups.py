"""One group of the replay buffer: its record and states, how it is judged, and its plain-data form.

A group (one task × ``group_size`` sequences) is pending → running → finished (judged:
accepted, no-contrast-filtered or penalty-rejected) or failed (every sequence an
infrastructure failure). The orchestrator schedules groups (``rlonce.rollout.orchestrator``);
this module holds what executors and checkpoints need without it.

``Judge`` is plain data, so an executor can judge where the tokens are: a Ray harness-pool actor
(``rlonce.dist.pools``) calls it on the group it ran and returns the ``Judged`` with the rows
left in Ray's object store; after ``LocalExecutor`` the orchestrator calls the same ``Judge``.
A group is judged through step 10 of ``rlonce.algo.signal``; step 11 (the signed rebalance)
runs once per step over the batch the orchestrator takes (``Judge.batch``).

A checkpoint holds the accepted groups still waiting as plain data (``waiting_state``); a
restart replays them with their dispatch step kept (``replayed_group``), so the staleness bound
still applies to them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from rlonce.algo.signal import SignalSettings, batch_strategies, learning_signal, rebalance_batch
from rlonce.core.ledger import LedgerEntry
from rlonce.core.records import Sample, Sequence, TrainingRow, sequence_from_dict, sequence_to_dict
from rlonce.rollout.runner import split_by_arm

PENDING, RUNNING, FINISHED, FAILED = "pending", "running", "finished", "failed"


@dataclass
class Group:
    gid: str
    task: object
    source: str
    dispatch_step: int
    order: int
    """Dispatch order: oldest-first selection and a deterministic row order."""
    index: int = 0
    """The task's position in its source (what a restart reissues)."""
    again: bool = False
    """Dispatched again after its first group went stale (``reissue``): not reissued a second time."""
    state: str = PENDING
    sequences: list[Sequence] = field(default_factory=list)
    rows: list[TrainingRow] = field(default_factory=list)
    accepted: bool = False
    retained: int = 0
    """Its sequences the judge retained (an accepted group's count when a step takes it: with
    ``group_by_arm`` an arm without contrast is filtered while the group's other arms are kept)."""
    seconds: float = 0.0
    job: asyncio.Task | None = None
    payload: object | None = None
    """Where the group's full sequences and rows live when an executor kept them remote (a
    ``RemotePayload``: ``.rows`` is their count, ``.fetch()`` returns ``(sequences, rows)``)."""
    signal: dict = field(default_factory=dict)
    """``Sample.signal`` of the group's sample(s) by group id (what ``rlonce audit`` checks)."""


@dataclass
class Judged:
    """A finished group as the orchestrator books it."""

    sequences: list[Sequence]
    entry: LedgerEntry
    stats: dict[str, float]
    rows: list[TrainingRow] = field(default_factory=list)
    payload: object | None = None
    signal: dict = field(default_factory=dict)
    """Per sample judged (one, or one per arm), by group id: ``Sample.signal``."""
    grading: dict[str, float] | None = None
    """A Ray harness pool's model graders: what they and their judges counted since the pool's
    previous group (``rlonce.rollout.graded.Grading.take_counts``); None elsewhere."""


@dataclass(frozen=True)
class Judge:
    """Judges one group with ``rlonce.algo.learning_signal``; plain data, so an executor can ship it
    to where the sequences are and judge there with the same code."""

    signal: SignalSettings
    group_by_arm: bool = False

    def __call__(self, task_id: str, source: str, dispatch_step: int, seqs: list[Sequence], decode=None) -> Judged:
        sample = Sample(task_id, source, dispatch_step, seqs)
        samples = split_by_arm([sample]) if self.group_by_arm else [sample]
        rows, ledger, stats = learning_signal(samples, dispatch_step, self.signal, decode=decode, batch=False)
        signal = {x.group_id: x.signal for x in samples if x.signal}
        return Judged(seqs, ledger[source], dict(stats), rows, signal=signal)

    def batch(self, taken: list[Group]) -> tuple[list[TrainingRow], dict[str, float]]:
        """The step's local rows after the batch strategies (``rebalance_batch``) ran over all of
        them. With such a strategy configured, groups whose rows an executor kept remote are
        fetched first (the rebalance needs every row of the batch; they then reach the trainer as
        local rows); without one nothing is fetched."""
        if batch_strategies(self.signal):
            for g in taken:
                if g.payload is not None:
                    g.sequences, g.rows = g.payload.fetch()
                    g.payload = None
        rows = [r for g in taken for r in g.rows]
        return rows, rebalance_batch(rows, self.signal)


def waiting_state(g: Group) -> dict:
    """An accepted group still waiting for a step, as plain data (a remote payload kept as is)."""
    w = {"source": g.source, "index": g.index, "dispatch_step": g.dispatch_step, "seconds": g.seconds,
         "signal": g.signal, "retained": g.retained, "again": g.again}
    if g.payload is not None:  # fetched only if a checkpoint is written (``materialize``)
        w["payload"] = g.payload
    else:
        w.update(sequences=[sequence_to_dict(x) for x in g.sequences], rows=[asdict(r) for r in g.rows])
    return w


def replayed_group(w: dict, tasks: Callable[[str, int], object], order: int) -> Group:
    """The accepted group ``waiting_state`` saved, restored with its dispatch step; ``tasks`` gives
    the task of its source and index."""
    seqs = [sequence_from_dict(x) for x in w["sequences"]]
    retained = w.get("retained", sum(not s.infra_failed for s in seqs))  # checkpoints before the count
    return Group(f"{w['source']}:{w['index']}@{w['dispatch_step']}", tasks(w["source"], w["index"]),
                 w["source"], w["dispatch_step"], order, index=w["index"], again=w.get("again", False),
                 state=FINISHED, accepted=True, retained=retained, seconds=w["seconds"], sequences=seqs,
                 rows=[TrainingRow(**r) for r in w["rows"]], signal=w.get("signal", {}))


def materialize(state: dict) -> dict:
    """``state`` with every remote payload fetched into plain data (what a checkpoint stores)."""
    waiting = []
    for w in state.get("waiting", []):
        w = dict(w)
        if "payload" in w:
            seqs, rows = w.pop("payload").fetch()
            w.update(sequences=[sequence_to_dict(x) for x in seqs], rows=[asdict(r) for r in rows])
        waiting.append(w)
    return {**state, "waiting": waiting}
