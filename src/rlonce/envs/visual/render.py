"""Render a page the policy wrote (HTML/CSS/JS) with headless Chromium, in a fresh sandbox.

Everything the page does is hostile. Each render gets its own ``CgroupSandbox``: a fresh
workspace holding only the page files, no network (an empty network namespace; every request
that is not one of the page's own files is also aborted in the browser and recorded), nothing of
the host but the system directories, the fonts, Playwright and the in-sandbox script
(``render_page.py``), all read-only. Memory is bounded by a memory cgroup (Chromium cannot live
under an address-space rlimit) and V8's heap by a flag; time by a deadline the script keeps
(a watchdog ends it even when the page hangs the renderer) and by the sandbox's wall clock
behind it. Closing the sandbox kills every process of the render.

What the page leaves behind is read like any agent output: ``get_file`` (regular files only,
size-capped, no link followed), and the JSON report is validated field by field (types, counts,
string lengths), since a page that escaped the renderer could have written it.

Failures are split by whose they are: a page that hangs, crashes its renderer, or exhausts its
memory gives a ``RenderResult`` with ``timed_out``/``crashed`` set (the model's failure, scored);
a browser or sandbox that cannot start, or a report that is missing for a reason that is not the
page's, raises ``RenderError`` (an infrastructure failure, never a 0 score).

Not defended here: what a renderer exploit could do inside the sandbox (see
``rlonce.sandbox.bwrap`` for what bounds it); a page learning it is rendered headless by means
subtler than ``navigator.webdriver`` and the user agent (e.g. GPU strings, timing).
"""

from __future__ import annotations

import asyncio
import json
import math
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from rlonce.errors import RlonceError
from rlonce.sandbox import hostfs
from rlonce.sandbox.base import SandboxError
from rlonce.sandbox.bwrap import Limits
from rlonce.sandbox.cgroup import CgroupSandbox


@dataclass(frozen=True)
class Viewport:
    name: str
    width: int
    height: int


VIEWPORTS = (Viewport("desktop", 640, 400), Viewport("mobile", 360, 640))
CAPTURE_DELAYS_MS = (0, 300)
"""A capture right after ``load``, another 300 ms later."""
MAX_PAGE_BYTES = 1 << 20
"""All page files together."""
MAX_PAGE_FILES = 64
CHROMIUM = "/usr/lib/chromium/chromium"
"""The real binary: ``/usr/bin/chromium`` is a shell wrapper that does not work in the sandbox."""
SANDBOX_DIR = "/opt/rlonce-render"
MAX_TEXTS = 200
MAX_ITEMS = 100
MAX_CHARS = 1000
MAX_PNG_BYTES = 8 << 20
EXIT_SLACK_S = 1.0
"""What the render keeps of its time limit for the sandbox to end and the host to read the report."""


class BrowserMissing(RlonceError):
    pass


class RenderError(RlonceError):
    """The sandbox or the browser failed, not the page: an infrastructure failure."""


@dataclass
class Capture:
    viewport: str
    delay_ms: int
    png: bytes
    """A viewport-sized screenshot (not the full page)."""


@dataclass
class RenderResult:
    captures: list[Capture]
    console_errors: list[str]
    page_errors: list[str]
    failed_requests: list[str]
    """URLs that failed to load (any network attempt fails: there is no network)."""
    doc_size: dict[str, tuple[int, int]]
    """Viewport name -> (scrollWidth, scrollHeight)."""
    texts: dict[str, list[dict]]
    """Viewport name -> visible text elements in document order (at most 200): ``text``, the box
    of the text itself in page pixels ``x``/``y``/``w``/``h``, ``color``, ``background`` (the first
    non-transparent background colour of the element or an ancestor, white if none) as CSS rgb
    strings, and ``font_px``."""
    raster_coverage: dict[str, float]
    """Viewport name -> share of the first screen painted by images, whatever paints them (elements,
    pseudo-elements, CSS image properties, SVG; ``render_page.py`` says which), the largest of the
    measures taken after each screenshot; 1 where image paint could not be bounded."""
    seconds: float
    timed_out: bool = False
    """The page did not finish within the time limit (its fault)."""
    crashed: bool = False
    """The renderer crashed or ran out of memory (its fault)."""
    memory_capped: bool = False
    """Whether a memory cgroup bounded the render."""
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds per phase (``sandbox_start``, ``driver_start``, ``browser_launch``, ``load_<vp>``,
    ``viewport_<vp>``) and ``peak_memory_mb``, for benchmarks."""

    @property
    def runtime_ok(self) -> bool:
        return not (self.console_errors or self.page_errors or self.failed_requests or self.timed_out
                    or self.crashed)


def require_browser() -> str:
    if not Path(CHROMIUM).is_file():
        raise BrowserMissing("Chromium is not installed: install the Debian package 'chromium' "
                             "(`apt-get install chromium`, or `make visual`)")
    return CHROMIUM


def check_files(files: dict[str, bytes], entry: str) -> None:
    """ValueError unless ``files`` is at most 64 relative paths to bytes, at most
    ``MAX_PAGE_BYTES`` together, with ``entry`` among them."""
    if len(files) > MAX_PAGE_FILES:
        raise ValueError(f"a page has at most {MAX_PAGE_FILES} files, got {len(files)}")
    total = 0
    for rel, data in files.items():
        parts = PurePosixPath(rel).parts if isinstance(rel, str) else ()
        if not parts or rel.startswith("/") or any(p in ("..", ".") for p in parts) or "\\" in rel or "\0" in rel:
            raise ValueError(f"page file path {rel!r} must be relative, without '..' or '.'")
        if not isinstance(data, bytes):
            raise ValueError(f"page file {rel!r} must be bytes")
        total += len(data)
    if total > MAX_PAGE_BYTES:
        raise ValueError(f"page files hold {total} bytes, over the {MAX_PAGE_BYTES}-byte cap")
    if entry not in files:
        raise ValueError(f"entry {entry!r} is not among the page files")


def read_page_files(root: Path, max_files: int = MAX_PAGE_FILES) -> dict[str, bytes]:
    """The files under ``root`` (e.g. a page the agent wrote in its workspace), for ``render``:
    ``hostfs.HostileFile`` (the agent's failure) for a symlink, FIFO or device anywhere, more than
    ``max_files`` files, or more than ``MAX_PAGE_BYTES`` in all."""
    import stat

    files: dict[str, bytes] = {}
    total = 0
    for rel, st in hostfs.walk(root, max_depth=16):
        if stat.S_ISDIR(st.st_mode):
            continue
        if not stat.S_ISREG(st.st_mode):
            raise hostfs.HostileFile(f"page file {rel!r} is a symlink or not a regular file")
        if len(files) >= max_files:
            raise hostfs.HostileFile(f"the page has more than {max_files} files")
        files[rel] = hostfs.read_file(root, rel, MAX_PAGE_BYTES - total)
        total += len(files[rel])
    return files


def _sandbox(memory_mb: int, timeout_s: float) -> CgroupSandbox:
    """A fresh sandbox that sees the fonts, Playwright and greenlet (read-only) and the script."""
    try:
        import greenlet
        import playwright
    except ImportError:
        raise BrowserMissing("Playwright is not installed: install rlonce's dependencies "
                             "(`pip install -e .`, or `make visual`)") from None
    binds = {"/etc/fonts": "/etc/fonts",
             str(Path(__file__).with_name("render_page.py")): f"{SANDBOX_DIR}/render_page.py",
             str(Path(playwright.__file__).resolve().parent): f"{SANDBOX_DIR}/site/playwright",
             str(Path(greenlet.__file__).resolve().parent): f"{SANDBOX_DIR}/site/greenlet"}
    if Path("/var/cache/fontconfig").is_dir():
        binds["/var/cache/fontconfig"] = "/var/cache/fontconfig"
    limits = Limits(cpu_seconds=math.ceil(timeout_s) + 10, address_space_mb=0, processes=512, file_size_mb=16,
                    wall_seconds=timeout_s, output_bytes=1 << 14, workspace_mb=64, tmp_mb=256)
    return CgroupSandbox(limits, memory_mb=memory_mb, cgroup_prefix="rlonce-render", ro_binds=binds,
                         env={"PYTHONPATH": f"{SANDBOX_DIR}/site", "PYTHONDONTWRITEBYTECODE": "1",
                              "XDG_CACHE_HOME": "/tmp/cache", "XDG_CONFIG_HOME": "/tmp/config"})


async def render(files: dict[str, bytes], *, entry: str = "index.html", viewports=VIEWPORTS,
                 delays_ms=CAPTURE_DELAYS_MS, memory_mb: int = 768, timeout_s: float = 12.0) -> RenderResult:
    """Render ``files`` (relative path -> bytes) opened at ``file:///work/page/<entry>``, one
    browser launch for all ``viewports``, a screenshot at each of ``delays_ms`` after ``load``;
    done within ``timeout_s`` whatever the page does."""
    t0 = time.perf_counter()
    deadline = time.time() + timeout_s - EXIT_SLACK_S
    check_files(files, entry)
    require_browser()
    viewports, delays = tuple(viewports), sorted(int(d) for d in delays_ms)
    if len({v.name for v in viewports}) != len(viewports):
        raise ValueError("viewport names must be distinct")
    try:
        box = _sandbox(memory_mb, timeout_s)
    except SandboxError as e:
        raise RenderError(f"the render sandbox could not be made: {e}") from e
    try:
        for rel, data in files.items():
            try:
                box.put_file(f"page/{rel}", data)
            except hostfs.HostileFile as e:
                raise ValueError(f"page files clash: {e}") from None
        job = {"entry": entry, "deadline": deadline, "delays_ms": delays,
               "viewports": [{"name": v.name, "width": v.width, "height": v.height} for v in viewports],
               "viewport_index": {v.name: i for i, v in enumerate(viewports)}}
        t_exec = time.perf_counter()
        box.put_file("job.json", json.dumps({**job, "started": time.time()}))
        try:
            res = await box.exec(f"exec /usr/bin/python3 -S {SANDBOX_DIR}/render_page.py",
                                 timeout=max(1.0, timeout_s - EXIT_SLACK_S / 2 - (time.perf_counter() - t0)))
        except SandboxError as e:
            raise RenderError(f"the render sandbox failed: {e}") from e
        try:
            result = _result(box, _read_report(box), viewports, delays, oom=box.oom_kills(),
                             wall_timed_out=res.timed_out, output=res.output)
        except _Tampered as e:
            result = RenderResult([], [], [f"the render's output was tampered with: {e}"], [], {}, {}, {}, 0.0,
                                  crashed=True, memory_capped=box.memory_capped)
        result.phases["sandbox_start"] = round(t_exec - t0, 4)
        result.phases["exec"] = round(res.seconds, 4)
        if (peak := box.peak_memory_mb()) is not None:
            result.phases["peak_memory_mb"] = round(peak, 1)
    finally:
        await asyncio.to_thread(box.close)
    result.seconds = time.perf_counter() - t0
    return result


class _Tampered(Exception):
    """The report is not what ``render_page.py`` writes: only the sandbox's contents could do that."""


def _read_report(box: CgroupSandbox) -> dict | None:
    try:
        raw = box.get_file("out/report.json", max_bytes=4 << 20)
    except FileNotFoundError:
        return None
    except hostfs.HostileFile as e:
        raise _Tampered(str(e)) from None
    try:
        report = json.loads(raw)
    except (ValueError, RecursionError):
        raise _Tampered("report.json is not JSON") from None
    if not isinstance(report, dict):
        raise _Tampered("report.json is not an object")
    return report


def _strs(value, n: int = MAX_ITEMS, chars: int = MAX_CHARS) -> list[str]:
    return [v[:chars] for v in value[:n] if isinstance(v, str)] if isinstance(value, list) else []


def _num(value, lo: float = -1e7, hi: float = 1e7) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _Tampered(f"{value!r} is not a number")
    return min(max(float(value), lo), hi)


def _text(item) -> dict:
    if not isinstance(item, dict) or not isinstance(item.get("text"), str):
        raise _Tampered("a text entry is malformed")
    out = {"text": item["text"][:200]}
    out.update({k: int(_num(item.get(k))) for k in ("x", "y", "w", "h")})
    for k in ("color", "background"):
        out[k] = item[k][:64] if isinstance(item.get(k), str) else ""
    out["font_px"] = _num(item.get("font_px", 0), 0, 1e4)
    return out


def _facts(facts) -> tuple[tuple[int, int], list[dict], float]:
    if not isinstance(facts, dict) or not isinstance(facts.get("doc_size"), list) or len(facts["doc_size"]) != 2:
        raise _Tampered("DOM facts are malformed")
    w, h = (int(_num(v, 0)) for v in facts["doc_size"])
    texts = facts.get("texts")
    if not isinstance(texts, list):
        raise _Tampered("texts is not a list")
    return (w, h), [_text(t) for t in texts[:MAX_TEXTS]], _num(facts.get("raster_coverage"), 0.0, 1.0)


def png_size(png: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG's header, or None if ``png`` does not start like a PNG."""
    if len(png) < 24 or png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", png[16:24])


def _captures(box: CgroupSandbox, viewports, delays) -> list[Capture]:
    out = []
    for i, vp in enumerate(viewports):
        for k, delay in enumerate(delays):
            try:
                png = box.get_file(f"out/{i}-{k}.png", max_bytes=MAX_PNG_BYTES)
            except FileNotFoundError:
                continue
            except hostfs.HostileFile as e:
                raise _Tampered(str(e)) from None
            if png_size(png) != (vp.width, vp.height):
                raise _Tampered(f"the {vp.name} capture at {delay} ms is not a {vp.width}x{vp.height} PNG")
            out.append(Capture(vp.name, delay, png))
    return out


def _result(box: CgroupSandbox, report: dict | None, viewports, delays, *, oom: int, wall_timed_out: bool,
            output: str) -> RenderResult:
    """The result of a finished render: ``RenderError`` when the browser never got the page."""
    capped = box.memory_capped
    empty = dict(captures=[], console_errors=[], page_errors=[], failed_requests=[], doc_size={}, texts={},
                 raster_coverage={}, seconds=0.0, memory_capped=capped)
    if report is None or not report.get("launched"):
        error = report.get("error") if report else None
        if oom:
            return RenderResult(**empty, crashed=True)
        if wall_timed_out or (report and report.get("timed_out")):
            if report is None:  # the watchdog itself did not get to run: the page starved it
                return RenderResult(**empty, timed_out=True)
            raise RenderError("the browser did not start within the render's time limit")
        tail = error if isinstance(error, str) else output[-MAX_CHARS:]
        raise RenderError(f"the render sandbox failed before the browser started: {tail.strip()[-MAX_CHARS:]}")
    if isinstance(report.get("error"), str):
        raise RenderError(f"render_page.py failed: {report['error'][-MAX_CHARS:]}")
    result = RenderResult(**empty, timed_out=report.get("timed_out") is True or wall_timed_out,
                          crashed=report.get("crashed") is True or oom > 0)
    result.console_errors = _strs(report.get("console_errors"))
    result.page_errors = _strs(report.get("page_errors"))
    result.failed_requests = _strs(report.get("failed_requests"))
    result.captures = _captures(box, viewports, delays)
    facts = report.get("facts") if isinstance(report.get("facts"), dict) else {}
    for vp in viewports:
        if vp.name in facts:
            result.doc_size[vp.name], result.texts[vp.name], result.raster_coverage[vp.name] = _facts(facts[vp.name])
    phases = report.get("phases") if isinstance(report.get("phases"), dict) else {}
    result.phases = {k[:64]: _num(v, 0.0) for k, v in list(phases.items())[:32]}
    return result
