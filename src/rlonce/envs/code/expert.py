"""The scripted code-repair expert: knows each task's mutation and applies the reference fix.

Its way to the bug uses only what the agent sees: ``grep -n`` for the function the report names,
in the file of the report's module, then the lines that answer gives (``optimal_calls``); a
demonstration that jumped to the bug's line would teach a model to guess line numbers.

Like the toolfind expert its demonstrations are imperfect on purpose. Before each step up to the
edit it may take a detour with probability
``detour_p``, up to ``max_detours`` in a row: list a directory, print the whole buggy file, grep
for the broken function, run pytest on a test file the workspace still holds, ``git status`` or
``git diff``, or repeat its previous call. Detours never make it wrong, only slower, so RL has
something real to improve. It never reads a hidden test file (the interceptor would deny it),
and it never consults git history.

The fix is ``routes.reference_fix_calls`` (the probe's positive control): one editor
``str_replace``, of the fewest whole words around the bug that occur once in the file (a minimal
edit: about half the tokens of whole lines, which a tiny model reproduces far more often). Arms
that lack the editor carry it through ``Arm.translate`` (``Edit`` in mini-claude-code); an arm
whose translation needs whole lines (``translate.whole_lines``: mini-codex's line patch) gets
the fix as whole lines.
"""

from __future__ import annotations

import random
import shlex
from pathlib import Path

from rlonce.envs.code.mutate import function_spans
from rlonce.envs.code.routes import reference_fix_calls
from rlonce.envs.code.tasks import CodeTask
from rlonce.model.chat import ChatFormat, ToolCall

CONTEXT_LINES = 3
WINDOW_LINES = 40


def _bash(cmd: str) -> ToolCall:
    return ToolCall("bash", {"command": cmd})


def buggy_text(task: CodeTask) -> str:
    """The mutated file as the rollout workspace holds it."""
    m = task.mut
    return m.apply((task.tree() / m.path).read_bytes()).decode()


def visible_test_files(task: CodeTask) -> list[str]:
    """The package's test files left in the rollout workspace (the hidden ones removed)."""
    tree, out = task.tree(), set()
    for entry in task.spec.tests:
        p = tree / entry
        files = [p] if p.is_file() else [*p.rglob("test_*.py"), *p.rglob("*_test.py")] if p.is_dir() else []
        out |= {f.relative_to(tree).as_posix() for f in files}
    return sorted(out - set(task.hidden_files))


def reading_calls(text: str, path: str, function: str, line: int) -> list[ToolCall]:
    """How the expert reaches ``line`` of ``path`` (whose text is ``text``) inside ``function`` using
    only what it has seen: ``grep -n`` for the function's ``def``, then windows of ``WINDOW_LINES``
    from the line grep answers, each where the last ended, until the one that holds ``line``.
    Module-level code has no name to grep: it is read around ``line``, the one place a
    demonstration still knows more than the agent."""
    quoted = shlex.quote(path)
    spans = function_spans(text.encode()).get(function, []) if function != "<module>" else []
    span = min((s for s in spans if s[0] <= line <= s[1]), key=lambda s: s[1] - s[0], default=None)
    if span is None:
        return [_bash(f"sed -n '{max(1, line - CONTEXT_LINES)},{line + CONTEXT_LINES}p' {quoted}")]
    calls = [_bash(f"grep -n {shlex.quote('def ' + function.split('.')[-1] + '(')} {quoted}")]
    for lo in range(span[0], line + 1, WINDOW_LINES):
        calls.append(_bash(f"sed -n '{lo},{min(lo + WINDOW_LINES - 1, span[1])}p' {quoted}"))
    return calls


def optimal_calls(task: CodeTask, *, whole_lines: bool = False) -> list[ToolCall]:
    """Find the function the report names, read it (``reading_calls``), fix the bug, submit."""
    m = task.mut
    text = buggy_text(task)
    ((name, args),) = reference_fix_calls(task, text, whole_lines=whole_lines)
    return [*reading_calls(text, m.path, m.function, m.line), ToolCall(name, args),
            ToolCall("submit", {"answer": "fixed"})]


def _detour(task: CodeTask, tests: list[str], previous: list[ToolCall], rng: random.Random) -> ToolCall:
    m = task.mut
    kinds = ["ls", "cat", "git", "again"]
    if m.function != "<module>":
        kinds.append("grep")
    if tests:
        kinds.append("pytest")
    kind = rng.choice(kinds)
    if kind == "again" and previous:
        return previous[-1]
    if kind == "cat":
        return _bash(f"cat -n {shlex.quote(m.path)}")
    if kind == "git":
        return _bash(rng.choice(("git status", "git diff")))
    if kind == "grep":
        return _bash(f"grep -rn {shlex.quote('def ' + m.function.split('.')[-1])} --include=*.py .")
    if kind == "pytest":
        args = " ".join(shlex.quote(a) for a in (*task.spec.pytest_args, rng.choice(tests)))
        return _bash(f"python3 -m pytest -q -x -p no:cacheprovider {args} 2>&1 | tail -15")
    return _bash("ls " + rng.choice((".", shlex.quote(str(Path(m.path).parent)))))


def expert_calls(task: CodeTask, rng: random.Random, *, detour_p: float = 0.5, max_detours: int = 2,
                 whole_lines: bool = False) -> list[ToolCall]:
    """The expert's tool calls for one demonstration, detours included."""
    *work, submit = optimal_calls(task, whole_lines=whole_lines)
    tests = visible_test_files(task) if detour_p > 0 else []
    calls: list[ToolCall] = []
    for call in work:
        n = 0
        while n < max_detours and rng.random() < detour_p:
            calls.append(_detour(task, tests, calls, rng))
            n += 1
        calls.append(call)
    return calls + [submit]


def expert_turns(task: CodeTask, rng: random.Random, fmt: ChatFormat, *, translate=None, single_turn: bool = False,
                 **kw) -> list[str]:
    """The expert's assistant turns as text, one tool call each, ready for a scripted engine.
    ``translate`` maps its calls into a harness arm's own tools (``Arm.translate``)."""
    calls = expert_calls(task, rng, whole_lines=getattr(translate, "whole_lines", False), **kw)
    return [fmt.assistant_text("", [translate(c) if translate else c]) for c in calls]
