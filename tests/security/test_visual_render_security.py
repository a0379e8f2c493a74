"""Hostile pages against the renderer, rendered by real Chromium in a real sandbox: a page must not
reach the host's network or files, must not outlive its time limit or its memory cap (and must
leave no process behind), must not see that a bot drives the browser, and must not lie to the
DOM facts by replacing the page's own JavaScript globals. Page files that are links, too many or
too large are refused before anything starts.

Network probes reach only a test server on this machine's loopback."""

import asyncio
import io
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import slack

from rlonce.envs.visual.render import MAX_PAGE_BYTES, VIEWPORTS, check_files, read_page_files, render
from rlonce.sandbox.hostfs import HostileFile
from rlonce.sandbox.memcg import memory_root

DESKTOP = (VIEWPORTS[0],)


def page(html: str, **kw):
    kw.setdefault("viewports", DESKTOP)
    kw.setdefault("delays_ms", (0,))
    return asyncio.run(render({"index.html": html.encode()}, **kw))


def all_text(r) -> str:
    return "\n".join(t["text"] for ts in r.texts.values() for t in ts)


MINE = f"rlonce-render-{os.getpid()}-"
"""The names of this process's render cgroups (another pytest worker renders beside it)."""


def render_pids() -> set[int]:
    """Processes in a render's memory cgroup below this process's own (what renders started)."""
    root = memory_root()
    if root is None:
        return set()
    own = str(root)[len("/sys/fs/cgroup/memory"):]
    pids = set()
    for p in Path("/proc").iterdir():
        try:
            lines = (p / "cgroup").read_text().splitlines()
        except (OSError, ValueError):
            continue
        if any(line.split(":", 2)[2].startswith(f"{own}/{MINE}") for line in lines if ":memory:" in line):
            pids.add(int(p.name))
    return pids


def leftover_cgroups() -> list[str]:
    root = memory_root()
    return sorted(p.name for p in root.glob(f"{MINE}*")) if root else []


def live() -> tuple[set[int], set[str]]:
    return render_pids(), set(leftover_cgroups())


@pytest.fixture
def loopback_server():
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"SERVER-SECRET")

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", hits
    srv.shutdown()
    srv.server_close()


@pytest.mark.browser
@pytest.mark.sandbox
@pytest.mark.usefixtures("chromium")
def test_page_cannot_reach_a_loopback_server(loopback_server):
    url, hits = loopback_server
    r = page(f"<img src='{url}/img'><iframe src='{url}/frame'></iframe>"
             f"<link rel=stylesheet href='{url}/css'><p id=o>start</p><script>"
             f"fetch('{url}/fetch').then(x => x.text()).then(t => o.textContent = 'got ' + t,"
             f"  e => o.textContent = 'fetch failed');"
             f"try {{ new WebSocket('{url.replace('http', 'ws')}/ws') }} catch (e) {{}}"
             f"navigator.sendBeacon('{url}/beacon', 'x');</script>", delays_ms=(0, 300))
    time.sleep(0.2)
    assert hits == []
    assert {f"{url}/img", f"{url}/frame", f"{url}/css", f"{url}/fetch"} <= set(r.failed_requests)
    assert "fetch failed" in all_text(r) and "SERVER-SECRET" not in all_text(r)
    assert not r.runtime_ok and not r.timed_out


READER = """<p id=o>none</p><iframe id=f src='{url}'></iframe><script>
const show = s => document.getElementById('o').textContent += ' | ' + s;
fetch('{url}').then(x => x.text()).then(t => show('fetched ' + t), e => show('fetch failed'));
const x = new XMLHttpRequest();
try {{ x.open('GET', '{url}', false); x.send(); show('xhr ' + x.responseText) }} catch (e) {{ show('xhr failed') }}
f.onload = () => {{ try {{ show('frame ' + f.contentDocument.body.innerText) }} catch (e) {{ show('frame denied') }} }};
</script>"""


@pytest.mark.browser
@pytest.mark.sandbox
@pytest.mark.usefixtures("chromium")
def test_page_cannot_read_files_outside_its_own():
    """/etc/passwd (not even mounted inside), and files that do exist inside the sandbox but are not
    the page's: the job file, the in-sandbox script, a system file, a path climbing out of the page."""
    targets = ["file:///etc/passwd", "file:///work/job.json", "file:///opt/rlonce-render/render_page.py",
               "file:///usr/share/common-licenses/GPL-3"]
    files = {f"p{i}.html": READER.format(url=u).encode() for i, u in enumerate(targets)}
    files["index.html"] = ("<p>reader</p>" + "".join(f"<iframe src='p{i}.html' width=600 height=80></iframe>"
                                                     for i in range(len(targets)))
                           + "<iframe src='../job.json'></iframe>").encode()
    r = asyncio.run(render(files, viewports=DESKTOP, delays_ms=(0, 300)))
    assert set(targets) | {"file:///work/job.json"} <= set(r.failed_requests)
    # the top-level texts are the index page's; what the frames read never reaches the report
    text = all_text(r)
    assert "root:" not in text and "deadline" not in text and "GNU" not in text and "playwright" not in text


@pytest.mark.browser
@pytest.mark.sandbox
@pytest.mark.usefixtures("chromium")
def test_frames_that_read_files_show_nothing():
    """The reader itself as the top page: every read fails, and the page says so in its own text."""
    r = page(READER.format(url="file:///work/job.json"), delays_ms=(0, 300))
    text = all_text(r)
    assert "fetch failed" in text and "xhr failed" in text and "deadline" not in text
    assert "file:///work/job.json" in r.failed_requests


def _no_process_left(before: tuple[set[int], set[str]]) -> None:
    """No process of a render started since ``before`` is alive, and its cgroup is gone (sets, so
    that a render of another test process under the same cgroup is not counted)."""
    pids, groups = before
    deadline = time.monotonic() + 2
    while render_pids() - pids and time.monotonic() < deadline:
        time.sleep(0.05)
    assert render_pids() - pids == set()
    assert set(leftover_cgroups()) - groups == set()


@pytest.mark.browser
@pytest.mark.sandbox
@pytest.mark.usefixtures("chromium")
def test_infinite_loop_ends_on_time_and_leaves_nothing():
    before = live()
    t0 = time.perf_counter()
    r = page("<p>spin</p><script>while (true) {}</script>", timeout_s=5)
    assert r.seconds < slack(5) and time.perf_counter() - t0 < slack(5.5)
    assert r.timed_out and not r.runtime_ok and r.captures == []
    _no_process_left(before)


@pytest.mark.skipif(os.geteuid() != 0 or memory_root() is None,
                    reason="without a memory cgroup a memory bomb would be bounded by nothing but the host")
@pytest.mark.browser
@pytest.mark.sandbox
@pytest.mark.usefixtures("chromium")
def test_memory_bomb_is_stopped_by_the_cgroup():
    before = live()
    t0 = time.perf_counter()
    r = page("<script>const a = []; while (true) a.push(new Uint8Array(32 << 20).fill(7));</script>",
             memory_mb=512, timeout_s=8)
    assert r.seconds < slack(8) and time.perf_counter() - t0 < slack(8.5)
    assert r.memory_capped and r.crashed and not r.runtime_ok
    assert r.phases["peak_memory_mb"] <= 512
    _no_process_left(before)


@pytest.mark.browser
@pytest.mark.sandbox
@pytest.mark.usefixtures("chromium")
def test_page_sees_no_bot_cannot_lie_to_the_facts_and_survives_dialogs():
    r = page("""<body style='margin:0'><h1 id=o style='color:rgb(1,2,3)'>x</h1><script>
      o.textContent = 'webdriver=' + navigator.webdriver + ' ua=' +
        (/Headless/.test(navigator.userAgent) ? 'headless' : 'plain');
      alert('a'); confirm('b'); prompt('c'); window.open('index.html');
      window.getComputedStyle = () => ({color: 'rgb(255, 255, 255)', backgroundColor: 'rgb(0, 0, 0)'});
      Element.prototype.getBoundingClientRect = () => ({left: 0, top: 0, right: 9999, bottom: 9999});
      Range.prototype.getBoundingClientRect = Element.prototype.getBoundingClientRect;
      Element.prototype.checkVisibility = () => false;
      document.createTreeWalker = () => ({nextNode: () => null});
    </script></body>""", delays_ms=(0, 300))
    assert not r.timed_out and not r.crashed
    [h1] = r.texts["desktop"]
    assert h1["text"] == "webdriver=false ua=plain"
    assert h1["color"] == "rgb(1, 2, 3)" and h1["background"] == "rgb(255, 255, 255)"
    assert h1["x"] == 0 and 0 < h1["w"] < 640 and 0 < h1["h"] < 100
    assert r.runtime_ok


def test_popups_are_blocked_however_the_page_opens_them():
    """No popup survives a clock run: ``window.open`` returns null (at load, in a frame, from a timer,
    which Playwright's clock runs as a user gesture), and a ``target=_blank`` link or form fired from
    a timer opens a page that is closed between runs. A page opening itself from its timers neither
    multiplies nor stops the render (a popup closed mid ``run_for`` used to end a third of such
    renders on a loaded host)."""
    for _ in range(3):
        r = page("""<body style='margin:0'><h1 id=o>x</h1><a id=l href='index.html' target=_blank>l</a>
          <form id=f action='index.html' target=_blank></form><iframe id=fr srcdoc='<p>i</p>'></iframe><script>
          var got = [];
          function tryall() {
            got.push(window.open('index.html') === null);
            try { got.push(fr.contentWindow.open('index.html') === null); } catch (e) { got.push(true); }
            l.click(); f.submit(); o.textContent = 'refused=' + got.every(x => x) + ' n=' + got.length;
          }
          tryall(); setTimeout(tryall, 0); setTimeout(tryall, 100); setInterval(() => l.click(), 5);
        </script></body>""", delays_ms=(0, 300, 600))
        assert not r.timed_out and not r.crashed and r.runtime_ok, r.page_errors
        assert "refused=true n=6" in [t["text"] for t in r.texts["desktop"]]


def test_page_files_that_are_links_or_too_many_or_too_large_are_refused(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<p>hi</p>")
    (site / "css").mkdir()
    (site / "css" / "a.css").write_text("p{}")
    assert read_page_files(site) == {"index.html": b"<p>hi</p>", "css/a.css": b"p{}"}
    os.symlink("/etc/passwd", site / "leak.html")
    with pytest.raises(HostileFile, match="symlink"):
        read_page_files(site)
    (site / "leak.html").unlink()
    os.symlink("/etc", site / "etc")
    with pytest.raises(HostileFile, match="symlink"):
        read_page_files(site)
    (site / "etc").unlink()
    os.mkfifo(site / "fifo.html")
    with pytest.raises(HostileFile):
        read_page_files(site)
    (site / "fifo.html").unlink()
    (site / "big.bin").write_bytes(b"x" * MAX_PAGE_BYTES)
    with pytest.raises(HostileFile, match="cap"):
        read_page_files(site)
    (site / "big.bin").unlink()
    for i in range(64):
        (site / f"f{i}.html").write_text("x")
    with pytest.raises(HostileFile, match="more than 64 files"):
        read_page_files(site)

    ok = {"index.html": b"x"}
    check_files(ok, "index.html")
    for bad, match in [({"../x.html": b"x", **ok}, "relative"), ({"/etc/passwd": b"x", **ok}, "relative"),
                       ({"a/../../x": b"x", **ok}, "relative"), ({f"f{i}": b"" for i in range(65)}, "at most 64"),
                       ({"index.html": b"x" * (MAX_PAGE_BYTES + 1)}, "cap"), ({"index.html": "str"}, "bytes"),
                       ({"other.html": b"x"}, "entry")]:
        with pytest.raises(ValueError, match=match):
            check_files(bad, "index.html")
    with pytest.raises(ValueError, match="relative"):
        asyncio.run(render({"index.html": b"x", "../../etc/x": b"y"}))


def test_a_late_paint_is_caught_at_load_however_slow_the_host():
    """The page's clock (timers, animation frames, ``Date``) is the renderer's: it moves by exactly
    each capture's delay, so a page that paints 150 ms after load is blank at 149 ms and painted
    at 151 ms, even when a screenshot takes longer than that (a loaded host: the attack that
    made the wall-clock capture "at load" see the late paint)."""
    from PIL import Image

    late = ("<body style='margin:0;background:#fff'><div id=b style='width:100vw;height:100vh'></div><script>"
            "const t0 = Date.now(); setTimeout(() => { b.style.background = '#f00'; b.title = Date.now() - t0 }, 150)"
            "</script></body>")
    r = page(late, delays_ms=(0, 149, 151))
    assert r.runtime_ok and not r.timed_out
    colours = [Image.open(io.BytesIO(c.png)).convert("RGB").getpixel((5, 5)) for c in r.captures]
    assert colours == [(255, 255, 255), (255, 255, 255), (255, 0, 0)], colours
