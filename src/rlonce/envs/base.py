"""The Environment contract. An environment is used once (no reset) for one sequence.

A task is data — frozen, picklable, able to travel between processes; the environment is the
behaviour built around it: a sandbox, tools, a grader.
"""

from __future__ import annotations

from typing import Protocol

from rlonce.core.records import FailureCategory, Sequence, Status
from rlonce.errors import cause_of, is_internal, note_internal


class GradingError(Exception):
    """Grading could not produce a verdict. Never a low reward: the sequence becomes an
    infrastructure failure of ``category``."""

    category: FailureCategory = FailureCategory.GRADER_UNAVAILABLE


async def grade_or_infra(env, seq: Sequence) -> float | None:
    """``env.grade(seq)``; a grader that cannot give a verdict makes ``seq`` an infrastructure
    failure (its category from ``GradingError``) and the reward ``None`` — never a low score."""
    try:
        return await env.grade(seq)
    except GradingError as e:
        seq.status, seq.failure, seq.cause = Status.INFRA, e.category, cause_of(e)
    except Exception as e:  # noqa: BLE001 - a grader outage is not the model's failure
        seq.status, seq.failure, seq.cause = Status.INFRA, *infra_failure(e, FailureCategory.GRADER_UNAVAILABLE)
    return None


def infra_failure(e: BaseException, category: FailureCategory) -> tuple[FailureCategory, str]:
    """The failure category and cause for ``e``: ``internal_error`` when ``e`` is a bug in
    rlonce (noted for the test suite), else ``category``."""
    if is_internal(e):
        return FailureCategory.INTERNAL_ERROR, note_internal(e)
    return category, cause_of(e)


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
