"""Attacks on `rlonce view`: a run whose stored text (prompt, tool call, observation, task id,
arm, failure cause) is HTML and script, served by a real uvicorn server on 127.0.0.1 and probed
with path traversal, a foreign Host header (DNS rebinding), cross-site fetches and other methods.
The page must hand hostile text to the browser only as JSON data, never serve a file the client
names, and answer only loopback hosts."""

import http.client
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from rlonce.core.records import Context, FailureCategory, Role, Sample, Segment, Sequence, Status, sequence_to_rows
from rlonce.errors import UsageError
from rlonce.gateway.server import ServerThread
from rlonce.recipes.view import STATIC, listen, make_app
from rlonce.recipes.view_data import RunView
from rlonce.telemetry.rollouts import write_step

PAYLOADS = ["<script>window.__pwned=1</script>", "<img src=x onerror=\"window.__pwned=2\">",
            "\"><svg onload=window.__pwned=3>", "</textarea><iframe src=javascript:alert(4)>"]
SECRET = "CONFIG-SECRET-7f3a"


def _model(lm, text: str, version: int = 0) -> Segment:
    ids = lm.encode(text)
    return Segment(Role.MODEL, ids, logprobs=[-0.5] * len(ids), versions=[version] * len(ids))


def _sequence(lm, reward: float, status=Status.SUBMITTED) -> Sequence:
    segs = [Segment(Role.PROMPT, lm.encode(f"<|im_start|>user\n{PAYLOADS[0]}<|im_end|>\n<|im_start|>assistant\n")),
            _model(lm, f'<tool_call>\n{{"name": "bash", "arguments": {{"command": "{PAYLOADS[1][:12]}"}}}}\n'
                       f"</tool_call><|im_end|>"),
            Segment(Role.OBSERVATION, lm.encode(f"\n<|im_start|>user\n<tool_response>\n{PAYLOADS[2]}\n"
                                                "</tool_response><|im_end|>\n<|im_start|>assistant\n")),
            _model(lm, f"{PAYLOADS[3]}<|im_end|>")]
    return Sequence("toolfind/<b>evil</b>", PAYLOADS[0], [Context(segs)], status=status, reward=reward,
                    passed=reward > 0, turns=2, metrics={"seconds": 1.0})


def hostile_run(root: Path, lm, embedded_dir: Path) -> Path:
    """A one-step run whose every stored text field carries an HTML/script payload."""
    run = root / "hostile"
    ck = run / "checkpoints" / "step-0001"
    ck.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(embedded_dir / name, ck / name)
    (run / "config.json").write_text(json.dumps({"sources": [], "note": SECRET}))
    good, bad = _sequence(lm, 1.0), _sequence(lm, 0.0)
    broken = Sequence("toolfind/<b>evil</b>", "mini-bash", status=Status.INFRA, failure=FailureCategory.SANDBOX_ERROR,
                      cause=PAYLOADS[1])
    sample = Sample("toolfind/<b>evil</b>", "toolfind", 1, [good, broken, bad])
    gid = sample.group_id
    sample.signal = {gid: {"scores": [1.0, 0.0], "passed": [True, False], "group_advantages": [0.5, -0.5],
                           "advantages": [0.5, -0.5], "rows": [0, 1]}}
    rows = sequence_to_rows(good, 0.5, group_id=gid) + sequence_to_rows(bad, -0.5, group_id=gid)
    write_step(run, 1, rows, [sample], train_version=0, staleness={"toolfind": 1}, untrained=[_sequence(lm, 0.0)])
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": float("nan"), "entropy": 0.1}) + "\n")
    return run


@pytest.fixture(scope="module")
def server(tmp_path_factory, lm, embedded_dir):
    run = hostile_run(tmp_path_factory.mktemp("view"), lm, embedded_dir)
    with ServerThread(make_app(RunView(run))) as srv:
        yield srv, run


def _request(srv, target: str, *, host: str | None = "default", method: str = "GET", headers=()):
    """Send ``target`` verbatim (no client-side normalisation of ``..``), with the Host given."""
    url = urlsplit(srv.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
    if host is not None:
        conn.putheader("Host", url.netloc if host == "default" else host)
    for k, v in headers:
        conn.putheader(k, v)
    conn.endheaders()
    r = conn.getresponse()
    body = r.read().decode("utf-8", "replace")
    conn.close()
    return r.status, dict((k.lower(), v) for k, v in r.getheaders()), body


def test_hostile_text_reaches_the_page_only_as_json_data(server):
    srv, _ = server
    status, headers, body = _request(srv, "/api/steps/1/rows/0")
    assert status == 200 and headers["content-type"] == "application/json"
    assert headers["x-content-type-options"] == "nosniff"
    csp = headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp and "unsafe" not in csp
    ctx = json.loads(body)
    text = "".join(ctx["pieces"])
    assert PAYLOADS[0] in text and PAYLOADS[2] in text and PAYLOADS[3] in text  # kept exactly, as data
    assert ctx["outcome"]["arm"] == PAYLOADS[0] and ctx["trainer_logprobs"] is None
    step = json.loads(_request(srv, "/api/steps/1")[2])
    infra = step["groups"][0]["sequences"][1]
    assert infra["cause"] == PAYLOADS[1] and infra["score"] is None and not infra["retained"]
    assert json.loads(_request(srv, "/api/run")[2])["steps"][0]["metrics"]["reward_mean"] is None  # NaN: null


def test_the_page_never_turns_text_into_markup():
    """Static check of the shipped page: no HTML sink in the script, no inline script, style or
    handler in the HTML (the CSP would refuse them anyway)."""
    js = (STATIC / "view.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "setAttribute", "srcdoc"):
        assert sink not in js, sink
    html = (STATIC / "index.html").read_text()
    assert re.findall(r"<script\b[^>]*>", html) == ['<script src="/view.js" defer>']
    assert "style=" not in html and not re.search(r"\son\w+=", html) and "<style" not in html
    assert not re.search(r"https?://", js + html + (STATIC / "view.css").read_text())  # nothing from elsewhere


@pytest.mark.parametrize("target", [
    "/../config.json", "/%2e%2e/config.json", "/view.js/../../config.json", "/api/steps/1/../../config.json",
    "/api/steps/..%2f..%2fconfig.json", "/api/steps/1/rows/..%2f..%2fconfig.json", "/api/steps/-1",
    "/api/steps/1/rows/-1", "/api/steps/1/rows/99999999999999999999999", "/api/steps/1.0", "/api/steps/0x1",
    "/api/plots/-1.png", "/api/plots/999.png", "/api/plots/..%2f..%2fconfig.json", "/etc/passwd",
    "//etc/passwd", "/static/../../config.json", "/docs", "/openapi.json", "/api/steps/1/untrained/5",
])
def test_no_path_reaches_the_file_system(server, target):
    srv, _ = server
    status, _, body = _request(srv, target)
    assert status in (400, 404), (target, status)
    assert SECRET not in body and "root:" not in body


@pytest.mark.parametrize("host, ok", [
    ("evil.example", False), ("evil.example:80", False), ("127.0.0.1.nip.io", False), ("localhost.evil.example", False),
    ("0.0.0.0", False), ("10.0.0.1", False), (None, False), ("", False),
    ("localhost", True), ("127.0.0.1", True), ("[::1]", True), ("default", True),
])
def test_only_loopback_hosts_are_answered(server, host, ok):
    """A rebinding page (its name resolved to 127.0.0.1) sends its own name as Host: refused.
    (HTTP/1.1 without a Host is refused by the HTTP parser already: 400.)"""
    srv, _ = server
    status, headers, body = _request(srv, "/api/run", host=host)
    assert status == 200 if ok else status == (400 if host is None else 403), (host, status)
    assert SECRET not in body and (host is None or headers["x-content-type-options"] == "nosniff")


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE"])
def test_only_get_is_served(server, method):
    srv, _ = server
    assert _request(srv, "/api/run", method=method)[0] == 405


def test_cross_site_fetches_are_refused(server):
    srv, _ = server
    assert _request(srv, "/api/run", headers=[("Sec-Fetch-Site", "cross-site")])[0] == 403
    assert _request(srv, "/api/run", headers=[("Sec-Fetch-Site", "same-origin")])[0] == 200


def test_a_non_loopback_bind_is_refused_in_one_line(server, tmp_path):
    _, run = server
    for host in ("0.0.0.0", "::", "192.0.2.1", "example.com"):
        with pytest.raises(UsageError, match="not a loopback address"):
            listen(host, 0)
    r = subprocess.run([sys.executable, "-m", "rlonce.cli", "view", str(run), "--host", "0.0.0.0", "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not a loopback address" in r.stderr
    r = subprocess.run([sys.executable, "-m", "rlonce.cli", "view", str(tmp_path / "missing")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "does not exist" in r.stderr


@pytest.mark.slow
def test_the_browser_shows_hostile_text_as_text(server):
    """In real headless Chromium: the payloads appear literally, no element or script of theirs
    exists, no dialog opens, no CSP violation is reported (the page needs no inline anything)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: make test-view")
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("chromium is not installed: make test-view")
    srv, _ = server
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=["--no-sandbox"] if os.geteuid() == 0 else [])
        page = browser.new_page()
        dialogs, errors = [], []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(srv.base_url + "/")
        page.wait_for_selector("#groups .seq")
        assert page.text_content("#groups .group-head") == "toolfind/<b>evil</b>"
        page.locator("#groups .group.trained .seq").first.click()
        page.wait_for_selector("#context .tok")
        text = page.text_content("#context")
        assert PAYLOADS[0] in text and PAYLOADS[2] in text and PAYLOADS[3] in text
        page.locator("#groups .group.trained .seq").nth(1).click()  # the infrastructure failure: its cause
        sync_api.expect(page.locator("#verdict")).to_contain_text(PAYLOADS[1])
        planted = "#pane-steps :is(script, img, svg, iframe, b, textarea)"
        assert page.evaluate(f"document.querySelectorAll('{planted}').length") == 0
        assert page.evaluate("window.__pwned === undefined") and dialogs == [] and errors == []
        browser.close()
