"""Toolfind environment: a bubblewrap workspace holding the task's files, the shared bash and submit tools
(``rlonce.envs.workspace``), a grader."""

from __future__ import annotations

from rlonce.core.records import Grade, Sequence
from rlonce.envs.toolfind import verify
from rlonce.envs.toolfind.tasks import ToolfindTask
from rlonce.envs.workspace import BASH_TOOL, BASH_USAGE, SUBMIT_TOOL, bash_command, run_bash
from rlonce.sandbox.bwrap import BwrapSandbox
from rlonce.sandbox.limits import Limits, command_limits

SYSTEM_PROMPT = "Answer from the files in docs/: search them with bash, then submit."

COMMAND_LIMITS = command_limits(5, output_bytes=8192)
"""One bash command's limits (``command_limits``: a 60 s wall clock beside the 5 s CPU limit)."""


class ToolfindEnv:
    def __init__(self, task: ToolfindTask, limits: Limits | None = None):
        self.task = task
        self.limits = limits or COMMAND_LIMITS
        self.sandbox: BwrapSandbox | None = None
        self.metrics: dict[str, float] = {}

    async def setup(self) -> None:
        self.sandbox = BwrapSandbox(self.limits)
        for path, content in self.task.files:
            self.sandbox.put_file(path, content)

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def user_prompt(self) -> str:
        return self.task.question

    def tools(self) -> list[dict]:
        return [BASH_TOOL, SUBMIT_TOOL]

    async def call_tool(self, name: str, arguments: dict) -> str:
        if name != "bash":
            raise KeyError(name)
        command = bash_command(arguments)
        if command is None:
            return BASH_USAGE
        assert self.sandbox is not None, "setup() was not called"
        return await run_bash(self.sandbox, command)

    async def grade(self, sequence: Sequence) -> Grade:
        r = verify.score(self.task.answer, sequence.answer)
        said = "no answer submitted" if sequence.answer is None else f"submitted {sequence.answer[:200]!r}"
        return Grade(r, passed=r >= 1.0, transcript=f"{said}; expected {self.task.answer!r} (normalised match): "
                                                    f"{'correct' if r >= 1.0 else 'wrong'}")

    async def cleanup(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
