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

Every content claim is code-checked, so a run with no judge grades it too (a judged item adds a
model's reading on top, never replaces the code item):

- ``states_amount``: a text (the answer, or a message read from the final state) states one
  value: every number in it, read as an amount, equals the expected value — a constant, or SQL
  over the final state (the balance the reply describes) — and there is at least one. Dates,
  clock times, identifiers (``INV-12345``, ``R-1000``, ``#12``, ``Q1``) and ordinals are not
  amounts; grouped digits (``-1,234.50``), a currency sign or code, ``1234.5`` and the Unicode
  minus are read. A sentence that holds the amount must not hold a word of ``DENIALS`` (a
  negation, a hedge: "NOT -1234.50", "about -1234.50", "-1234.50 is wrong") nor name another
  account (``rivals``). Strict on purpose: a reply that also mentions "2 questions" or says
  "I can't see a change: the balance is X" fails.
- ``address_set``: the one row selected holds exactly the expected addresses (comma-separated,
  case ignored): no superset, no subset, no second message.
- ``says_cancelled``: the one message selected names the event's title, states the cancellation
  (``CANCELLED``: "cancelled", "called off", "will not take place", "is off", …) and holds none of
  ``CONTRARY`` ("not cancelled", "moved", "postponed", "rescheduled", "see you there", "still on",
  "going ahead", "just kidding", a closing "not!", …; "cancelled, not moved" is fine). A correct
  email that also says "see you at the next one" or "we found no new slot" fails; a model judge
  reads such wording, this vocabulary does not.
"""

from __future__ import annotations

import csv
import io
import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation


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


MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?"
NOT_AMOUNTS = re.compile("|".join((
    r"\b\d{4}-\d{2}-\d{2}(?:[t ]\d{1,2}:\d{2}(?::\d{2})?)?\b",                     # ISO dates, date-times
    r"\b\d{1,2}:\d{2}(?::\d{2})?\b",                                                # clock times
    rf"\b{MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?\b",                     # March 16, 2026
    rf"\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{MONTH}(?:\s+\d{{4}})?",                # 16 March 2026
    r"(?<![\w.])(?!(?:eur|usd|gbp)-?\d)[a-z_]\w*-?\d[\w-]*|#\d+",                     # INV-12345, R-1000, Q1, #12
    r"\b\d+(?:st|nd|rd|th)\b",                                                        # ordinals
)))
AMOUNT = re.compile(r"(?<![\w.])(?P<sign>[-\u2212])?(?:[$\u20ac\u00a3]|(?:eur|usd|gbp)\s?)?(?P<sign2>[-\u2212])?"
                    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(?![\d])")
DENIALS = re.compile(
    r"\b(?:not|never|no longer|neither|nor|none|wrong|incorrect|false|untrue|inaccurate|outdated|previously|"
    r"formerly|used to|other than|rather than|instead of|except|excluding|approximately|approx|roughly|around|"
    r"nearly|almost|more than|less than|at least|at most|up to|or so|maybe|perhaps|possibly|probably|might|"
    r"guess|i think|i believe|seems|appears|estimated?)\b|\babout\s*[-\u2212$\u20ac\u00a3]?\s*\d|n[\'\u2019]t\b|"
    r"[~\u2248]")
"""Words that deny or hedge the value of the sentence they share with it."""
SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|\n+")


def amounts(text: str) -> list[tuple[int | None, str]]:
    """Each number of ``text`` read as an amount: (cents, or None when not whole cents; the
    sentence it stands in), dates, times, identifiers and ordinals left out."""
    out = []
    for sentence in SENTENCE_END.split(text.lower()):
        for m in AMOUNT.finditer(NOT_AMOUNTS.sub(" ", sentence)):
            try:
                value = Decimal(m["num"].replace(",", "")) * 100
            except InvalidOperation:
                continue
            sign = -1 if m["sign"] or m["sign2"] else 1
            out.append((sign * int(value) if value == value.to_integral_value() else None, sentence))
    return out


def _value(f: Final, spec) -> int | list:
    """A constant, or what SQL over the final state selects: ``{"service", "sql", "params"}``."""
    if isinstance(spec, dict):
        rows = f.final[spec["service"]].execute(spec["sql"], spec.get("params", [])).fetchall()
        return [c for r in rows for c in r]
    return spec


def _one_text(f: Final, spec) -> str | None:
    """The answer (``spec`` None), or the one row SQL selects from the final state, joined (None
    when it selects no row or several)."""
    if spec is None:
        return f.answer
    rows = f.final[spec["service"]].execute(spec["sql"], spec.get("params", [])).fetchall()
    return "\n".join(str(c) for c in rows[0]) if len(rows) == 1 else None


def states_amount(f: Final, value, text: dict | None = None, rivals=None, either_sign: bool = False) -> bool:
    """``text`` (the answer when None) states the one amount ``value`` (cents, or SQL over the final
    state selecting it), undenied, beside no rival name (a list, or SQL selecting them)."""
    body = _one_text(f, text)
    want = _value(f, value)
    if isinstance(want, list):
        if len(want) != 1 or not isinstance(want[0], int):
            return False
        want = want[0]
    found = amounts(body or "")
    if not found:
        return False
    names = [str(n).lower() for n in _value(f, rivals or [])]
    for cents, sentence in found:
        if cents is None or (abs(cents) != abs(want) if either_sign else cents != want):
            return False
        if DENIALS.search(sentence) or any(re.search(rf"\b{re.escape(n)}\b", sentence) for n in names):
            return False
    return True


def address_set(f: Final, service: str, sql: str, params: list, addresses: list[str]) -> bool:
    """``sql`` selects one row, whose one column holds exactly ``addresses`` (comma-separated, case
    and spacing ignored)."""
    rows = f.final[service].execute(sql, params).fetchall()
    if len(rows) != 1:
        return False
    got = {a.strip().lower() for a in str(rows[0][0] or "").split(",") if a.strip()}
    return got == {a.strip().lower() for a in addresses}


CANCELLED = re.compile(
    r"\bcancel\w*|\bcall(?:s|ed|ing)? (?:it |this |the \w+ )?off\b|"
    r"\b(?:will not|won't|won\u2019t|not|no longer) (?:be )?(?:take place|taking place|happen|happening|go ahead|"
    r"going ahead|held)\b|\b(?:is|it's|it\u2019s) off\b|\bscrapped\b")
"""How an email states the cancellation (each match is replaced by ``MARK`` before ``CONTRARY``)."""
MARK = "cancelmark"
CONTRARY = re.compile(
    rf"(?:\bnot|n't|\bnever|\bno longer)\s+(?:\w+\s+){{0,2}}?{MARK}|\bun-?{MARK}|\bnot\s*[.!?]|\breinstat\w*|"
    r"\bback on\b|\bstill (?:on|happening|taking place|going ahead|scheduled|planned|held)\b|"
    r"\b(?:goes|going|go|went) ahead\b|\bwill (?:still )?(?:take place|happen|go ahead|be held)\b|\bproceed\w*|"
    r"\bas (?:planned|scheduled|usual|normal)\b|\bsee you (?:there|then|at|in|on|tomorrow|soon)\b|"
    r"\blooking forward\b|(?<!not )\b(?:mov(?:e|ed|es|ing)|reschedul\w*|postpon\w*|delay\w*)|"
    r"\bpushed (?:back|out|to)\b|\bon hold\b|\bnew (?:time|date|slot|room|day)\b|\bkidding\b|\bjoke\b|"
    r"\bignore (?:this|that|my|the)\b|\bdisregard\b")
"""What contradicts or takes back the cancellation."""


def says_cancelled(f: Final, service: str, sql: str, params: list, title: str) -> bool:
    """``sql`` selects one message (its text), which names ``title``, states the cancellation and
    holds nothing contrary."""
    text = _one_text(f, {"service": service, "sql": sql, "params": params})
    if text is None:
        return False
    text = _norm(text).replace("\u2019", "'")
    if _norm(title) not in text:
        return False
    marked = CANCELLED.sub(MARK, text)
    return MARK in marked and not CONTRARY.search(marked)


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


CHECKS: dict[str, Callable[..., bool]] = {"sql_count": sql_count, "document": document, "unchanged": unchanged,
                                           "states_amount": states_amount, "address_set": address_set,
                                           "says_cancelled": says_cancelled}


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
