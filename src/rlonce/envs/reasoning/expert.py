"""The scripted reasoning expert: answers with the generator's gold answer inside <answer> tags.

Its demonstrations are imperfect on purpose, the way toolfind's are: before the answer it may
restate the question's terms and work the sum out loud (``chain_sum``: each partial sum), with
probability ``detour_p`` per sentence, at most ``max_detours`` sentences. The worked steps are
correct, only longer — length that RL under a token budget, or a length penalty, can remove.
"""

from __future__ import annotations

import random
import re

from rlonce.envs.reasoning.tasks import ReasoningTask
from rlonce.model.chat import ChatFormat

TERMS = re.compile(r"-?\d+(?:\s*[-+]\s*-?\d+)+")


def _working(task: ReasoningTask) -> list[str]:
    """Correct working sentences for the task (partial sums of a chain sum; else none)."""
    m = TERMS.search(task.question)
    if task.dataset != "chain_sum" or m is None:
        return []
    tokens = re.findall(r"[-+]|\d+", m.group(0))
    total, out, op = int(tokens[0]), [], "+"
    for t in tokens[1:]:
        if t in "+-":
            op = t
            continue
        new = total + int(t) if op == "+" else total - int(t)
        out.append(f"{total} {op} {t} = {new}.")
        total = new
    return out


def expert_reply(task: ReasoningTask, rng: random.Random, *, detour_p: float = 0.5, max_detours: int = 2) -> str:
    steps = []
    for sentence in _working(task)[:max_detours]:
        if rng.random() >= detour_p:
            break
        steps.append(sentence)
    return " ".join([*steps, f"<answer>{task.answer}</answer>"])


def expert_turns(task: ReasoningTask, rng: random.Random, fmt: ChatFormat, *, translate=None, single_turn: bool = False,
                 **kw) -> list[str]:
    """The expert's one reply as text, ready for a scripted engine (``translate`` is unused: the
    single-turn arm has no tools)."""
    return [fmt.assistant_text(expert_reply(task, rng, **kw), [])]
