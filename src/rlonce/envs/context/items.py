"""Atomic checks of a context-following reply: each constraint of a task is one item, checked by code.

An item is plain data (``Item``: a check's name and its arguments) so a task stays picklable;
``CHECKS`` maps each check to a pure function of the reply text. ``grade_items`` runs a task's
items and says which passed. Positive items state what the reply must do (hold the value, cite
the passage, obey the format); negative items (``kind = "negative"``) fail the shortcut a policy
could take instead: the real-world answer from memory, the superseded rule, a distractor value,
another record of the listing.

Matching is forgiving where the task states no constraint and strict where it does: whitespace
and case are ignored when looking for a value (``holds``), a citation may stand anywhere and be
written ``[p3]`` or ``[ P3 ]``, a JSON object may be wrapped in a Markdown fence, bullets may be
``-``, ``*`` or ``•``. A value is matched as a whole token: ``31`` is not found in ``1431`` or
``C31``. Every check is linear in the reply's length (a megabyte reply is graded like a short one)
and never raises on what the policy wrote.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

BULLET = re.compile(r"^(?:[-*\u2022])\s+\S")
CITATION = re.compile(r"\[\s*p\s*(\d{1,4})\s*\]", re.IGNORECASE)


@dataclass(frozen=True)
class Item:
    name: str
    """What it checks, in words (one transcript line)."""
    check: str
    """A key of ``CHECKS``."""
    args: dict = field(default_factory=dict)
    kind: str = "positive"
    """'positive' (what the reply must do) or 'negative' (a shortcut it must not take)."""


def norm(text: str) -> str:
    """``text`` case-folded with every run of whitespace one space."""
    return " ".join(text.split()).casefold()


def _tokens(values: list[str]) -> re.Pattern:
    """Any of ``values`` as a whole token of normalised text."""
    return _compiled(tuple(values))


@functools.lru_cache(maxsize=4096)
def _compiled(values: tuple[str, ...]) -> re.Pattern:
    alternatives = "|".join(re.escape(norm(v)) for v in sorted(values, key=len, reverse=True) if norm(v))
    return re.compile(r"(?<![0-9a-z])(?:" + (alternatives or r"(?!)") + r")(?![0-9a-z])")


def holds(reply: str, value: str) -> bool:
    """The reply holds ``value`` as a whole token (case and whitespace ignored)."""
    return bool(norm(value)) and _tokens([value]).search(norm(reply)) is not None


def lacks(reply: str, values: list[str]) -> bool:
    """The reply holds none of ``values``."""
    return _tokens(values).search(norm(reply)) is None


def only_ids(reply: str, pattern: str, allowed: list[str]) -> bool:
    """Every identifier of the form ``pattern`` in the reply is one of ``allowed``."""
    found = {m.casefold() for m in re.findall(pattern, reply, flags=re.IGNORECASE)}
    return found <= {a.casefold() for a in allowed}


def cites(reply: str, passage: int) -> bool:
    """The reply cites passage ``passage`` and no other."""
    return {int(n) for n in CITATION.findall(reply)} == {passage}


def json_object(reply: str) -> dict | None:
    """The reply as one JSON object (a Markdown code fence around it allowed), or None."""
    text = reply.strip()
    if text.startswith("```"):
        text = text.removeprefix("```")
        text = text[text.find("\n") + 1:] if "\n" in text else ""
        text = text.rstrip().removesuffix("```")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def json_keys(reply: str, keys: list[str]) -> bool:
    """The reply is a JSON object with exactly ``keys``."""
    obj = json_object(reply)
    return obj is not None and set(obj) == set(keys)


def json_value(reply: str, key: str, value: str) -> bool:
    """The reply is a JSON object whose ``key`` holds ``value`` (a string or a number; case and
    whitespace ignored)."""
    obj = json_object(reply)
    got = None if obj is None else obj.get(key)
    return isinstance(got, (str, int, float)) and not isinstance(got, bool) and norm(str(got)) == norm(value)


def bullets(reply: str, n: int) -> bool:
    """Every non-empty line is a bullet, and there are exactly ``n`` (at least one)."""
    lines = [line.strip() for line in reply.splitlines() if line.strip()]
    return len(lines) == n > 0 and all(BULLET.match(line) for line in lines)


def max_words(reply: str, n: int) -> bool:
    """At most ``n`` words (runs of non-space) and at least one."""
    return 0 < len(reply.split()) <= n


def upper(reply: str) -> bool:
    """Every cased letter is upper case, and there is one."""
    return reply.isupper()


def lower(reply: str) -> bool:
    """Every cased letter is lower case, and there is one."""
    return reply.islower()


def no_words(reply: str, words: list[str]) -> bool:
    """None of ``words`` as a word (case ignored; inside a longer word does not count)."""
    text = reply.casefold()
    return not any(re.search(r"(?<![a-z])" + re.escape(w.casefold()) + r"(?![a-z])", text) for w in words)


def starts_with(reply: str, text: str) -> bool:
    """The reply begins with ``text`` (case and whitespace ignored)."""
    return norm(reply).startswith(norm(text))


def ends_with(reply: str, text: str) -> bool:
    """The reply ends with ``text`` (case and whitespace ignored; a final full stop allowed)."""
    return norm(reply).removesuffix(".").endswith(norm(text).removesuffix("."))


def negated(reply: str, check: str, args: dict) -> bool:
    """The reply fails the check ``check`` with ``args`` (a superseded rule not obeyed)."""
    return not CHECKS[check](reply, **args)


CHECKS: dict[str, Callable[..., bool]] = {
    "holds": holds, "negated": negated, "lacks": lacks, "only_ids": only_ids, "cites": cites, "json_keys": json_keys,
    "json_value": json_value, "bullets": bullets, "max_words": max_words, "upper": upper,
    "lower": lower, "no_words": no_words,
    "starts_with": starts_with, "ends_with": ends_with,
}


def passes(item: Item, reply: str) -> bool:
    return CHECKS[item.check](reply, **item.args)


def grade_items(items, reply: str) -> list[tuple[Item, bool]]:
    """Each item of ``items`` with whether ``reply`` passes it."""
    return [(item, passes(item, reply)) for item in items]
