"""The bash workspace every tool-using environment shares: the ``bash`` and ``submit`` tools, and
what the agent sees of one command.

A domain whose agent works in a sandbox (toolfind, code, cyber, music, general, visual, and the
agentic grader's workspace) offers ``BASH_TOOL``; its ``call_tool`` takes the command with
``bash_command``, answers ``BASH_USAGE`` when there is none, and otherwise returns ``run_bash``.
Keeping these in one place keeps one observation format across domains, so a policy trained on
one reads another's command output the same way: the output, with ``[exit code N]`` when the
command failed, ``[command timed out]`` past its limit, ``[no output]`` when it printed nothing.

A domain keeps its own ``submit`` where its answer is not plain text (a file path, a page);
``SUBMIT_TOOL`` is the plain-text one. Limits are each domain's (``rlonce.sandbox.limits``), and
so is the sandbox: this module only runs a command in the sandbox it is given and protects
against nothing by itself.
"""

from __future__ import annotations

from rlonce.envs.base import function_tool
from rlonce.sandbox.base import Sandbox

BASH_TOOL = function_tool("bash", "Run a shell command.", {"command": {"type": "string"}}, ["command"])
SUBMIT_TOOL = function_tool("submit", "Submit the final answer.", {"answer": {"type": "string"}}, ["answer"])
BASH_USAGE = "[error: bash needs a non-empty 'command' string]"
"""The answer to a bash call without a usable command."""


def format_exec(exit_code: int, output: str, timed_out: bool) -> str:
    """What the agent sees of one command: its output, plus the exit code when it failed."""
    text = output.rstrip("\n")
    if timed_out:
        return (text + "\n" if text else "") + "[command timed out]"
    if exit_code != 0:
        return (text + "\n" if text else "") + f"[exit code {exit_code}]"
    return text if text else "[no output]"


def bash_command(arguments: dict) -> str | None:
    """The ``command`` of a bash call, or None when it is not a non-empty string (the caller
    answers ``BASH_USAGE``)."""
    command = arguments.get("command")
    return command if isinstance(command, str) and command.strip() else None


async def run_bash(sandbox: Sandbox, command: str) -> str:
    """Run ``command`` in ``sandbox``; what the agent sees of it (``format_exec``)."""
    r = await sandbox.exec(command)
    return format_exec(r.exit_code, r.output, r.timed_out)
