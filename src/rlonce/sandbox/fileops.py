"""File operations that run *inside* a sandbox: view, read, create, write, str_replace, edit,
insert, glob, and ``*** Begin Patch`` patches.

Agents' file tools (the code domain's editor, the harness arms' Read/Write/Edit/Glob,
``apply_patch``) all run this one small Python program in the sandbox, with the workspace as
its working directory, so a symlink planted by the agent can never make the host read or
write outside the workspace. The program is ``rlonce.sandbox.programs.fileops``, shipped as its
source text to the sandbox's ``python3 -c``; ``file_op_command`` builds the shell command, and
arguments travel as base64 JSON.
"""

from __future__ import annotations

import base64
import functools
import json
import shlex
from importlib import resources


@functools.cache
def file_ops_source() -> str:
    """The source of ``rlonce.sandbox.programs.fileops``, the program the sandbox runs."""
    return resources.files("rlonce.sandbox.programs").joinpath("fileops.py").read_text(encoding="utf-8")


def file_op_command(op: str, arguments: dict) -> str:
    """The shell command that runs ``op`` with ``arguments`` inside a sandbox."""
    blob = base64.b64encode(json.dumps({**arguments, "op": op}).encode()).decode()
    return f"/usr/bin/python3 -c {shlex.quote(file_ops_source())} {blob}"


EDITOR_COMMANDS = ("view", "create", "str_replace", "insert")


def editor_command(arguments: dict) -> str:
    """The four-command file editor (``str_replace_editor``): ``arguments["command"]`` picks the operation."""
    cmd = arguments.get("command")
    if cmd not in EDITOR_COMMANDS:
        return "echo " + shlex.quote(f"error: unknown editor command {cmd!r}; use view, create, str_replace or insert")
    return file_op_command(cmd, {k: v for k, v in arguments.items() if k != "command"})
