"""The scripted general-tool-use expert: the task's reference plan, with controlled detours and
occasional recoverable errors, for SFT demonstrations.

Before each planned call it may take a detour with probability ``detour_p`` (at most
``max_detours`` in a row): a harmless read of a service the task uses (listing messages,
accounts, tickets, documents or the day's events), or a look at its scratch space. With
probability ``error_p`` a planned call goes out once with a mistake the service refuses — an id
that does not exist, a date in the wrong format — before the right call: the demonstration then
shows reading an error and recovering. Detours and errors never change state, so the expert's
attempts still pass every rubric item.
"""

from __future__ import annotations

import random

from rlonce.envs.general.tasks import GeneralTask
from rlonce.model.chat import ChatFormat, ToolCall

READS = {"mail": ("mail__list_messages", {}), "ledger": ("ledger__list_accounts", {}),
         "tickets": ("tickets__list_tickets", {}), "files": ("files__list_files", {}),
         "calendar": ("calendar__list_events", {"start_date": "2026-03-16", "end_date": "2026-03-20"})}


def _call(name: str, args: dict) -> ToolCall:
    return ToolCall(f"mcp__{name}", dict(args))


def _mistake(name: str, args: dict) -> dict | None:
    """``args`` with one mistake the service refuses, or None when the call has no such field."""
    if "id" in args:
        return {**args, "id": 9999}
    for key in ("date", "start", "start_date"):
        if key in args and isinstance(args[key], str) and len(args[key]) >= 10:
            y, m, d = args[key][:10].split("-")
            return {**args, key: f"{d}/{m}/{y}{args[key][10:]}"}
    return None


def expert_calls(task: GeneralTask, rng: random.Random, *, detour_p: float = 0.3, max_detours: int = 2,
                 error_p: float = 0.15) -> list[ToolCall]:
    calls: list[ToolCall] = []
    for name, args in task.plan:
        for _ in range(max_detours):
            if rng.random() >= detour_p:
                break
            if rng.random() < 0.2:
                calls.append(ToolCall("bash", {"command": rng.choice(("ls", "cat README.txt"))}))
            else:
                calls.append(_call(*READS[rng.choice(task.services)]))
        wrong = _mistake(name, args) if rng.random() < error_p else None
        if wrong is not None:
            calls.append(_call(name, wrong))
        calls.append(_call(name, args))
    calls.append(ToolCall("submit", {"answer": task.answer}))
    return calls


def expert_turns(task: GeneralTask, rng: random.Random, fmt: ChatFormat, *, translate=None, single_turn: bool = False,
                 **kw) -> list[str]:
    """The expert's assistant turns as text, one tool call each (``translate``: into an arm's tools)."""
    return [fmt.assistant_text("", [translate(c) if translate else c]) for c in expert_calls(task, rng, **kw)]
