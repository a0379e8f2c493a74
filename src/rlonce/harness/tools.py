"""Agent tools, each a JSON schema plus an implementation that acts inside the environment's sandbox.

Harness arms differ in their tool sets: ``bash`` (mini-bash), Read/Write/Edit/Grep/Glob/Bash
(mini-claude-code), ``apply_patch`` + ``exec_command`` (mini-codex), the four-command file
editor + ``bash`` (mini-mimocode). Commands run through the environment's own ``bash`` tool
(so an environment's interceptor sees them); file operations run as a small Python program
*inside* the sandbox, so a symlink planted by the agent can never make the host read or
write outside the workspace.
"""

from __future__ import annotations

import base64
import json
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rlonce.envs.base import function_tool

# Runs inside the sandbox (cwd = the workspace): one file operation; arguments as base64 JSON.
FILE_OPS_SCRIPT = r'''
import base64, glob, json, os, sys
a = json.loads(base64.b64decode(sys.argv[1]))
op = a.pop("op")
def out(s): print(s); sys.exit(0)
def fail(s): print("error: " + s); sys.exit(0)
def path(key):
    p = a.get(key)
    if not isinstance(p, str) or not p: fail(f"'{key}' must be a non-empty path")
    return p
def read(p):
    if not os.path.isfile(p): fail(f"{p} does not exist")
    return open(p, errors="replace").read()
def write(p, text):
    os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
    open(p, "w").write(text)
def numbered(lines, start=1): return "\n".join(f"{i:6}\t{l}" for i, l in enumerate(lines, start))
if op in ("view", "read"):
    p = path("path" if op == "view" else "file_path")
    if os.path.isdir(p): out("\n".join(sorted(os.listdir(p))))
    lines = read(p).splitlines()
    lo = int(a.get("offset") or 1) if op == "read" else int((a.get("view_range") or [1])[0])
    n = int(a.get("limit") or len(lines))
    out(numbered(lines[lo - 1:lo - 1 + n], lo) if lines else "[empty file]")
if op == "create":
    p = path("path")
    if os.path.exists(p): fail(f"{p} already exists; use str_replace")
    write(p, a.get("file_text", "")); out(f"created {p}")
if op == "write":
    p = path("file_path"); write(p, a.get("content", "")); out(f"wrote {p}")
if op in ("str_replace", "edit"):
    p = path("path" if op == "str_replace" else "file_path")
    text = read(p)
    old = a.get("old_str" if op == "str_replace" else "old_string") or ""
    new = a.get("new_str" if op == "str_replace" else "new_string") or ""
    n = text.count(old) if old else 0
    if n == 0 or (n > 1 and not a.get("replace_all")):
        fail(f"the old text occurs {n} times in {p}; it must occur exactly once")
    write(p, text.replace(old, new) if a.get("replace_all") else text.replace(old, new, 1)); out(f"edited {p}")
if op == "insert":
    p = path("path"); lines = read(p).splitlines(True)
    k = int(a.get("insert_line", 0))
    if not 0 <= k <= len(lines): fail(f"insert_line must be in [0, {len(lines)}]")
    new = a.get("new_str", "")
    lines.insert(k, new if new.endswith("\n") else new + "\n")
    write(p, "".join(lines)); out(f"inserted into {p}")
if op == "glob":
    base = a.get("path") or "."
    hits = sorted(glob.glob(os.path.join(base, path("pattern")), recursive=True))
    out("\n".join(os.path.relpath(h) for h in hits) if hits else "[no matches]")
if op == "patch":
    lines = (a.get("input") or "").splitlines()
    if not lines or lines[0].strip() != "*** Begin Patch": fail("a patch starts with '*** Begin Patch'")
    i, done = 1, []
    while i < len(lines) and lines[i].strip() != "*** End Patch":
        l = lines[i]
        if l.startswith("*** Add File: "):
            p, body, i = l[14:].strip(), [], i + 1
            while i < len(lines) and lines[i].startswith("+"): body.append(lines[i][1:]); i += 1
            write(p, "\n".join(body) + "\n"); done.append("A " + p)
        elif l.startswith("*** Delete File: "):
            p = l[17:].strip(); read(p); os.remove(p); done.append("D " + p); i += 1
        elif l.startswith("*** Update File: "):
            p, i = l[17:].strip(), i + 1
            dest = p
            if i < len(lines) and lines[i].startswith("*** Move to: "): dest, i = lines[i][13:].strip(), i + 1
            content, pos = read(p).split("\n"), 0
            while i < len(lines) and not lines[i].startswith("*** "):
                if lines[i].startswith("@@"): i += 1; continue
                old, new = [], []
                while i < len(lines) and not lines[i].startswith(("@@", "*** ")):
                    tag, text = (lines[i][:1], lines[i][1:]) if lines[i] else (" ", "")
                    if tag not in " -+": fail(f"patch line {i + 1} must start with ' ', '-' or '+'")
                    if tag != "+": old.append(text)
                    if tag != "-": new.append(text)
                    i += 1
                at = next((k for k in range(pos, len(content) - len(old) + 1) if content[k:k + len(old)] == old), None)
                if at is None: fail(f"a hunk of the patch for {p} does not match the file")
                content[at:at + len(old)] = new
                pos = at + len(new)
            write(dest, "\n".join(content))
            if dest != p: os.remove(p)
            done.append("M " + dest)
        else:
            fail(f"patch line {i + 1} is not a file operation: {l[:60]!r}")
    out("applied:\n" + "\n".join(done) if done else "error: the patch holds no file operation")
fail(f"unknown operation {op!r}")
'''


@dataclass(frozen=True)
class Tool:
    schema: dict
    run: Callable[[object, dict], Awaitable[str]]
    """``run(env, arguments)`` → the observation text."""

    @property
    def name(self) -> str:
        return self.schema["name"]


async def _bash(env, command) -> str:
    if not isinstance(command, str) or not command.strip():
        return "[error: the command must be a non-empty string]"
    return await env.call_tool("bash", {"command": command})


async def _file_op(env, op: str, arguments: dict) -> str:
    blob = base64.b64encode(json.dumps({**arguments, "op": op}).encode()).decode()
    return await _bash(env, f"/usr/bin/python3 -c {shlex.quote(FILE_OPS_SCRIPT)} {blob}")


def _s(desc: str = "") -> dict:
    return {"type": "string", "description": desc} if desc else {"type": "string"}


SUBMIT = Tool(function_tool("submit", "Submit the final answer.", {"answer": _s()}, ["answer"]),
              lambda env, a: _never(env, a))


async def _never(env, a) -> str:  # submit ends the episode in the loop; it never runs
    raise RuntimeError("submit is handled by the harness loop")


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
    cmd = a.get("command")
    if cmd not in ("view", "create", "str_replace", "insert"):
        return _file_op(env, "unknown", {})
    return _file_op(env, cmd, {k: v for k, v in a.items() if k != "command"})


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
