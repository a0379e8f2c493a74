"""Reasoning environment: one question, one reply, a rule-based grader. No sandbox, no tools."""

from __future__ import annotations

from rlonce.core.records import Grade, Sequence
from rlonce.envs.reasoning import verify
from rlonce.envs.reasoning.tasks import ReasoningTask

SYSTEM_PROMPT = "Solve the problem. Think briefly, then give the final answer inside <answer></answer>."


class ReasoningEnv:
    def __init__(self, task: ReasoningTask, *, format_weight: float = 0.1, system_prompt: str = SYSTEM_PROMPT):
        self.task = task
        self.format_weight = format_weight
        self._system = system_prompt
        self.metrics: dict[str, float] = {}

    async def setup(self) -> None:
        return None

    def system_prompt(self) -> str:
        return self._system

    def user_prompt(self) -> str:
        return self.task.question

    def tools(self) -> list[dict]:
        return []

    async def call_tool(self, name: str, arguments: dict) -> str:
        raise KeyError(name)

    async def grade(self, sequence: Sequence) -> Grade:
        r, parts = verify.reward(self.task, sequence.answer or "", self.format_weight)
        self.metrics.update(parts)
        answer, tagged = verify.extract(sequence.answer or "")
        said = "no answer found" if answer is None else f"answer {answer[:200]!r}" + (
            " inside <answer> tags" if tagged else " (no <answer> tags)")
        return Grade(r, passed=parts["correct"] >= 1.0,  # the format bonus is reward, not a pass
                     transcript=f"{said}; gold {self.task.answer!r}; the generator's scorer: correctness "
                                f"{parts['correct']:g}, format {parts['format_ok']:g}; reward {r:g}")

    async def cleanup(self) -> None:
        return None
