"""File operations that run *inside* a sandbox: view, read, create, write, str_replace, edit,
insert, glob, and ``*** Begin Patch`` patches.

Agents' file tools (the code domain's editor, the harness arms' Read/Write/Edit/Glob,
``apply_patch``) all run this one small Python program in the sandbox, with the workspace as
its working directory, so a symlink planted by the agent can never make the host read or
write outside the workspace. ``file_op_command`` builds the shell command; arguments travel
as base64 JSON.
"""

from __future__ import annotations

import base64
import json
import shlex

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


def file_op_command(op: str, arguments: dict) -> str:
    """The shell command that runs ``op`` with ``arguments`` inside a sandbox."""
    blob = base64.b64encode(json.dumps({**arguments, "op": op}).encode()).decode()
    return f"/usr/bin/python3 -c {shlex.quote(FILE_OPS_SCRIPT)} {blob}"


EDITOR_COMMANDS = ("view", "create", "str_replace", "insert")


def editor_command(arguments: dict) -> str:
    """The four-command file editor (``str_replace_editor``): ``arguments["command"]`` picks the operation."""
    cmd = arguments.get("command")
    if cmd not in EDITOR_COMMANDS:
        return "echo " + shlex.quote(f"error: unknown editor command {cmd!r}; use view, create, str_replace or insert")
    return file_op_command(cmd, {k: v for k, v in arguments.items() if k != "command"})
