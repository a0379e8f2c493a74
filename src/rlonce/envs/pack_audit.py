"""What the offline grading tools need of a domain's task packs: the contract a domain fills to have
its packs audited (``rlonce tasks audit``) and rubrics written for them (``rlonce grade
synthesize-rubrics``).

The tools themselves (``rlonce.recipes.task_audit``, ``rlonce.recipes.rubric_synthesis``) are the
same for every domain: real attempts in the domain's own environment, graded by its own grader,
then a judge (``rlonce.grading.judge``) reading them. What differs is here: which tasks a pack
holds, the environment an attempt runs in, the scripted agents that make the attempts, and what
a judge reads of a task. A domain gives one ``PackAudit`` through its spec (the code domain's:
``rlonce.envs.code.pack_audit``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

Call = tuple[str, dict]
"""A tool call: the tool's name and its arguments."""
Agent = tuple[str, Callable[[Any], list[Call]]]
"""A scripted agent: its name and the tool calls it makes on a task."""


@dataclass(frozen=True)
class Brief:
    """What a judge reads of a pack task besides the attempts."""

    statement: str
    """The task as the agent was given it."""
    tests: str
    """The hidden tests, as the auditor reads them in its prompt."""
    test_files: dict[str, str]
    """The hidden test files, path → text, laid out in an agentic judge's workspace."""
    reference: str
    """The reference solution, as a unified diff."""


class PackAudit(Protocol):
    """A domain's part in auditing its packs and writing rubrics for them."""

    audit_agents: tuple[Agent, ...]
    """The attempts an audit makes at every task, in order. A sound task passes the first two
    (correct solutions) and fails the others (doing nothing, a known hack)."""

    def tasks(self, pack: Path) -> list:
        """The pack's validated tasks (``PackError``, one line, when it holds none it can read)."""

    def env(self, task):
        """A fresh environment (``rlonce.envs.base.Environment``) for one attempt at ``task``,
        graded in full: an attempt that changes nothing is run, not trusted to fail."""

    def rollout_agents(self, k: int) -> list[Agent]:
        """The ``k`` attempts a rubric writer reads: passing ones that differ in how they work, then
        (for ``k`` > 1) one flawed attempt that does not pass."""

    def brief(self, task) -> Brief:
        """What a judge reads of ``task``."""

    def repository(self, task) -> str:
        """The task's starting state as the rubric writer reads it (a listing, the code at the bug)."""
