"""What a context task is — ``ContextTask``, the ``Rule`` a rules task states — and the helpers
every family builds its context with: ``grow`` adds filler up to the length tier, ``fresh`` draws
values the context does not hold yet, ``conversation`` quotes earlier turns in one message.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from rlonce.envs.context.items import Item

LENGTHS = {"short": 1000, "medium": 3200, "long": 12000}
"""Tier → the most characters of system prompt + user message (a piece that must be there may pass it)."""


@dataclass(frozen=True)
class Rule:
    kind: str
    """json, bullets, max_words, upper, lower, forbid, prefix or signoff."""
    text: str
    """The rule as the conversation states it."""
    arg: object = None
    """json: (name key, name, value key); bullets: the lines ('{}' for the value); max_words: the
    limit; forbid: the words; prefix, signoff: the text."""


@dataclass(frozen=True)
class ContextTask:
    task_id: str
    family: str
    kind: str
    """The family's variant (a rule set, a changed rule, the fact asked, the distractor's kind)."""
    system: str
    prompt: str
    answer: str
    """The value the reply must give."""
    sentence: str
    """The answer as a sentence, '{}' for the value (the expert's reply where no rule shapes it)."""
    short: str
    """The same at its briefest, for a word limit or forbidden words."""
    items: tuple[Item, ...]
    rules: tuple[Rule, ...] = ()
    """The rules in force at the question (rules family)."""
    first_rules: tuple[Rule, ...] = ()
    """The rules the conversation began with, when one was changed since; () when none was."""
    memory: str = ""
    """The real-world answer a model gives from memory (document family)."""
    distractor: str = ""
    """A value the context holds for something else: another note, person, passage or line."""
    decoy: str = ""
    """A wrong value of the answer's kind that the context does not hold."""
    source: str = "context"


def grow(base: int, budget: int, make: Callable[[], str], minimum: int, overhead: int = 1) -> list[str]:
    """Pieces from ``make`` while ``base`` characters plus theirs (``overhead`` more each: a
    separator, a label) stay within ``budget``; at least ``minimum``. ``make`` is called once more
    than the pieces returned (the piece that did not fit)."""
    pieces: list[str] = []
    size = base
    while True:
        piece = make()
        if len(pieces) >= minimum and size + len(piece) + overhead > budget:
            return pieces
        pieces.append(piece)
        size += len(piece) + overhead


def fresh(rng: random.Random, draw: Callable[[random.Random], str], used: set[str]) -> str:
    """A draw not in ``used`` (added to it)."""
    for _ in range(100_000):
        if (value := draw(rng)) not in used:
            used.add(value)
            return value
    raise RuntimeError(f"no fresh value after 100000 draws ({len(used)} used)")


def conversation(turns: list[str], question: str) -> str:
    return "Conversation so far:\n\n" + "\n\n".join(turns) + f"\n\nThe user's new message: {question}"
