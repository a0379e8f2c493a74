"""Agent tools, each a JSON schema plus an implementation that acts inside the environment's sandbox.

Harness arms differ in their tool sets: ``bash`` (mini-bash), Read/Write/Edit/Grep/Glob/Bash
(mini-claude-code), ``apply_patch`` + ``exec_command`` (mini-codex), the four-command file
editor + ``bash`` (mini-mimocode). Commands run through the environment's own ``bash`` tool
(so an environment's interceptor sees them); file operations run inside the sandbox
(``rlonce.sandbox.fileops``).
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rlonce.envs.base import function_tool
from rlonce.sandbox.fileops import editor_command, file_op_command


@dataclass(frozen=True)
class Tool:
    schema: dict
    run: Callable[[object, dict], Awaitable[str]] | None
    """``run(env, arguments)`` → the observation text; ``None`` for ``submit``, which ends the
    episode in the loop and never runs."""

    @property
    def name(self) -> str:
        return self.schema["name"]


async def _bash(env, command) -> str:
    if not isinstance(command, str) or not command.strip():
        return "[error: the command must be a non-empty string]"
    return await env.call_tool("bash", {"command": command})


async def _file_op(env, op: str, arguments: dict) -> str:
    return await _bash(env, file_op_command(op, arguments))


def _s(desc: str = "") -> dict:
    return {"type": "string", "description": desc} if desc else {"type": "string"}


SUBMIT = Tool(function_tool("submit", "Submit the final answer.", {"answer": _s()}, ["answer"]), None)


def bash_tool(name: str = "bash", key: str = "command") -> Tool:
    return Tool(function_tool(name, "Run a shell command in the workspace.", {key: _s()}, [key]),
                lambda env, a: _bash(env, a.get(key)))


def _grep(env, a: dict) -> Awaitable[str]:
    pattern, where = a.get("pattern"), a.get("path") or "."
    if not isinstance(pattern, str) or not pattern or not isinstance(where, str):
        return _bash(env, "")
    return _bash(env, f"grep -r -e {shlex.quote(pattern)} {shlex.quote(where)}")


def _op(op: str) -> Callable[[object, dict], Awaitable[str]]:
    return lambda env, a: _file_op(env, op, a)


def _editor(env, a: dict) -> Awaitable[str]:
    return _bash(env, editor_command(a))


READ = Tool(function_tool("Read", "Read a file (numbered lines).",
                          {"file_path": _s(), "offset": {"type": "integer"}, "limit": {"type": "integer"}},
                          ["file_path"]), _op("read"))
WRITE = Tool(function_tool("Write", "Write a file.", {"file_path": _s(), "content": _s()}, ["file_path", "content"]),
             _op("write"))
EDIT = Tool(function_tool("Edit", "Replace text in a file.",
                          {"file_path": _s(), "old_string": _s(), "new_string": _s(),
                           "replace_all": {"type": "boolean"}}, ["file_path", "old_string", "new_string"]), _op("edit"))
GREP = Tool(function_tool("Grep", "Search file contents for a pattern.", {"pattern": _s(), "path": _s()},
                          ["pattern"]), _grep)
GLOB = Tool(function_tool("Glob", "List paths matching a glob pattern.", {"pattern": _s(), "path": _s()},
                          ["pattern"]), _op("glob"))
APPLY_PATCH = Tool(function_tool("apply_patch", "Apply a patch in the '*** Begin Patch' format.",
                                 {"input": _s()}, ["input"]), _op("patch"))
EDITOR = Tool(function_tool("str_replace_editor", "View, create and edit files.",
                            {"command": {"type": "string", "enum": ["view", "create", "str_replace", "insert"]},
                             "path": _s(), "file_text": _s(), "old_str": _s(), "new_str": _s(),
                             "insert_line": {"type": "integer"}}, ["command", "path"]), _editor)
