"""Harness arms: system prompt + tool set + context policy + wire protocol, recombined.

| arm | protocol | tools | context policy |
|---|---|---|---|
| ``mini-bash`` | Chat Completions | ``bash`` (plus the domain's own tools) | head+tail observation cut |
| ``mini-claude-code`` | Anthropic Messages | Read, Write, Edit, Grep, Glob, Bash | cut; compaction into a new context near the budget |
| ``mini-codex`` | Responses | ``apply_patch``, ``exec_command`` | cut |
| ``mini-mimocode`` | Chat Completions | ``str_replace_editor``, ``bash`` | line-based observation truncation |
| ``single-turn`` | Chat Completions | none: the reply is the answer | — |

Every tool arm adds ``submit``. A tool the environment itself offers under the same name (e.g. the
toolfind ``bash``, the code domain's ``str_replace_editor``) is used as the environment defines
it. ``translate`` maps the scripted experts' bash calls into the arm's tools, and an editor
``str_replace`` of whole lines into an arm that has no editor (``Edit``, ``apply_patch``), so
one expert writes demonstrations for every arm.

Arm assignment is a step hash: ``sha256(seed NUL round NUL task_id) mod n_arms`` — the same
arm for every sibling of a group, different arms across tasks and rounds.
"""  # noqa: E501 (a markdown table row cannot wrap)

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from rlonce.harness import tools as T
from rlonce.model.chat import ToolCall


def cut_middle(text: str, limit: int) -> str:
    """Keep the head and tail of an observation longer than ``limit`` characters."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-tail:]}"


def cut_lines(text: str, limit: int) -> str:
    """Keep whole leading lines up to ``limit`` characters and say how many lines were dropped."""
    if len(text) <= limit:
        return text
    lines, kept, size = text.splitlines(), [], 0
    for line in lines:
        if size + len(line) + 1 > limit:
            break
        kept.append(line)
        size += len(line) + 1
    return "\n".join(kept) + f"\n[... {len(lines) - len(kept)} more lines truncated ...]"


def _same(call: ToolCall) -> ToolCall:
    return call


def _str_replace(call: ToolCall) -> dict | None:
    """The arguments of an editor ``str_replace`` call, or None for any other call."""
    ok = call.name == "str_replace_editor" and call.arguments.get("command") == "str_replace"
    return call.arguments if ok else None


def _claude(call: ToolCall) -> ToolCall:
    if (a := _str_replace(call)) is not None:
        return ToolCall("Edit", {"file_path": a["path"], "old_string": a["old_str"], "new_string": a["new_str"]})
    cmd = call.arguments.get("command", "") if call.name == "bash" else None
    if cmd is None:
        return call
    try:
        words = shlex.split(cmd)
    except ValueError:  # not one shell word list (a heredoc's text, an open quote): plain Bash
        words = []
    if words[:2] == ["grep", "-r"] and len(words) == 4:
        return ToolCall("Grep", {"pattern": words[2], "path": words[3]})
    if words and words[0] == "ls" and len(words) == 2:
        return ToolCall("Glob", {"pattern": "*", "path": words[1]})
    return ToolCall("Bash", {"command": cmd})


def _codex(call: ToolCall) -> ToolCall:
    if (a := _str_replace(call)) is not None:  # whole lines (the experts' fixes are): a one-hunk patch
        body = [f"-{x}" for x in a["old_str"].removesuffix("\n").split("\n")]
        body += [f"+{x}" for x in a["new_str"].removesuffix("\n").split("\n")]
        patch = "\n".join(["*** Begin Patch", f"*** Update File: {a['path']}", "@@", *body, "*** End Patch"])
        return ToolCall("apply_patch", {"input": patch + "\n"})
    return ToolCall("exec_command", {"cmd": call.arguments["command"]}) if call.name == "bash" else call


_codex.whole_lines = True  # its patch tool edits whole lines: experts give it whole-line edits


@dataclass(frozen=True)
class Arm:
    name: str
    protocol: str
    tools: tuple[T.Tool, ...]
    preamble: str
    """Prepended to the environment's instructions ('' keeps them as they are)."""
    observe: Callable[[str, int], str]
    """Context policy for one observation and the configured character limit."""
    compaction: bool = False
    """Restart into a new context, with a summary of the work so far, near the trajectory budget."""
    translate: Callable[[ToolCall], ToolCall] = _same
    env_tools: bool = False
    """Offer every tool the environment defines as well (mini-bash: the domain's own tool set)."""
    single_turn: bool = False
    """No tools: one model turn, whose text is the submitted answer (rule-verified reasoning)."""

    def toolset(self, env) -> dict[str, T.Tool]:
        """The arm's tools, ``submit`` included; the environment's own tools win by name, and an
        environment's MCP tools (``env.mcp_tools()``, as ``tools/list`` gave them) join every arm as
        ``mcp__<server>__<tool>``."""
        if self.single_turn:
            return {}
        native = {t["name"]: t for t in env.tools() if t["name"] != "submit"}
        out = {t.name: t for t in self.tools}
        for name in native if self.env_tools else native.keys() & out.keys():
            out[name] = T.Tool(native[name], lambda e, a, n=name: e.call_tool(n, a))
        for schema in getattr(env, "mcp_tools", list)():  # MCP servers' tools, named as agent CLIs name them
            name = f"mcp__{schema['name']}"
            out[name] = T.Tool({**schema, "name": name}, lambda e, a, n=schema["name"]: e.call_tool(n, a))
        out["submit"] = T.SUBMIT
        return out

    def system_prompt(self, env) -> str:
        return (self.preamble + "\n\n" if self.preamble else "") + env.system_prompt()


ARMS: dict[str, Arm] = {a.name: a for a in (
    Arm("mini-bash", "openai-chat", (T.bash_tool(),), "", cut_middle, env_tools=True),
    Arm("mini-claude-code", "anthropic-messages", (T.READ, T.WRITE, T.EDIT, T.GREP, T.GLOB, T.bash_tool("Bash")),
        "You are a coding agent with file tools (Read, Write, Edit, Grep, Glob) and Bash.", cut_middle,
        compaction=True, translate=_claude),
    Arm("mini-codex", "openai-responses", (T.APPLY_PATCH, T.bash_tool("exec_command", "cmd")),
        "You are a terminal agent: run commands with exec_command, change files with apply_patch.", cut_middle,
        translate=_codex),
    Arm("mini-mimocode", "openai-chat", (T.EDITOR, T.bash_tool()),
        "You are a coding agent with a file editor (str_replace_editor) and bash.", cut_lines),
    Arm("single-turn", "openai-chat", (), "", cut_middle, single_turn=True),
)}


def get_arm(name: str) -> Arm:
    try:
        return ARMS[name]
    except KeyError:
        raise ValueError(f"unknown harness arm {name!r}; known: {sorted(ARMS)}") from None


def arm_for(seed: int, round_: int, task_id: str, arms: list[str]) -> str:
    """The step-hash assignment: siblings of one group share an arm."""
    h = hashlib.sha256(f"{seed}\0{round_}\0{task_id}".encode()).digest()
    return arms[int.from_bytes(h[:8], "big") % len(arms)]
