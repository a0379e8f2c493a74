"""The context environment: one task's system prompt and message, no tools, one reply graded by its
atomic items (``items``).

Reward: 1 when every item passes, else 0 (``reward = "all"``, the default); ``"mean"`` gives the
share of items passed. All-or-nothing by default because the negative items (no real-world answer,
no superseded rule, no other value) pass for a reply that says nothing, and a share would pay for
them. ``passed`` is every item passing, whichever the reward.
"""

from __future__ import annotations

from rlonce.core.records import Grade, Sequence
from rlonce.envs.context.items import grade_items
from rlonce.envs.context.record import ContextTask

REWARDS = ("all", "mean")


class ContextEnv:
    def __init__(self, task: ContextTask, *, reward: str = "all"):
        if reward not in REWARDS:
            raise ValueError(f"unknown context reward {reward!r}; known: {list(REWARDS)}")
        self.task, self.reward = task, reward
        self.metrics: dict[str, float] = {}

    async def setup(self) -> None:
        return None

    def system_prompt(self) -> str:
        return self.task.system

    def user_prompt(self) -> str:
        return self.task.prompt

    def tools(self) -> list[dict]:
        return []

    async def call_tool(self, name: str, arguments: dict) -> str:
        raise KeyError(name)

    async def grade(self, sequence: Sequence) -> Grade:
        return grade_reply(self.task, sequence.answer, self.reward, self.metrics)

    async def cleanup(self) -> None:
        return None


def grade_reply(task: ContextTask, reply: str | None, reward: str = "all", metrics: dict | None = None) -> Grade:
    """``reply`` graded by ``task``'s items: the reward, ``passed`` and one ``pass``/``FAIL`` line per item."""
    results = grade_items(task.items, reply or "")
    passed = sum(ok for _, ok in results)
    if metrics is not None:
        metrics.update(items_passed=float(passed), items=float(len(results)))
    every = passed == len(results) and reply is not None
    value = float(every) if reward == "all" else passed / len(results) if reply is not None else 0.0
    lines = [f"{'pass' if ok else 'FAIL'} {item.name}" for item, ok in results]
    said = "no reply" if reply is None else f"reply of {len(reply)} characters"
    return Grade(value, passed=every, transcript="\n".join([f"{task.family}/{task.kind}: {said}", *lines]))
