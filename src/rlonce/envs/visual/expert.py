"""The scripted visual expert: writes the reference page, then spoils it a little.

Replication: the reference HTML with, per slot with probability ``detour_p`` (at most
``max_detours``), one flaw from ``FLAWS`` — a colour swapped for another of the scheme, a height
off by 20 px, the heading a size off, the footer or the bar left out, a margin changed. Each
costs pixel or structure score, so RL has something to fix. Open-ended: a plain page that names
each requirement in a section of its own (the group judge, not the expert, decides its worth).

Single turn: one reply with the page in a fenced ``html`` block. With tools: sometimes look
around first (a detour), write ``index.html`` with a heredoc, submit the path.
"""

from __future__ import annotations

import random
import re

from rlonce.envs.visual.layouts import SCHEMES
from rlonce.envs.visual.tasks import VisualTask
from rlonce.model.chat import ChatFormat, ToolCall

FLAWS = ("colour", "height", "heading_size", "drop_footer", "drop_bar", "margin")
COLOUR = re.compile(r"(?<=background:)#[0-9a-f]{6}")
HEIGHT = re.compile(r"(?<=height:)(\d+)(?=px)")


def _flaw(page: str, task: VisualTask, rng: random.Random, flaw: str) -> str:
    if flaw == "colour":
        spots = list(COLOUR.finditer(page))[1:]  # not the page background
        if spots:
            m = rng.choice(spots)
            other = rng.choice([c for c in SCHEMES[task.layout.scheme] if c != m.group(0)])
            return page[:m.start()] + other + page[m.end():]
    elif flaw == "height":
        spots = list(HEIGHT.finditer(page))
        if spots:
            m = rng.choice(spots)
            return page[:m.start()] + str(int(m.group(1)) + rng.choice((-20, 20))) + page[m.end():]
    elif flaw == "heading_size":
        return re.sub(r"font-size:(\d+)px;color", lambda m: f"font-size:{int(m.group(1)) + 8}px;color", page, count=1)
    elif flaw == "drop_footer":
        return re.sub(r'<div style="margin-top:12px[^\n]*\n', "", page)
    elif flaw == "drop_bar":
        return re.sub(r'<div style="height:\d+px;line-height[^\n]*\n', "", page)
    elif flaw == "margin":
        return page.replace("margin:12px", "margin:24px", 1)
    return page


def _open_page(task: VisualTask, rng: random.Random) -> str:
    bg, bar, accent, _ = SCHEMES[rng.choice(sorted(SCHEMES))]
    req = task.request
    sections = "".join(f'<section style="margin:12px;padding:12px;background:#fff;border-left:4px solid {accent}">'
                       f"<h2>{r.capitalize()}</h2><p>{req.business.capitalize()}.</p></section>"
                       for r in req.requirements)
    return (f'<body style="margin:0;background:{bg};font-family:sans-serif">\n'
            f'<div style="background:{bar};color:#fff;padding:12px">{req.business.title()}</div>\n'
            f'<h1 style="margin:12px;color:{accent}">{req.page.split(" ", 1)[1].capitalize()}</h1>\n'
            f'{sections}\n</body>\n')


def expert_page(task: VisualTask, rng: random.Random, *, detour_p: float = 0.4, max_detours: int = 2) -> str:
    """The expert's page for ``task``, flaws included."""
    if task.layout is None:
        return _open_page(task, rng)
    page = task.reference_html
    for _ in range(max_detours):
        if rng.random() >= detour_p:
            break
        page = _flaw(page, task, rng, rng.choice(FLAWS))
    return page


def expert_calls(task: VisualTask, rng: random.Random, *, detour_p: float = 0.4, max_detours: int = 2,
                 **kw) -> list[ToolCall]:
    page = expert_page(task, rng, detour_p=detour_p, max_detours=max_detours)
    calls = [ToolCall("bash", {"command": rng.choice(("ls", "ls -la"))})] if rng.random() < detour_p else []
    return [*calls, ToolCall("bash", {"command": f"cat > index.html <<'EOF'\n{page}EOF"}),
            ToolCall("submit", {"answer": "index.html"})]


def expert_turns(task: VisualTask, rng: random.Random, fmt: ChatFormat, *, translate=None, single_turn: bool = True,
                 **kw) -> list[str]:
    """The expert's assistant turns as text. ``translate`` maps its calls into an arm's tools."""
    if single_turn:
        kw.pop("translate", None)
        page = expert_page(task, rng, detour_p=kw.get("detour_p", 0.4), max_detours=kw.get("max_detours", 2))
        return [fmt.assistant_text(f"```html\n{page}```", [])]
    return [fmt.assistant_text("", [translate(c) if translate else c]) for c in expert_calls(task, rng, **kw)]
