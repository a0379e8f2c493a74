"""Fault injection for the crash-consistency suite (``make test-faults``, docs/faults.md).

``RLONCE_FAULTS`` names places in the run and what happens there, comma-separated:

    point[:n]            SIGKILL this process the n-th time it reaches ``point`` (default 1):
                         no clean-up, no final checkpoint, as a power cut or the OOM killer would
    point:raise@p        at ``point``, raise that layer's own infrastructure error with probability
                         p (a seeded draw, so a run fails the same calls each time): a grader that
                         dies, an engine that crashes, a storm of sandbox failures

A point is a call ``faults.point("name")`` in the code path it names (``POINTS`` lists them).
Unset, ``point`` costs one dictionary lookup. Nothing in a normal run sets the variable.
"""

from __future__ import annotations

import os
import random
import signal

from rlonce.errors import UsageError

POINTS = {
    "sft.batch": "an SFT optimizer step (SFT is redone from the start: it has no checkpoint of its own)",
    "checkpoint.weights": "a checkpoint's weights are written, its trainer state is not",
    "checkpoint.rename": "a checkpoint is complete in its temporary folder, not yet renamed into place",
    "checkpoint.prune": "a checkpoint is in place, the older ones not yet pruned",
    "eval.sequence": "an evaluation sequence has ended (baseline, during the run or final)",
    "rollout.group": "an RL group's sequences have ended and been graded, the group's own grading not yet",
    "grade": "a sequence is about to be graded",
    "train.step": "the trainer has stepped, the new weights are not yet published",
    "publish": "the engine is paused for new weights, which are not loaded yet",
    "record.ledger": "the step's ledger is written, its metrics record and rollouts are not",
    "record.rollouts": "the step's rollout columns are written, its .json (which makes the step stored) is not",
    "summary": "the run's last checkpoint is written, summary.json is not",
    "sandbox.exec": "(raise) a sandbox command is about to run: SandboxError",
    "engine.wave": "(raise) the engine is about to run a wave: EngineError",
    "engine.compile": "(raise) the engine is about to move a lone row into a static cache and run it "
                      "compiled: EngineError (it then decodes eagerly)",
}

_plan: dict[str, tuple] | None = None
_hits: dict[str, int] = {}


def _parse(text: str) -> dict[str, tuple]:
    plan = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, arg = item.partition(":")
        if name not in POINTS:
            raise UsageError(f"RLONCE_FAULTS: unknown fault point {name!r}; known: {', '.join(POINTS)}")
        if arg.startswith("raise@"):
            try:
                p = float(arg.removeprefix("raise@"))
            except ValueError:
                p = -1.0
            if not 0 < p <= 1:
                raise UsageError(f"RLONCE_FAULTS: {item!r}: write point:raise@P with 0 < P <= 1")
            plan[name] = ("raise", p, random.Random(f"{name}:{p}"))
        elif arg == "" or arg.isdigit() and int(arg) >= 1:
            plan[name] = ("kill", int(arg or 1))
        else:
            raise UsageError(f"RLONCE_FAULTS: {item!r}: write point, point:N (N >= 1) or point:raise@P")
    return plan


def check() -> dict[str, tuple]:
    """Read ``RLONCE_FAULTS`` (once per process); a bad one is a ``UsageError`` naming the item."""
    global _plan
    if _plan is None:
        _plan = _parse(os.environ.get("RLONCE_FAULTS", ""))
    return _plan


def point(name: str, error: type[BaseException] | None = None) -> None:
    """The run reaches fault point ``name``; ``error``: what a ``raise`` fault raises here."""
    what = (_plan if _plan is not None else check()).get(name)
    if what is None:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if what[0] == "kill" and _hits[name] == what[1]:
        os.kill(os.getpid(), signal.SIGKILL)
    if what[0] == "raise" and error is not None and what[2].random() < what[1]:
        raise error(f"injected fault at {name} (RLONCE_FAULTS)")
