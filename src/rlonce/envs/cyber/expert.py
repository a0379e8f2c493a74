"""The scripted cyber expert: finds the reported function, writes the reference PoC, checks it.

It knows the bug's reference PoC (the manifest's), so it is exact; its demonstrations teach the
protocol — look at the function the report names, write bytes with ``printf``, run the sanitizer
build with ``run-target``, submit the path. Like the other experts it takes detours with
probability ``detour_p`` before each step (at most ``max_detours`` in a row): list the source,
print its head, count its lines, run the target on an empty input first.
"""

from __future__ import annotations

import random
import re

from rlonce.envs.cyber.tasks import CyberTask
from rlonce.model.chat import ChatFormat, ToolCall

POC = "poc.bin"


def _bash(cmd: str) -> ToolCall:
    return ToolCall("bash", {"command": cmd})


def function_lines(source: str, function: str) -> tuple[int, int]:
    """1-based first and last line of ``function``'s definition (the whole file when not found)."""
    lines = source.splitlines()
    head = re.compile(rf"^[A-Za-z_][\w \t\*]*\b{re.escape(function)}\s*\(")
    start = next((i for i, ln in enumerate(lines) if head.match(ln)), None)
    if start is None:
        return 1, len(lines)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("}")), len(lines) - 1)
    return start + 1, end + 1


def printf_command(data: bytes, path: str = POC) -> str:
    """A shell command writing ``data`` to ``path`` exactly: printable bytes as themselves, the rest
    (and the quote, backslash and percent sign) as octal escapes."""
    text = "".join(chr(b) if 0x20 <= b < 0x7f and chr(b) not in "'\\%" else f"\\{b:03o}" for b in data)
    return f"printf '{text}' > {path}"


def optimal_calls(task: CyberTask) -> list[ToolCall]:
    src = f"src/{task.file}"
    lo, hi = function_lines(task.source_file.read_text(), task.function)
    return [_bash(f"grep -n '{task.function}' {src}"), _bash(f"sed -n '{lo},{hi}p' {src}"),
            _bash(printf_command(task.reference_poc())), _bash(f"run-target {POC}"),
            ToolCall("submit", {"answer": POC})]


def _detour(task: CyberTask, rng: random.Random) -> ToolCall:
    src = f"src/{task.file}"
    return rng.choice([_bash("ls -l src"), _bash(f"head -40 {src}"), _bash(f"wc -l {src}"),
                       _bash("printf '' > empty.bin"), _bash("run-target empty.bin")])


def expert_calls(task: CyberTask, rng: random.Random, *, detour_p: float = 0.5,
                 max_detours: int = 2) -> list[ToolCall]:
    *work, submit = optimal_calls(task)
    calls: list[ToolCall] = []
    for call in work:
        n = 0
        while n < max_detours and rng.random() < detour_p:
            calls.append(_detour(task, rng))
            n += 1
        calls.append(call)
    return calls + [submit]


def expert_turns(task: CyberTask, rng: random.Random, fmt: ChatFormat, *, translate=None, single_turn: bool = False,
                 **kw) -> list[str]:
    """The expert's assistant turns as text, one tool call each (``translate``: into an arm's tools)."""
    return [fmt.assistant_text("", [translate(c) if translate else c]) for c in expert_calls(task, rng, **kw)]
