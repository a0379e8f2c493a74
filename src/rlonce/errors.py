"""The error family. ``RlonceError`` is the base of every error a user can act on (bad input, a
missing pack or checkpoint, a sandbox this machine cannot provide): the CLI catches this one
class and prints it as one line with exit status 2. Errors that are the model's or the
infrastructure's during a run are not raised to the user; they become a ``Status`` and a
``FailureCategory`` on the sequence, with the cause (``cause_of``) kept beside it.

An exception of ``INTERNAL_TYPES`` raised from rlonce's own code is a bug in rlonce, not an
outage: ``is_internal`` tells, and the rollout boundary records it as the failure category
``internal_error`` (counted in the ledger, and noted in ``INTERNAL_ERRORS`` so a test run that
produces one fails).
"""

from __future__ import annotations

import traceback
from pathlib import Path

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
