"""Online difficulty control: skip tasks the current policy always passes or always fails.

A group whose valid sequences all pass or all fail teaches nothing (dynamic filtering drops it
after the rollouts were paid for). For a stream that comes back to its tasks — a code pack, a
filtered reasoning set — each task's pass rates of its last ``window`` groups predict the next
one: when all of them are 0 or all are 1 the task is skipped before dispatch, and counted. A
skipped task is not excluded for good: after ``window`` skips it is dispatched again, so a
policy that changed gets measured on it again (MiniMax-M1 §4 removes such tasks offline; here
the history follows the policy). The history is plain data, checkpointed with the orchestrator.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DifficultyFilter:
    window: int
    """Groups of a task's history that decide (0: the filter is off)."""
    history: dict[str, list[float]] = field(default_factory=dict)
    """Task id → pass rates of its last ``window`` groups, oldest first."""
    skips: dict[str, int] = field(default_factory=dict)
    """Task id → skips since it was last dispatched."""

    def observe(self, task_id: str, pass_rate: float) -> None:
        """A finished group of ``task_id`` (infrastructure failures left out of ``pass_rate``)."""
        if self.window:
            h = self.history.setdefault(task_id, [])
            h.append(pass_rate)
            del h[:-self.window]

    def skip(self, task_id: str) -> bool:
        """Whether to skip ``task_id`` now: its last ``window`` groups all passed or all failed,
        and it has been skipped fewer than ``window`` times since it last ran."""
        h = self.history.get(task_id, [])
        saturated = bool(self.window) and len(h) == self.window and (all(x == 0 for x in h) or all(x == 1 for x in h))
        if not saturated or self.skips.get(task_id, 0) >= self.window:
            self.skips.pop(task_id, None)
            return False
        self.skips[task_id] = self.skips.get(task_id, 0) + 1
        return True

    def state_dict(self) -> dict:
        return {"history": {k: list(v) for k, v in self.history.items()}, "skips": dict(self.skips)}

    def load_state_dict(self, state: dict) -> None:
        self.history = {k: list(v) for k, v in state.get("history", {}).items()}
        self.skips = dict(state.get("skips", {}))
