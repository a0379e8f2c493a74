"""Toolfind environment: a bubblewrap workspace holding the task's files, a bash tool, a grader."""

from __future__ import annotations

from rlonce.core.records import Grade, Sequence
from rlonce.envs.base import function_tool
from rlonce.envs.toolfind import verify
from rlonce.envs.toolfind.tasks import ToolfindTask
from rlonce.sandbox.bwrap import BwrapSandbox
from rlonce.sandbox.limits import Limits, command_limits

SYSTEM_PROMPT = "Answer from the files in docs/: search them with bash, then submit."

BASH_TOOL = function_tool("bash", "Run a shell command.",
                          {"command": {"type": "string"}}, ["command"])
SUBMIT_TOOL = function_tool("submit", "Submit the final answer.", {"answer": {"type": "string"}}, ["answer"])


def format_exec(exit_code: int, output: str, timed_out: bool) -> str:
    """What the agent sees of one command: its output, plus the exit code when it failed."""
    text = output.rstrip("\n")
    if timed_out:
        return (text + "\n" if text else "") + "[command timed out]"
    if exit_code != 0:
        return (text + "\n" if text else "") + f"[exit code {exit_code}]"
    return text if text else "[no output]"


BASH_USAGE = "[error: bash needs a non-empty 'command' string]"


def bash_command(arguments: dict) -> str | None:
    """The ``command`` of a bash call, or None when it is not a non-empty string (the caller
    answers ``BASH_USAGE``)."""
    command = arguments.get("command")
    return command if isinstance(command, str) and command.strip() else None


async def run_bash(sandbox, command: str) -> str:
    """Run ``command`` in ``sandbox``; what the agent sees of it (``format_exec``)."""
    r = await sandbox.exec(command)
    return format_exec(r.exit_code, r.output, r.timed_out)


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
