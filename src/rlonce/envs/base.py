"""The Environment contract. An environment is used once (no reset) for one sequence.

A task is data — frozen, picklable, able to travel between processes; the environment is the
behaviour built around it: a sandbox, tools, a grader.
"""

from __future__ import annotations

from typing import Protocol

from rlonce.core.records import Sequence


class GradingError(Exception):
    """Grading could not produce a verdict. Never a low reward: the sequence becomes an
    infrastructure failure of ``category`` (a ``FailureCategory`` value)."""

    category = "grader_unavailable"


class Task(Protocol):
    task_id: str
    source: str


class Environment(Protocol):
    task: Task

    async def setup(self) -> None: ...

    def tools(self) -> list[dict]: ...

    async def call_tool(self, name: str, arguments: dict) -> str: ...

    async def grade(self, sequence: Sequence) -> float: ...

    async def cleanup(self) -> None: ...


def function_tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    """A tool definition in the JSON-schema form chat templates and the OpenAI API use."""
    return {
        "name": name,
        "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required},
    }
