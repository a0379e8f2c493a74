"""Atomic binary rubric items over the final service state and the agent's answer.

Seed 000: "Tasks are evaluated with atomic, binary rubric items: code-based checks for deterministic
properties like database values and deliverable formats … Negative checks watch for unintended
changes to unrelated files". Seed 001: "A task that asks for a state change should be graded
against the state, not merely against an agent's final claim that it made the change."

An item is plain data (``Item``: a check's name and arguments) so tasks stay picklable; ``CHECKS``
maps each check to its function of a ``Final`` (initial and final databases, documents, the
answer). Four kinds: ``state`` (SQL over the final databases, documents and their formats),
``reply`` (facts the answer must hold, code-checked), ``negative`` (every table and document
unchanged but for the changes the task allows: ``unchanged``) and ``judged`` (open-ended content
a model judge checks against a criterion: ``rlonce.envs.general.judged``).
"""

from __future__ import annotations

import csv
import io
import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Item:
    name: str
    kind: str
    """'state', 'reply', 'negative' or 'judged'."""
    check: str
    args: dict = field(default_factory=dict)


@dataclass
class Final:
    init: dict[str, sqlite3.Connection]
    final: dict[str, sqlite3.Connection]
    files_init: dict[str, str]
    files_final: dict[str, str]
    answer: str


KEYS = {"messages": "id", "contacts": "id", "events": "id", "tickets": "id", "comments": "id", "entries": "id",
        "accounts": "name"}
"""Each table's row identity (what ``unchanged`` compares rows by)."""


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower()).strip()


def sql_count(f: Final, service: str, sql: str, params: list, expect: int) -> bool:
    """``sql`` (a ``select count(*)``) over the final database gives ``expect``."""
    return f.final[service].execute(sql, params).fetchone()[0] == expect


def reply_has(f: Final, needles: list[str]) -> bool:
    """The answer contains every needle (case and spacing ignored)."""
    answer = _norm(f.answer)
    return all(_norm(n) in answer for n in needles)


def document(f: Final, path: str, header: list[str] | None = None, rows: list[list[str]] | None = None,
             contains: list[str] | None = None) -> bool:
    """The document exists; a CSV one has exactly ``header`` then ``rows`` (in any order), and its
    text holds every string of ``contains``."""
    text = f.files_final.get(path)
    if text is None:
        return False
    if header is not None:
        got = [r for r in csv.reader(io.StringIO(text)) if r]
        if not got or [c.strip() for c in got[0]] != header:
            return False
        if sorted([c.strip() for c in r] for r in got[1:]) != sorted(rows or []):
            return False
    return all(_norm(c) in _norm(text) for c in contains or [])


def table_diff(a: sqlite3.Connection, b: sqlite3.Connection, table: str) -> tuple[set, set, dict]:
    """Rows of ``table`` inserted, deleted, and updated (key → changed columns) from ``a`` to ``b``."""
    key = KEYS[table]

    def load(db: sqlite3.Connection) -> dict:
        cur = db.execute(f"select * from {table}")
        cols = [d[0] for d in cur.description]
        return {r[cols.index(key)]: dict(zip(cols, r)) for r in cur.fetchall()}

    before, after = load(a), load(b)
    updated = {k: {c for c in after[k] if after[k][c] != before[k][c]} for k in before.keys() & after.keys()}
    return after.keys() - before.keys(), before.keys() - after.keys(), {k: v for k, v in updated.items() if v}


def unchanged(f: Final, allow: dict | None = None, files: list[str] | None = None) -> bool:
    """Every table of every service and every document is as it was, except what ``allow``
    permits: ``{"service.table": {"insert": n, "update": {column: [keys] or "*"}}}``, and the
    documents named in ``files`` (created or rewritten)."""
    allow = allow or {}
    for service, db in f.final.items():
        for (table,) in db.execute("select name from sqlite_master where type = 'table'").fetchall():
            rule = allow.get(f"{service}.{table}", {})
            ins, dele, upd = table_diff(f.init[service], db, table)
            if dele or len(ins) > rule.get("insert", 0):
                return False
            for k, cols in upd.items():
                ok = rule.get("update", {})
                if any(c not in ok or (ok[c] != "*" and k not in ok[c]) for c in cols):
                    return False
    touched = {p for p in f.files_init.keys() | f.files_final.keys() if f.files_init.get(p) != f.files_final.get(p)}
    return touched <= set(files or [])


CHECKS: dict[str, Callable[..., bool]] = {"sql_count": sql_count, "reply_has": reply_has, "document": document,
                                           "unchanged": unchanged}


def evaluate(items: list[Item], final: Final) -> dict[str, bool]:
    """Each code-checked item's verdict, by name (an item whose check fails to run counts as
    failed); ``judged`` items are the judge's (``rlonce.envs.general.judged``)."""
    out = {}
    for it in items:
        if it.kind == "judged":
            continue
        try:
            out[it.name] = bool(CHECKS[it.check](final, **it.args))
        except (sqlite3.Error, KeyError, ValueError, TypeError):
            out[it.name] = False
    return out
