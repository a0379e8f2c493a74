"""The error family. ``RlonceError`` is the base of every error a user can act on (bad input, a
missing pack or checkpoint, a sandbox this machine cannot provide): the CLI catches this one
class and prints it as one line with exit status 2. Errors that are the model's or the
infrastructure's during a run are not raised to the user; they become a ``Status`` and a
``FailureCategory`` on the sequence, with the cause (``cause_of``) kept beside it.

An exception of ``INTERNAL_TYPES`` raised from rlonce's own code is a bug in rlonce, not an
outage: ``is_internal`` tells, and the rollout boundary records it as the failure category
``internal_error`` (counted in the ledger, and noted in ``INTERNAL_ERRORS`` so a test run that
produces one fails).

The rule of blame (docs/security.md, "The policy's own input"): an exception caused by what the
policy wrote — commands, paths, file contents, tool arguments, answers — is the policy's failed
attempt, scored and trained; never an infrastructure failure. ``PolicyInputError`` is how a
layer says so; ``input_problem`` is the one check every tool call and submission passes through
before anything runs (``rlonce.harness.loop``); ``blame`` is the one classification the
boundaries apply to an exception (each tool call in the harness loop, grading in
``rlonce.envs.base.grade_or_infra``).
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlonce.core.records import FailureCategory

CAUSE_CHARS = 500
INTERNAL_TYPES = (TypeError, KeyError, AttributeError, AssertionError, NameError, IndexError, UnboundLocalError)
_PACKAGE = str(Path(__file__).resolve().parent)

INTERNAL_ERRORS: list[str] = []
"""The causes of the internal errors recorded in this process (tests assert it stays empty)."""


class RlonceError(Exception):
    """Base of every user-facing error: its message is one line that says what to do."""


class UsageError(RlonceError):
    """A command-line argument or combination the user must change."""


class PackError(RlonceError, ValueError):
    """A task pack (built or filtered) is missing, unreadable or unusable."""


class PolicyInputError(ValueError):
    """What the policy wrote cannot be handled (a NUL byte in a command, a path that leaves the
    workspace, an argument over the size cap, a file the grader cannot parse): the policy's
    failed attempt, never infrastructure."""


MAX_ARGUMENT_CHARS = 100_000
"""The most characters one tool call's arguments (or one submitted answer) may hold, summed over
its strings: a command is handed to ``execve``, whose single-argument limit is 128 KiB."""


def input_problem(value, *, limit: int = MAX_ARGUMENT_CHARS) -> str | None:
    """Why ``value`` (a tool call's arguments or an answer, as decoded from the model's JSON)
    cannot be handed to a tool, or None: a NUL character, a lone surrogate (JSON's ``\\udXXX``
    escapes give Python strings no encoder accepts), or more than ``limit`` characters in all."""
    total, stack = 0, [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, str):
            total += len(v)
            if total > limit:
                return f"the arguments hold over {limit} characters"
            if "\x00" in v:
                return "an argument holds a NUL character"
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return "an argument holds a lone surrogate (not encodable text)"
    return None


POLICY = "policy"
INFRA = "infrastructure"
INTERNAL = "internal"


def blame(e: BaseException, *, infrastructure: tuple[type[BaseException], ...], tool_call: bool) -> str:
    """Whose failure ``e`` is, at a boundary whose own machinery raises ``infrastructure``:
    ``INTERNAL`` for a bug of ours (``is_internal``); ``POLICY`` for ``PolicyInputError`` and
    ``UnicodeError`` (text the policy wrote that does not decode); at a ``tool_call`` also for a
    ``ValueError``, ``ArithmeticError`` or ``RecursionError`` the tool raised on the policy's
    arguments; else ``INFRA`` (the machinery's exceptions, the host's ``OSError``, and at grading
    anything else: a grader's crash is never the policy's)."""
    if is_internal(e):
        return INTERNAL
    if isinstance(e, (PolicyInputError, UnicodeError)):
        return POLICY
    if isinstance(e, (*infrastructure, OSError)):
        return INFRA
    if tool_call and isinstance(e, (ValueError, ArithmeticError, RecursionError)):
        return POLICY
    return INFRA


def cause_of(e: BaseException) -> str:
    """``Type: message`` of ``e``, on one line, at most ``CAUSE_CHARS`` characters."""
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text if len(text) <= CAUSE_CHARS else text[: CAUSE_CHARS - 1] + "…"


def is_internal(e: BaseException) -> bool:
    """Whether ``e`` is a bug in rlonce: one of ``INTERNAL_TYPES`` raised by a frame of rlonce's
    own code (the innermost frame of the package; an error a library raises on its own is not)."""
    if not isinstance(e, INTERNAL_TYPES) or isinstance(e, RlonceError):
        return False
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if str(Path(f.filename).resolve()).startswith(_PACKAGE)]
    return bool(ours) and ours[-1] is frames[-1]


def note_internal(e: BaseException) -> str:
    """Record an internal error (see ``INTERNAL_ERRORS``) and return its cause with its location."""
    frames = traceback.extract_tb(e.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    cause = cause_of(e) + where
    INTERNAL_ERRORS.append(cause)
    return cause


class ExecutorFailure(RuntimeError):
    """A group could not be run; ``category`` says which part of the infrastructure failed."""

    def __init__(self, message: str, category: FailureCategory):
        super().__init__(message)
        self.category = category

    def __reduce__(self):  # raised in a harness pool, it reaches the driver inside a RayTaskError
        return type(self), (str(self), self.category)
