"""The orchestrator's settings and records: what it is told (``OrchestratorSettings``, per
source ``SourceRules``), what runs a group (``Executor``) and what a step hands the trainer
(``StepResult``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from rlonce.core.ledger import LedgerEntry
from rlonce.core.records import Sample, Sequence, TrainingRow
from rlonce.rollout.groups import Group, Judged


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
    finished_sources: list[str] = field(default_factory=list)
    """The source of each of ``finished``."""

    @property
    def row_count(self) -> int:
        return len(self.rows) + sum(p.rows for p in self.payloads)


@dataclass(frozen=True)
class SourceRules:
    """What the orchestrator keeps per source (``[[sources]]``)."""

    staleness: int
    stale_policy: str = "drop"
    """'drop': a stale group and its task are gone; 'reissue': the task is dispatched again."""
    difficulty_window: int = 0
    """``DifficultyFilter.window`` (0: every task is dispatched)."""
    dispatch_cap: float | None = None
    """This source's ``OrchestratorSettings.dispatch_cap`` (None: the run's)."""
    group_size: int | None = None
    """Sequences of each of this source's groups (None: the run's ``group_size``)."""


MAX_SKIPS = 64
"""Most tasks the difficulty filter skips in a row for one dispatch (then the next one runs)."""


@dataclass(kw_only=True)
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
    """Async admission: the most predicted KV tokens in flight, each running group counting its
    source's mean context tokens × group size (``rollout.kv_budget``; inf: no budget)."""
    group_by_arm: bool = False
    """Judge each group's siblings per harness arm (``split_by_arm``)."""
    batch: int | None = None
    """Groups per step over all sources, split each step by the mixer's shares (None: each
    source's ``target`` stays as given)."""
    deterministic: bool = False
    """Sync: the mixer measures a group's duration in context tokens, not seconds, and a capped
    dispatch waits for whole rounds (``runtime.deterministic``)."""
    rules: dict[str, SourceRules] = field(default_factory=dict)
    """Per-source staleness, stale policy and difficulty filter (default: ``staleness``, drop, off)."""

    def rule(self, source: str) -> SourceRules:
        return self.rules.get(source) or SourceRules(self.staleness)

    def size(self, source: str) -> int:
        """Sequences of one group of ``source`` (its own ``group_size``, else the run's)."""
        return self.rule(source).group_size or self.group_size
