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
from typing import TYPE_CHECKING, Protocol

from rlonce.config.domains import load_domain

if TYPE_CHECKING:
    from rlonce.model.chat import ChatFormat, ToolCall

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
    expert: Expert | None = None
    """The scripted expert (``Expert``); None when the domain has none."""
    attach: Callable | None = None
    """``(run_dir or None, judge_for) → Domain``: binds what only the run has — its directory and a
    judge (``judge_for(name)`` → (a ``rlonce.envs.base.JudgeBinding`` or None, vision-capable)) —
    into the env factory."""
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


class Expert(Protocol):
    """A domain's scripted expert: one demonstration of ``task`` as the text of its assistant turns
    in the chat format ``fmt``, ready for a scripted engine (SFT demonstrations, the minimal loop).
    ``translate`` maps its tool calls into a harness arm's own tools (``Arm.translate``);
    ``detour_p`` and ``max_detours`` draw its detours from ``rng``; ``single_turn``: one reply
    without tools, for the ``single-turn`` arm. A caller may leave out any keyword (the expert's
    default holds). Built-in experts are functions, and so is an outside domain's."""

    def __call__(self, task, rng: random.Random, fmt: ChatFormat, /, *,
                 translate: Callable[[ToolCall], ToolCall] | None = None, detour_p: float = ...,
                 max_detours: int = ..., single_turn: bool = ...) -> list[str]: ...


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
