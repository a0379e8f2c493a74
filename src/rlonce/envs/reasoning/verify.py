"""Answer extraction, the math answer checker, and the correctness + format reward.

The model is asked for its final answer inside ``<answer>…</answer>``. The reward follows
MiniMax-M1 §4.1: correctness from rules — the generator's own scorer, and for answers that
parse as mathematics an equivalence check (``math-verify``: 0.5 = 1/2, 12 = \\boxed{12}) — plus
a format reward when the answer was given in the requested tags. Without tags the last number
of the reply (or its last line) is taken as the answer, so a correct but untagged reply still
counts as correct: the format reward, not a zero, is what teaches the tags.
"""

from __future__ import annotations

import logging
import re
import threading

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.S)
NUMBER_RE = re.compile(r"-?\d+(?:[.,]\d+)*(?:/\d+)?")
MAX_ANSWER_CHARS = 2000


def extract(reply: str) -> tuple[str | None, bool]:
    """(answer, in_tags): the last ``<answer>`` block, else the last number, else the last line."""
    tagged = ANSWER_RE.findall(reply)
    if tagged:
        return tagged[-1].strip(), True
    numbers = NUMBER_RE.findall(reply)
    if numbers:
        return numbers[-1].replace(",", ""), False
    lines = [ln.strip() for ln in reply.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else None), False


def math_equal(gold: str, answer: str) -> bool:
    """``answer`` equals ``gold`` as mathematics (``math-verify``). Its signal-based timeouts only
    work on the main thread; elsewhere the answer length is capped instead."""
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    answer = answer[:MAX_ANSWER_CHARS]
    main = threading.current_thread() is threading.main_thread()
    kw = {} if main else {"parsing_timeout": None}
    try:
        g, a = parse(gold, **kw), parse(answer, **kw)
        return bool(g) and bool(a) and bool(verify(g, a, **({} if main else {"timeout_seconds": None})))
    except Exception:  # noqa: BLE001 - an unparsable answer is simply not equal
        return False


def correctness(task, answer: str | None) -> float:
    """The generator's score in [0, 1]; 1.0 also when the answer is mathematically the gold one."""
    from rlonce.envs.reasoning.tasks import scorer

    if answer is None:
        return 0.0
    score = float(scorer(task)(answer, task.entry) or 0.0)
    if score < 1.0 and NUMBER_RE.search(task.answer) and math_equal(task.answer, answer):
        score = 1.0
    return score


def reward(task, reply: str, format_weight: float) -> tuple[float, dict[str, float]]:
    """Correctness + ``format_weight`` × (answer in tags), and the parts as metrics."""
    answer, tagged = extract(reply)
    correct = correctness(task, answer)
    return correct + format_weight * tagged, {"correct": correct, "format_ok": float(tagged)}
