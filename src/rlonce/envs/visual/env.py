"""Visual design: the agent writes a page; headless Chromium renders it in a fresh sandbox; the
render is graded.

Two ways to answer, as in the music domain. Single turn (arm ``single-turn``): the reply holds the
page in a fenced ``html`` block. With tools (any other arm): a bubblewrap workspace holding
``target.png`` (replication: the reference screenshot at 640×400) where the agent writes its page
(``index.html`` and any CSS/JS beside it) and submits the path; the page's folder is read from the
host without following links (``target.png`` left out).

Replication tasks are graded alone (``similarity.score``: pixel SSIM against the reference
render, normalised against a blank page, times the structural checks, behind the gates).
Open-ended tasks get the runtime gate alone here; their reward comes from the group pick judge
(``VisualFactory.grade_group``, ``pick``) once every sibling is rendered. A renderer that cannot
start is infrastructure (``RenderError``, ``BrowserMissing``), never a 0.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import weakref
from collections import OrderedDict
from pathlib import Path

from rlonce.core.records import Grade, Sequence
from rlonce.envs.base import GradingError, function_tool
from rlonce.envs.visual import render as rd
from rlonce.envs.visual import similarity as sim
from rlonce.envs.visual.tasks import VisualTask
from rlonce.envs.workspace import BASH_TOOL, BASH_USAGE, bash_command, run_bash
from rlonce.sandbox import hostfs
from rlonce.sandbox.bwrap import BwrapSandbox
from rlonce.sandbox.limits import Limits, command_limits

SYSTEM_PROMPT = ("You write web pages: one HTML file with inline CSS. With tools, write index.html in /work "
                 "and submit its path.")
SUBMIT_TOOL = function_tool("submit", "Submit the page: its HTML, or the path of the HTML file you wrote.",
                            {"answer": {"type": "string"}}, ["answer"])
PASS_PIXEL = 0.98
"""``passed``: no gate closed, every structural item found and the pixel score at least this."""
SHOTS_HEADER = "<!-- rlonce-shots: "
FENCE = re.compile(r"```(?:html|HTML)?[ \t]*\n(.*?)(?:```|\Z)", re.S)
_REFERENCES: OrderedDict[str, dict] = OrderedDict()
REFERENCE_CACHE = 256
RENDER_SLOTS = max(1, (os.cpu_count() or 2))
"""Renders at once in an event loop: a browser is CPU-bound, and a render that waits for a core must
not run into its own time limit (that would score the machine's load as the page's failure)."""
_SLOTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _slots() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    if loop not in _SLOTS:
        _SLOTS[loop] = asyncio.Semaphore(RENDER_SLOTS)
    return _SLOTS[loop]


_RENDERS: OrderedDict[str, object] = OrderedDict()
RENDER_CACHE = 256
"""Renders kept by the page's content: the same files render to the same screenshots, so a group
whose attempts agree (or an attempt equal to its reference) is rendered once."""


async def render(files: dict[str, bytes], entry: str = "index.html"):
    """``render.render`` of ``files``, from the cache or once a render slot is free (the time limit
    starts then)."""
    h = hashlib.sha256(entry.encode())
    for path in sorted(files):
        h.update(b"\0" + path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    key = h.hexdigest()
    if key in _RENDERS:
        _RENDERS.move_to_end(key)
        return _RENDERS[key]
    r = await _render_now(files, entry)
    _RENDERS[key] = r
    while len(_RENDERS) > RENDER_CACHE:
        _RENDERS.popitem(last=False)
    return r


async def _render_now(files: dict[str, bytes], entry: str):
    async with _slots():  # the render's clock starts once it has its slot
        return await rd.render(files, entry=entry)


def extract_html(answer: str) -> str | None:
    """The page in a reply: the first fenced block, else the reply itself when it holds markup."""
    m = FENCE.search(answer)
    text = m.group(1) if m else answer
    return text if "<" in text else None


async def reference(task: VisualTask) -> dict:
    """The reference page's render (``captures`` at delay 0 by viewport, as arrays and PNG bytes),
    cached by the page's hash. A reference that does not render cleanly is the grader's failure."""
    page = task.reference_html
    key = hashlib.sha256(page.encode()).hexdigest()
    if key in _REFERENCES:
        _REFERENCES.move_to_end(key)
        return _REFERENCES[key]
    r = await render({"index.html": page.encode()})
    if sim.gate(r, rd.VIEWPORTS) is not None:
        raise GradingError(f"the reference page of {task.task_id} does not render cleanly: {r.console_errors}")
    first = [c for c in r.captures if c.delay_ms == 0]
    ref = {"png": {c.viewport: c.png for c in first}, "rgb": {c.viewport: sim.rgb(c.png) for c in first}}
    _REFERENCES[key] = ref
    while len(_REFERENCES) > REFERENCE_CACHE:
        _REFERENCES.popitem(last=False)
    return ref


def _is_path(answer: str) -> bool:
    a = answer.strip()
    return bool(a) and "\n" not in a and "<" not in a and len(a) < 256


class VisualEnv:
    def __init__(self, task: VisualTask, *, shots_dir: Path | None = None, limits: Limits | None = None):
        self.task = task
        self.shots_dir = Path(shots_dir) if shots_dir else None
        self.limits = limits or command_limits(20, output_bytes=8192)
        self.sandbox: BwrapSandbox | None = None
        self.metrics: dict[str, float] = {}

    async def setup(self) -> None:
        rd.require_browser()

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def user_prompt(self) -> str:
        return self.task.prompt

    def tools(self) -> list[dict]:
        return [BASH_TOOL, SUBMIT_TOOL]

    async def call_tool(self, name: str, arguments: dict) -> str:
        if name != "bash":
            raise KeyError(name)
        command = bash_command(arguments)
        if command is None:
            return BASH_USAGE
        if self.sandbox is None:  # made on first use: the single-turn arm never needs one
            self.sandbox = BwrapSandbox(self.limits)
            if self.task.layout is not None:
                self.sandbox.put_file("target.png", (await reference(self.task))["png"]["desktop"])
        return await run_bash(self.sandbox, command)

    def page_files(self, answer: str) -> tuple[dict[str, bytes] | None, str, str]:
        """The files to render, the entry page, and how they were found."""
        if self.sandbox is not None and _is_path(answer):
            rel = answer.strip().removeprefix("/work/").lstrip("/") or "index.html"
            folder, _, entry = rel.rpartition("/")
            try:  # the folder is the agent's: no link followed, no climbing out of the workspace
                with hostfs.opened_dir(self.sandbox.workspace, folder) as root:
                    files = rd.read_page_files(root)
            except (hostfs.HostileFile, OSError) as e:
                return None, entry, f"could not read {rel!r}: {e}"
            if not folder:
                files.pop("target.png", None)
            return (files if entry in files else None), entry, f"read from {rel!r}"
        page = extract_html(answer)
        return ({"index.html": page.encode()} if page else None), "index.html", "from the answer"

    def _save(self, r) -> list[str]:
        if self.shots_dir is None:
            return []
        folder = self.shots_dir / re.sub(r"[^A-Za-z0-9_.-]", "_", self.task.task_id)
        folder.mkdir(parents=True, exist_ok=True)
        stem = hashlib.sha256(b"".join(c.png for c in r.captures)).hexdigest()[:12]
        out = []
        for c in r.captures:
            path = folder / f"{stem}-{c.viewport}-{c.delay_ms}.png"
            path.write_bytes(c.png)
            out.append(str(path))
        return out

    async def grade(self, sequence: Sequence) -> Grade:
        files, entry, how = self.page_files(sequence.answer or "")
        m = self.metrics
        if files is None:
            m.update({"grade/gated": 1.0, "grade/gate_no_page": 1.0, "grade/pixel": 0.0})
            return Grade(0.0, passed=False, transcript=f"page {how}: no HTML page to render")
        try:
            r = await render(files, entry=entry)
        except ValueError as e:
            m.update({"grade/gated": 1.0, "grade/gate_no_page": 1.0, "grade/pixel": 0.0})
            return Grade(0.0, passed=False, transcript=f"page {how}: {e}")
        m["grade/render_s"] = r.seconds
        shots = await asyncio.to_thread(self._save, r)
        source = files.get(entry, b"").decode("utf-8", "replace")
        if self.task.layout is None:
            return self._open_grade(r, shots, source, how)
        ref = await reference(self.task)
        s = await asyncio.to_thread(sim.score, r, ref["rgb"], self.task.texts, rd.VIEWPORTS)
        m.update({"grade/gated": float(s.gate is not None), "grade/pixel": s.pixel, "grade/structure": s.structure,
                  **{f"grade/gate_{g}": float(s.gate == g) for g in sim.GATES}})
        if s.gate is not None:
            detail = "; ".join((r.console_errors + r.page_errors + r.failed_requests)[:3])
            return Grade(0.0, passed=False, transcript=f"page {how}: gate {s.gate!r} closed {detail}".rstrip(),
                         artifact=source)
        passed = s.structure == 1.0 and s.pixel >= PASS_PIXEL
        per = ", ".join(f"{k} {v:.3f}" for k, v in s.per_viewport.items())
        return Grade(s.reward, passed=passed, artifact=source,
                     transcript=f"page {how}: rendered in {r.seconds:.2f} s; pixel {s.pixel:.3f} ({per}); structure "
                                f"{s.structure:.2f}; reward {s.pixel:.3f} x (0.5 + 0.5 x {s.structure:.2f}) = "
                                f"{s.reward:.4f}")

    def _open_grade(self, r, shots: list[str], source: str, how: str) -> Grade:
        """Open-ended: the runtime gate now; the pick judge scores the group later. The screenshot
        paths ride in the artifact's first line, which rlonce writes (the page follows)."""
        closed = sim.gate(r, rd.VIEWPORTS)
        self.metrics.update({"grade/gated": float(closed is not None),
                             **{f"grade/gate_{g}": float(closed == g) for g in sim.GATES}})
        header = SHOTS_HEADER + " ".join(p for p in shots if "-desktop-" in p) + " -->\n"
        return Grade(0.0, passed=False, artifact=header + source,
                     transcript=f"page {how}: rendered in {r.seconds:.2f} s; "
                                + (f"gate {closed!r} closed" if closed else "runtime gate passed; the pick follows"))

    async def cleanup(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
