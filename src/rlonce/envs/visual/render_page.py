"""Render one hostile page with headless Chromium, inside the render sandbox (a plain script: it
imports nothing of rlonce; ``rlonce.envs.visual.render`` binds it in and runs it with the system
Python and the venv's Playwright).

It reads the job from ``/work/job.json``, opens ``file:///work/page/<entry>`` once per viewport
(one browser launch, a fresh context per viewport), takes a viewport-sized screenshot at each
delay, reads DOM facts, and writes the PNGs and ``report.json`` into ``/work/out``. Whatever the
page does, it finishes by the job's deadline: every Playwright call is given the time left, and
a watchdog thread writes the report as it stands and exits at the deadline (a page stuck in
``while(true){}`` blocks even ``evaluate``); exiting ends the sandbox's pid namespace, and with
it the browser.

**The image gate's measure** (``raster_coverage``) is the share of the viewport painted by images,
whatever paints them: read over CDP from the layout tree (``DOMSnapshot``), which holds every box
with its transformed bounds, ``::before``/``::after``/``::marker`` and anonymous boxes, shadow
trees, and what script added after load. A box paints an image when it is an ``img``, ``canvas``,
``video``, frame, ``object``/``embed``, ``input type=image`` or SVG ``image``/``use``, or when its
``background-image``, ``content``, ``border-image-source``, ``mask-image`` (and the ``-webkit-``
mask box), a marker's ``list-style-image``, ``filter`` or ``backdrop-filter`` holds a ``url()``,
``image-set()``, ``cross-fade()``, ``element()``, ``paint()`` or any list of more than 16 colours
(an SVG shape likewise for a ``fill``/``stroke`` that is not a gradient). Gradients of a few
colours are decoration, not a picture, and do not count. The union of those boxes, clipped to the
viewport, is counted in whole pixels right after each screenshot (the largest is reported). Image
paint the gate cannot bound by a box counts as the whole viewport (fail closed):
more than 20,000 boxes or 2,000 image boxes, a replaced element whose content is not clipped to its
box, a ``border-image`` outset, an SVG filter from another file, an SVG image, ``feImage`` or
``use`` inside a pattern, marker, mask or filter, ``-webkit-box-reflect``, and shadows of more than
16 colours. Not measured: pictures drawn with many small plain boxes or SVG shapes, and glyphs of a
web font the page brings.

The page cannot reach anything but its own files: every request that is not under
``file:///work/page/`` is aborted (and recorded). DOM facts are read in an isolated world over
CDP, so a page that replaces ``getComputedStyle`` or ``getBoundingClientRect`` cannot lie about
its own layout. The browser hides the usual automation signals (``navigator.webdriver``, the
``HeadlessChrome`` user agent).
"""

import asyncio
import json
import os
import re
import threading
import time
import traceback

JOB = "/work/job.json"
OUT = "/work/out"
PAGE_ROOT = "file:///work/page/"
CHROMIUM = "/usr/lib/chromium/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--disable-breakpad",
        "--disable-blink-features=AutomationControlled", "--js-flags=--max-old-space-size=256"]
NO_WINDOW_OPEN = ("Object.defineProperty(window, 'open', "
                  "{value: function open() { return null; }, writable: false, configurable: false});")
"""A page's ``window.open`` returns ``null``, as under a popup blocker: Chromium's own blocker (kept on,
``--disable-popup-blocking`` dropped) refuses popups at load, but the page's timers run inside
``clock.run_for``, which Playwright evaluates as a user gesture. The popups left (a ``target=_blank``
link clicked from a timer) are closed between clock runs."""
PAGE_EPOCH_MS = 1_767_225_600_000
"""The page's clock starts paused at 2026-01-01 00:00 UTC (``Date.now()``, timers, animation frames:
Playwright's fake clock) and moves only by each capture's delay: a first capture "at load" sees the
page before any of its timers fire, on an idle host or a loaded one."""
MAX_ITEMS = 100
MAX_CHARS = 1000
SLACK_S = 0.3
"""How long before the deadline each Playwright call gives up, so a slow page is reported by the
call's own timeout (the watchdog being the backstop)."""

FACTS_JS = r"""
(() => {
  const MAX_TEXTS = 200, MAX_TEXT_NODES = 20000;
  const sx = scrollX, sy = scrollY;
  const de = document.documentElement, body = document.body;
  const docSize = [Math.max(de ? de.scrollWidth : 0, body ? body.scrollWidth : 0),
                   Math.max(de ? de.scrollHeight : 0, body ? body.scrollHeight : 0)];
  const visible = el => el.checkVisibility({opacityProperty: true, visibilityProperty: true});
  const SKIP = new Set(["SCRIPT", "STYLE", "NOSCRIPT", "TEMPLATE", "HEAD", "TITLE"]);
  const bg = el => {
    for (let e = el; e; e = e.parentElement) {
      const c = getComputedStyle(e).backgroundColor;
      if (c && c !== "transparent" && !/^rgba\(.*,\s*0\)$/.test(c)) return c;
    }
    return "rgb(255, 255, 255)";
  };
  const groups = new Map();
  const walker = document.createTreeWalker(body || de || document, NodeFilter.SHOW_TEXT);
  for (let n = 0, node; n < MAX_TEXT_NODES && (node = walker.nextNode()); n++) {
    const el = node.parentElement;
    if (!el || SKIP.has(el.tagName) || !node.data.trim()) continue;
    if (!groups.has(el)) groups.set(el, []);
    groups.get(el).push(node);
  }
  const texts = [];
  const range = document.createRange();
  for (const [el, nodes] of groups) {
    if (texts.length >= MAX_TEXTS) break;
    if (!visible(el)) continue;
    let l = Infinity, t = Infinity, r = -Infinity, b = -Infinity;
    for (const node of nodes) {
      range.selectNodeContents(node);
      const q = range.getBoundingClientRect();
      if (q.width <= 0 || q.height <= 0) continue;
      l = Math.min(l, q.left); t = Math.min(t, q.top); r = Math.max(r, q.right); b = Math.max(b, q.bottom);
    }
    if (!(r > l && b > t)) continue;
    const st = getComputedStyle(el);
    texts.push({text: nodes.map(x => x.data).join(" ").replace(/\s+/g, " ").trim().slice(0, 200),
                x: Math.round(l + sx), y: Math.round(t + sy), w: Math.round(r - l), h: Math.round(b - t),
                color: st.color, background: bg(el), font_px: parseFloat(st.fontSize) || 0});
  }
  return {doc_size: docSize, texts};
})()
"""


IMAGE_STYLES = ("background-image", "content", "border-image-source", "border-image-outset", "mask-image",
                "-webkit-mask-box-image-source", "list-style-image", "filter", "backdrop-filter", "fill", "stroke",
                "box-shadow", "text-shadow", "-webkit-box-reflect", "overflow-x", "overflow-y",
                "overflow-clip-margin", "object-fit", "object-position")
"""The computed styles the image gate reads for every box (pseudo-elements and anonymous boxes too)."""
IMAGE_FN = re.compile(r"(?<![\w-])(?:-webkit-)?(?:url|image|image-set|cross-fade|element|paint|canvas)\(")
"""A CSS image that is not a gradient (``paint()`` is a worklet that draws what it likes)."""
COLOUR_FN = re.compile(r"(?<![\w-])(?:rgba?|hsla?|hwb|lab|lch|oklab|oklch|color)\(")
MAX_COLOURS = 16
"""A gradient or shadow list with more colours than this is a picture drawn in CSS, not decoration."""
REPLACED = {"IMG", "VIDEO", "CANVAS", "OBJECT", "EMBED", "IFRAME", "FRAME", "PORTAL", "FENCEDFRAME", "image"}
SVG_SHAPES = {"rect", "circle", "ellipse", "line", "polyline", "polygon", "path", "text", "tspan", "textPath"}
SVG_RESOURCES = {"defs", "symbol", "pattern", "marker", "mask", "filter", "clipPath"}
GRADIENTS = {"linearGradient", "radialGradient"}
MAX_BOXES = 20_000
"""More layout boxes than this and the gate closes: the page is not measured, it is refused."""
MAX_IMAGE_BOXES = 2_000
"""More image-painting boxes than this and the gate closes."""


class Unplaceable(Exception):
    """Image paint the gate cannot place on the screen: the gate closes (coverage 1)."""


def _is_image(value):
    return bool(IMAGE_FN.search(value)) or len(COLOUR_FN.findall(value)) > MAX_COLOURS


def _clipped(style):
    """A replaced element's content stays inside its box: clipped, or scaled to fill it unmoved."""
    if style["overflow-x"] in ("clip", "hidden") and style["overflow-y"] in ("clip", "hidden"):
        return style["overflow-clip-margin"] in ("0px", "content-box", "content-box 0px")
    return style["object-fit"] == "fill" and style["object-position"] in ("50% 50%", "center")


def _fragment(value, page_url):
    m = re.search(r'url\("?([^")]*)"?\)', value)
    if not m:
        return None
    url = m.group(1)
    return url.split("#", 1)[1] if "#" in url and (url.startswith("#") or url.startswith(page_url + "#")) else None


def image_boxes(snapshot):
    """The page-pixel boxes (x0, y0, x1, y1) that paint images in the main document of a
    ``DOMSnapshot.captureSnapshot`` taken with ``IMAGE_STYLES``; ``Unplaceable`` when some image
    paint cannot be bounded by a box."""
    strings = snapshot["strings"]
    doc = snapshot["documents"][0]
    nodes, layout = doc["nodes"], doc["layout"]
    at = lambda i: strings[i] if i >= 0 else ""  # noqa: E731
    page_url = at(doc["documentURL"]).split("#", 1)[0]
    names = [at(i) for i in nodes["nodeName"]]
    parents = nodes["parentIndex"]
    pseudo = dict(zip(nodes.get("pseudoType", {}).get("index", []),
                      (at(v) for v in nodes.get("pseudoType", {}).get("value", []))))
    attrs = {}
    ids = {}
    for i, a in enumerate(nodes.get("attributes", [])):
        pairs = {at(a[k]): at(a[k + 1]) for k in range(0, len(a) - 1, 2)}
        attrs[i] = pairs
        if pairs.get("id"):
            ids.setdefault(pairs["id"], i)
    if len(layout["nodeIndex"]) > MAX_BOXES:
        raise Unplaceable(f"more than {MAX_BOXES} boxes")

    def ancestors(i):
        i = parents[i]
        while i >= 0:
            yield i
            i = parents[i]

    def under(i, kinds):
        return any(names[a] in kinds for a in ancestors(i))

    for i, name in enumerate(names):  # an image inside an SVG resource paints wherever the resource is used
        if name in ("image", "feImage", "foreignObject", "use") and under(i, SVG_RESOURCES):
            if name != "use" or under(i, {"pattern", "marker", "mask", "filter"}):
                raise Unplaceable(f"an SVG {name} inside a resource")
    first = {}
    for k, i in enumerate(layout["nodeIndex"]):
        first.setdefault(i, k)

    def style_of(k):
        return dict(zip(IMAGE_STYLES, (at(v) for v in layout["styles"][k])))

    def svg_root(i):
        root = None
        for a in ancestors(i):
            if names[a] == "svg":
                root = a
        return root

    boxes = []
    for k, i in enumerate(layout["nodeIndex"]):
        name = names[i]
        if name == "#text" or name.startswith("#"):
            continue
        style = style_of(k)
        x, y, w, h = layout["bounds"][k]
        box = [x, y, x + w, y + h]
        paints, replaced = False, name in REPLACED
        if name == "INPUT" and attrs.get(i, {}).get("type", "").lower() == "image":
            replaced = True
        if style["content"] not in ("normal", "none", "") and _is_image(style["content"]):
            paints = True
            replaced = replaced or i not in pseudo
        for prop in ("background-image", "mask-image", "-webkit-mask-box-image-source"):
            paints = paints or _is_image(style[prop])
        if _is_image(style["border-image-source"]):
            paints = True
            if style["border-image-outset"] not in ("0", "0px"):
                raise Unplaceable("border-image painted outside its box")
        if pseudo.get(i) == "marker" and _is_image(style["list-style-image"]):
            paints = True
        for prop in ("box-shadow", "text-shadow"):
            if len(COLOUR_FN.findall(style[prop])) > MAX_COLOURS:
                raise Unplaceable(f"{prop} with more than {MAX_COLOURS} colours")
        if style["-webkit-box-reflect"] not in ("none", ""):
            raise Unplaceable("-webkit-box-reflect")
        for prop in ("filter", "backdrop-filter"):
            if "url(" in style[prop]:
                target = ids.get(_fragment(style[prop], page_url) or "\0")
                if target is None or names[target] != "filter":
                    raise Unplaceable(f"{prop} from outside the page")
                paints = True
        if name in SVG_SHAPES:
            for prop in ("fill", "stroke"):
                if "url(" in style[prop]:
                    target = ids.get(_fragment(style[prop], page_url) or "\0")
                    if target is None or names[target] not in GRADIENTS:
                        paints = True
        if name in ("image", "use"):
            paints = True
        if replaced:
            paints = True
            if not _clipped(style):
                raise Unplaceable(f"a {name} not clipped to its box")
        if not paints:
            continue
        if name in ("image", "use") or name in SVG_SHAPES:
            root = svg_root(i)
            if root is not None and root in first:  # drawn within the outermost <svg>, when that clips
                if not _clipped(style_of(first[root])):
                    raise Unplaceable("an SVG that paints images outside its box")
                rx, ry, rw, rh = layout["bounds"][first[root]]
                box = [min(x, rx), min(y, ry), max(x + w, rx + rw), max(y + h, ry + rh)]
        boxes.append(box)
        if len(boxes) > MAX_IMAGE_BOXES:
            raise Unplaceable(f"more than {MAX_IMAGE_BOXES} image boxes")
    return boxes


def coverage(boxes, left, top, width, height):
    """The share of the viewport (``width`` x ``height`` at page offset ``left``, ``top``) that the
    union of ``boxes`` covers, counted in whole pixels (a box's edges rounded outwards)."""
    import math

    rows = [bytearray(width) for _ in range(height)]
    ones = b"\x01" * width
    for x0, y0, x1, y1 in boxes:
        a, b = max(0, math.floor(x0 - left)), min(width, math.ceil(x1 - left))
        c, d = max(0, math.floor(y0 - top)), min(height, math.ceil(y1 - top))
        if a < b:
            for y in range(c, d):
                rows[y][a:b] = ones[:b - a]
    return sum(r.count(1) for r in rows) / (width * height) if width * height else 0.0


async def image_coverage(cdp, vp, deadline):
    """The share of the viewport painted by images now (1 when some image paint cannot be placed):
    read over CDP from the layout tree, which holds pseudo-elements, anonymous boxes and shadow
    trees, with their transformed bounds."""
    snap = await asyncio.wait_for(cdp.send("DOMSnapshot.captureSnapshot", {"computedStyles": list(IMAGE_STYLES)}),
                                  left_ms(deadline) / 1000)
    try:
        boxes = image_boxes(snap)
    except Unplaceable:
        return 1.0
    doc = snap["documents"][0]
    return coverage(boxes, doc.get("scrollOffsetX", 0), doc.get("scrollOffsetY", 0), vp["width"], vp["height"])


class Report:
    """The report as it stands, shared with the watchdog thread (every change under ``lock``)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.data = {"launched": False, "timed_out": False, "crashed": False, "error": None,
                     "console_errors": [], "page_errors": [], "failed_requests": [],
                     "captures": [], "facts": {}, "phases": {}}

    def note(self, key, text):
        with self.lock:
            items = self.data[key]
            if len(items) < MAX_ITEMS and text[:MAX_CHARS] not in items:
                items.append(text[:MAX_CHARS])

    def set(self, key, value, sub=None):
        with self.lock:
            if sub is None:
                self.data[key] = value
            else:
                self.data[key][sub] = value

    def write(self):
        with self.lock:
            text = json.dumps(self.data)
        with open(OUT + "/report.json.tmp", "w") as f:
            f.write(text)
        os.replace(OUT + "/report.json.tmp", OUT + "/report.json")


def watchdog(report, deadline):
    def fire():
        report.set("timed_out", True)
        report.write()
        os._exit(0)

    timer = threading.Timer(max(0.0, deadline - time.time()), fire)
    timer.daemon = True
    timer.start()


def left_ms(deadline):
    return max(1.0, (deadline - time.time() - SLACK_S) * 1000)


def quietly(fn):
    """An event handler that ignores errors (the page or context may be gone by the time it runs)."""
    async def run(arg):
        try:
            await fn(arg)
        except Exception:
            pass
    return run


@quietly
async def route(r):
    if r.request.url.startswith(PAGE_ROOT):
        await r.continue_()
    else:
        await r.abort()


async def facts(cdp, deadline):
    """DOM facts read in an isolated world (the page's own globals may have been replaced)."""
    frame = (await cdp.send("Page.getFrameTree"))["frameTree"]["frame"]["id"]
    world = await cdp.send("Page.createIsolatedWorld", {"frameId": frame, "worldName": "rlonce-facts"})
    res = await asyncio.wait_for(cdp.send("Runtime.evaluate", {
        "expression": FACTS_JS, "contextId": world["executionContextId"], "returnByValue": True,
        "timeout": left_ms(deadline)}), left_ms(deadline) / 1000)
    if "exceptionDetails" in res:
        raise RuntimeError(f"facts: {res['exceptionDetails'].get('text')}")
    return res["result"]["value"]


async def one_viewport(browser, job, vp, report, deadline, ua):
    t0 = time.time()
    name = vp["name"]
    ctx = await browser.new_context(viewport={"width": vp["width"], "height": vp["height"]}, device_scale_factor=1,
                                    user_agent=ua, service_workers="block", accept_downloads=False)
    await ctx.route("**/*", route)
    await ctx.add_init_script(NO_WINDOW_OPEN)
    page = await ctx.new_page()
    page.on("console", lambda m: m.type == "error" and report.note("console_errors", m.text))
    page.on("pageerror", lambda e: report.note("page_errors", str(e)))
    page.on("requestfailed", lambda r: report.note("failed_requests", r.url))
    page.on("crash", lambda p: report.set("crashed", True))
    page.on("dialog", quietly(lambda d: d.dismiss()))
    others = []  # popups left (NO_WINDOW_OPEN): closed between clock runs, as closing one during
    ctx.on("page", lambda p: others.append(p))  # run_for stops it ("Target page ... has been closed")
    await page.clock.install(time=PAGE_EPOCH_MS)
    await page.clock.pause_at(PAGE_EPOCH_MS + 1000)  # the page's timers wait for run_for below
    await page.goto(PAGE_ROOT + job["entry"], wait_until="load", timeout=left_ms(deadline))
    cdp = await ctx.new_cdp_session(page)
    loaded, page_ms, covered = time.time(), 0, 0.0
    report.set("phases", round(loaded - t0, 4), f"load_{name}")
    for k, delay in enumerate(job["delays_ms"]):  # sorted
        # the page's clock moves by exactly the delay (timers due at load run first), however slow this host is
        await page.clock.run_for(delay - page_ms)
        page_ms = delay
        while others:
            await quietly(lambda p: p.close())(others.pop())
        wait = delay / 1000 - (time.time() - loaded)
        if wait > 0:  # and the wall clock at least as far (CSS animations run on it)
            await asyncio.sleep(wait)
        png = await page.screenshot(timeout=left_ms(deadline))  # measured right after, with the page's clock stopped
        covered = max(covered, await image_coverage(cdp, vp, deadline))
        with open(f"{OUT}/{job['viewport_index'][name]}-{k}.png", "wb") as f:
            f.write(png)
    report.set("facts", {**await facts(cdp, deadline), "raster_coverage": covered}, name)
    report.set("phases", round(time.time() - t0, 4), f"viewport_{name}")


async def guarded(browser, job, vp, report, deadline, ua):
    """One viewport; the page's failures (a hang, a crash, navigating away) go into the report."""
    from playwright.async_api import Error, TimeoutError

    try:
        await one_viewport(browser, job, vp, report, deadline, ua)
    except (TimeoutError, asyncio.TimeoutError):
        report.set("timed_out", True)
    except Error as e:
        if time.time() >= deadline - SLACK_S:
            report.set("timed_out", True)
        elif report.data["crashed"] or not browser.is_connected():
            report.set("crashed", True)
        else:
            report.note("page_errors", f"rendering stopped: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


async def run(job, report, t_start):
    from playwright.async_api import async_playwright

    deadline = job["deadline"]
    async with async_playwright() as pw:
        report.set("phases", round(time.time() - t_start, 4), "driver_start")
        t0 = time.time()
        browser = await pw.chromium.launch(executable_path=CHROMIUM, chromium_sandbox=False, args=ARGS,
                                           ignore_default_args=["--enable-automation", "--disable-popup-blocking"],
                                           timeout=left_ms(deadline))
        report.set("launched", True)
        report.set("phases", round(time.time() - t0, 4), "browser_launch")
        ua = ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
              f"Chrome/{browser.version.split('.')[0]}.0.0.0 Safari/537.36")
        await asyncio.gather(*(guarded(browser, job, vp, report, deadline, ua) for vp in job["viewports"]))
        report.set("phases", round(time.time() - t_start, 4), "script")
        report.write()
        os._exit(0)  # the pid namespace ends with this process: no need to wait for browser.close()


def main():
    t_start = time.time()
    with open(JOB) as f:
        job = json.load(f)
    os.makedirs(OUT, exist_ok=True)
    report = Report()
    report.set("phases", round(t_start - job.get("started", t_start), 4), "python_start")
    watchdog(report, job["deadline"])
    try:
        asyncio.run(run(job, report, t_start))
    except Exception:
        report.set("error", traceback.format_exc()[-MAX_CHARS:])
    report.write()
    os._exit(0)


if __name__ == "__main__":
    main()
