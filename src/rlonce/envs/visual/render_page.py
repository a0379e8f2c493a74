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

The page cannot reach anything but its own files: every request that is not under
``file:///work/page/`` is aborted (and recorded). DOM facts are read in an isolated world over
CDP, so a page that replaces ``getComputedStyle`` or ``getBoundingClientRect`` cannot lie about
its own layout. The browser hides the usual automation signals (``navigator.webdriver``, the
``HeadlessChrome`` user agent).
"""

import asyncio
import json
import os
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
  const MAX_TEXTS = 200, MAX_TEXT_NODES = 20000, MAX_ELEMENTS = 5000, MAX_RECTS = 1000;
  const W = innerWidth, H = innerHeight, sx = scrollX, sy = scrollY;
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
  const rects = [];
  const add = el => {
    if (rects.length >= MAX_RECTS || !visible(el)) return;
    const q = el.getBoundingClientRect();
    const x0 = Math.max(0, q.left), y0 = Math.max(0, q.top), x1 = Math.min(W, q.right), y1 = Math.min(H, q.bottom);
    if (x1 > x0 && y1 > y0) rects.push([x0, y0, x1, y1]);
  };
  const raster = document.querySelectorAll("img,canvas,video,iframe,frame,object,embed,image,input[type=image]");
  for (let i = 0; i < raster.length && i < MAX_ELEMENTS; i++) add(raster[i]);
  const all = document.getElementsByTagName("*");
  for (let i = 0; i < all.length && i < MAX_ELEMENTS; i++) {
    if (getComputedStyle(all[i]).backgroundImage.includes("url(")) add(all[i]);
  }
  const xs = [...new Set(rects.flatMap(q => [q[0], q[2]]))].sort((a, b) => a - b);
  let area = 0;
  for (let i = 0; i + 1 < xs.length; i++) {
    const a = xs[i], c = xs[i + 1];
    const ys = rects.filter(q => q[0] <= a && q[2] >= c).map(q => [q[1], q[3]]).sort((p, q) => p[0] - q[0]);
    let cover = 0, top = -Infinity, bot = -Infinity;
    for (const [y0, y1] of ys) {
      if (y0 > bot) { cover += bot - top > 0 ? bot - top : 0; top = y0; bot = y1; }
      else bot = Math.max(bot, y1);
    }
    cover += bot - top > 0 ? bot - top : 0;
    area += cover * (c - a);
  }
  return {doc_size: docSize, texts, raster_coverage: W * H > 0 ? Math.min(1, area / (W * H)) : 0};
})()
"""


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


async def facts(page, deadline):
    """DOM facts read in an isolated world (the page's own globals may have been replaced)."""
    cdp = await page.context.new_cdp_session(page)
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
    page = await ctx.new_page()
    page.on("console", lambda m: m.type == "error" and report.note("console_errors", m.text))
    page.on("pageerror", lambda e: report.note("page_errors", str(e)))
    page.on("requestfailed", lambda r: report.note("failed_requests", r.url))
    page.on("crash", lambda p: report.set("crashed", True))
    page.on("dialog", quietly(lambda d: d.dismiss()))
    page.on("popup", quietly(lambda p: p.close()))
    await page.clock.install(time=PAGE_EPOCH_MS)
    await page.clock.pause_at(PAGE_EPOCH_MS + 1000)  # the page's timers wait for run_for below
    await page.goto(PAGE_ROOT + job["entry"], wait_until="load", timeout=left_ms(deadline))
    loaded, page_ms = time.time(), 0
    report.set("phases", round(loaded - t0, 4), f"load_{name}")
    for k, delay in enumerate(job["delays_ms"]):  # sorted
        # the page's clock moves by exactly the delay (timers due at load run first), however slow this host is
        await page.clock.run_for(delay - page_ms)
        page_ms = delay
        wait = delay / 1000 - (time.time() - loaded)
        if wait > 0:  # and the wall clock at least as far (CSS animations run on it)
            await asyncio.sleep(wait)
        png = await page.screenshot(timeout=left_ms(deadline))
        with open(f"{OUT}/{job['viewport_index'][name]}-{k}.png", "wb") as f:
            f.write(png)
    report.set("facts", await facts(page, deadline), name)
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
                                           ignore_default_args=["--enable-automation"], timeout=left_ms(deadline))
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
