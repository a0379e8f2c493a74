"""The scripted music expert: composes a tune that meets the request, then spoils it a little.

Its demonstrations are imperfect on purpose, like the other domains' experts: with probability
``detour_p`` per slot, at most ``max_detours`` times, one flaw from ``FLAWS`` goes in — a tempo
a little off, no instrument line (the default piano), one extra bar, one out-of-key
accidental, one bar a note short (an abc2midi bar warning, under the gate's limit), no chord
symbols (a thin texture). Each costs adherence or feature score, so RL has something to fix.

Single turn: one reply with the tune in a fenced ``abc`` block. With tools: write ``tune.abc``,
convert it with abc2midi to check, submit the path.
"""

from __future__ import annotations

import random
import re

from rlonce.envs.music.compose import Request, render, sections
from rlonce.envs.music.tasks import MusicTask
from rlonce.model.chat import ChatFormat, ToolCall

FLAWS = ("tempo", "program", "extra_bar", "accidental", "short_bar", "no_chords")
NOTE = re.compile(r"(?<![\"A-Za-z#b])([A-Ga-g][,']*\d*)")


def _body_edit(text: str, rng: random.Random, flaw: str) -> str:
    lines = text.rstrip("\n").split("\n")
    first = next(i for i, ln in enumerate(lines) if ln.startswith("K:")) + 1
    while first < len(lines) and lines[first].startswith("%%"):
        first += 1
    i = rng.randrange(first, len(lines))
    bars = lines[i].split("|")
    if flaw == "extra_bar":
        lines[-1] = lines[-1][:-2] + "|" + lines[-1].split("|")[-2] + "|]"  # the last bar, twice
    elif flaw == "accidental":
        b = rng.randrange(len(bars) - 1)
        bars[b] = NOTE.sub(lambda m: "^" + m.group(1), bars[b], count=1)
        lines[i] = "|".join(bars)
    elif flaw == "short_bar":
        b = rng.randrange(len(bars) - 1)
        notes = list(NOTE.finditer(bars[b]))
        if len(notes) > 1:
            last = notes[-1]
            bars[b] = bars[b][:last.start()] + bars[b][last.end():]
            lines[i] = "|".join(bars)
    return "\n".join(lines) + "\n"


def expert_tune(task: MusicTask, rng: random.Random, *, detour_p: float = 0.5, max_detours: int = 2) -> str:
    """The expert's ABC for ``task``, flaws included."""
    req: Request = task.request
    flaws = []
    while len(flaws) < max_detours and rng.random() < detour_p:
        flaws.append(rng.choice(FLAWS))
    parts = sections(rng, req)
    tempo = req.tempo + rng.choice((-8, 8)) if "tempo" in flaws else None
    text = render(req, parts, "Tune", chords="no_chords" not in flaws, program="program" not in flaws, tempo=tempo)
    for flaw in flaws:
        if flaw in ("extra_bar", "accidental", "short_bar"):
            text = _body_edit(text, rng, flaw)
    return text


def expert_reply(task: MusicTask, rng: random.Random, **kw) -> str:
    r = task.request
    return f"A {r.form} tune in {r.key}, {r.meter}:\n```abc\n{expert_tune(task, rng, **kw)}```"


def expert_calls(task: MusicTask, rng: random.Random, **kw) -> list[ToolCall]:
    tune = expert_tune(task, rng, **kw)
    return [ToolCall("bash", {"command": f"cat > tune.abc <<'EOF'\n{tune}EOF"}),
            ToolCall("bash", {"command": "abc2midi tune.abc -o tune.mid"}),
            ToolCall("submit", {"answer": "tune.abc"})]


def expert_turns(task: MusicTask, rng: random.Random, fmt: ChatFormat, *, translate=None, single_turn: bool = True,
                 **kw) -> list[str]:
    """The expert's assistant turns as text. ``translate`` maps its calls into an arm's tools."""
    if single_turn:
        return [fmt.assistant_text(expert_reply(task, rng, **kw), [])]
    return [fmt.assistant_text("", [translate(c) if translate else c]) for c in expert_calls(task, rng, **kw)]
