"""The scripted context expert: the right value, written as the task's rules in force require.

``write`` renders any value under any rule set, so the probe's routes reuse it: the same reply with
the real-world value (memory), under the superseded rules (first rule), with a wrong value
(format without content). The expert itself is ``write(task, task.answer)``, one reply with no
detours (the single-turn arm has no tools; ``translate`` and the detour keywords are unused).
"""

from __future__ import annotations

import json
import random

from rlonce.envs.context.record import ContextTask, Rule
from rlonce.model.chat import ChatFormat


def write(task: ContextTask, value: str, rules: tuple[Rule, ...] | None = None) -> str:
    """``value`` as the answer to ``task``, obeying ``rules`` (default: the rules in force)."""
    rules = task.rules if rules is None else rules
    by = {r.kind: r for r in rules}
    text = (task.short if "max_words" in by or "forbid" in by else task.sentence).format(value)
    if "json" in by:
        name_key, name, value_key = by["json"].arg
        text = json.dumps({name_key: name, value_key: value})
    if "bullets" in by:
        text = "\n".join("- " + line.format(value) for line in by["bullets"].arg)
    if "prefix" in by:
        text = f"{by['prefix'].arg} {text}"
    if "signoff" in by:
        text = f"{text}\n{by['signoff'].arg}"
    if "upper" in by:
        text = text.upper()
    if "lower" in by:
        text = text.lower()
    return text


def expert_reply(task: ContextTask) -> str:
    return write(task, task.answer)


def expert_turns(task: ContextTask, rng: random.Random, fmt: ChatFormat, *, translate=None, single_turn: bool = True,
                 **kw) -> list[str]:
    """The expert's one reply as text, ready for a scripted engine."""
    return [fmt.assistant_text(expert_reply(task), [])]
