"""The scripted expert: knows each task's look-up chain and solves every task.

Its demonstrations are imperfect on purpose. Before each look-up it may take a detour
(list the directory, print the working directory, or re-run its previous search to check
it) with probability ``detour_p``, up to ``max_detours`` in a row. Detours never make it
wrong, only slower — so under the harness's turn budget an imitation of the expert sometimes
runs out of turns, and RL has something real to improve: skip the detours.
"""

from __future__ import annotations

import random

from rlonce.envs.toolfind.tasks import ToolfindTask
from rlonce.model.chat import ChatFormat, ToolCall


def optimal_calls(task: ToolfindTask) -> list[ToolCall]:
    calls = [ToolCall("bash", {"command": f"grep -r {key} docs"}) for key, _ in task.chain]
    return calls + [ToolCall("submit", {"answer": task.answer})]


def _detour(previous: list[ToolCall], rng: random.Random) -> ToolCall:
    kind = rng.choice(("ls", "pwd", "again"))
    if kind == "again" and previous:
        return previous[-1]
    return ToolCall("bash", {"command": "pwd" if kind == "pwd" else "ls docs"})


def expert_calls(task: ToolfindTask, rng: random.Random, *, detour_p: float = 0.5,
                 max_detours: int = 2) -> list[ToolCall]:
    """The expert's tool calls for one demonstration, detours included."""
    calls: list[ToolCall] = []
    for call in optimal_calls(task)[:-1]:
        n = 0
        while n < max_detours and rng.random() < detour_p:
            calls.append(_detour(calls, rng))
            n += 1
        calls.append(call)
    return calls + [optimal_calls(task)[-1]]


def expert_turns(task: ToolfindTask, rng: random.Random, fmt: ChatFormat, *, translate=None, single_turn: bool = False,
                 **kw) -> list[str]:
    """The expert's assistant turns as text, one tool call each, ready for a scripted engine.
    ``translate`` maps its bash calls into a harness arm's own tools (``Arm.translate``)."""
    calls = expert_calls(task, rng, **kw)
    return [fmt.assistant_text("", [translate(c) if translate else c]) for c in calls]
