"""A built domain: what a job trains on — a task stream per split and the environment built around a task.

A domain's ``DomainSpec`` (``rlonce.config.domains``: its options, needs and flags) builds one
``Domain`` for a run. The GRPO job, the evaluator and ``rlonce tasks filter`` see a domain only
through this record. Splits: ``sft`` (demonstrations), ``train`` (RL), ``heldout`` (evaluation);
each is an endless indexed stream.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from rlonce.config.domains import load_domain

SFT_TASK_OFFSET = 0
RL_TASK_OFFSET = 1_000_000
"""Where a domain with one generated stream per seed starts its RL tasks, so they differ from its SFT tasks."""


@dataclass
class Domain:
    name: str
    """Also the task source name in the mixer and the ledger."""
    env_factory: Callable
    make: Callable[[str, int], object]
    """(split, index) → task."""
    kept: list[int] | None = None
    """Train indices a difficulty filter kept; the train stream then cycles through them."""
    single_turn: bool = False
    heldout_size: int | None = None
    """Distinct held-out tasks when the held-out stream repeats (a pack); None: endless."""
    expert: Callable | None = None
    """The scripted expert: ``(task, rng, fmt, *, translate, detour_p, max_detours, single_turn)``
    → its assistant turns as text (SFT demonstrations; ``single_turn``: for the ``single-turn``
    arm, else tool calls); None when the domain has none."""
    attach: Callable | None = None
    """``(run_dir or None, judge_for) → Domain``: binds what only the run has — its directory and a
    judge (``judge_for(name)`` → (judge or None, vision-capable)) — into the env factory."""
    audit_excluded: int = 0
    """Train tasks of a pack left out because ``rlonce tasks audit`` flagged them and no one cleared
    them (``audit_flagged``)."""

    @property
    def has_expert(self) -> bool:
        return self.expert is not None

    def task(self, split: str, index: int):
        if split == "train" and self.kept is not None:
            return self.make("train", self.kept[index % len(self.kept)])
        return self.make(split, index)


class BaseCorpus(Protocol):
    """Text a small base model for a domain is pre-trained on and its tokenizer trained on
    (``DomainSpec.base_corpus``; the embedded model's domain has one: ``rlonce.recipes.pretrain``,
    ``rlonce.recipes.build_tokenizer``). ``fmt`` is the model's chat format."""

    def document(self, rng: random.Random, fmt) -> list[tuple[str, bool]]:
        """One pre-training document: text pieces, each with whether it is trained on."""

    def dialogues(self, n: int, fmt) -> Iterator[str]:
        """``n`` of the domain's tasks worked by its expert, each one chat-formatted text."""


def domain_for(task) -> Domain:
    """The domain a ``TaskConfig`` (or a ``[[sources]]`` table) names, built from its options."""
    spec = load_domain(task.name)
    domain = spec.build(task.domain_options())
    if not isinstance(domain, Domain):
        raise TypeError(f"domain {task.name!r}: build returned {type(domain).__name__}, not rlonce.envs.domains.Domain")
    return domain
