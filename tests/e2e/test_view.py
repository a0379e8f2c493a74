"""`rlonce view` in a real headless browser: a short quickstart run, served by the real CLI on
127.0.0.1, opened in Chromium (the Debian package) driven by Playwright. The test walks step ->
group -> sequence and checks what the page shows against the stored columns: the token count,
colour modes and their legends, a filter, the comparison of two steps, the plots; the address of
a sequence opens it in a fresh page, and back returns to the step before.

Needs chromium and playwright: `make test-view` installs both and runs this file."""

import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from rlonce.telemetry.report import PLOTS
from rlonce.telemetry.rollouts import read_step, stored_steps

pytestmark = pytest.mark.slow
INSTALL = "make test-view (or: apt-get install -y chromium && pip install -e '.[browser]')"
QUICK = ["rl.steps=2", "sft.demos=128", "sft.epochs=2", "eval.heldout_tasks=8", "eval.every=0", "checkpoint.every=2",
         "storage.untrained_fraction=1"]


def chromium_browser(playwright):
    """Chromium from apt under Playwright; skips with the install command when either is missing."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip(f"chromium is not installed: {INSTALL}")
    args = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium's own sandbox refuses to run as root
    return playwright.chromium.launch(executable_path=path, args=args)


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason=f"playwright is not installed: {INSTALL}")
    with sync_api.sync_playwright() as p:
        b = chromium_browser(p)
        yield b
        b.close()


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory, browser):
    out = tmp_path_factory.mktemp("view") / "qs"
    subprocess.run([sys.executable, "-m", "rlonce.cli", "quickstart", "--out", str(out), "--quiet", *QUICK],
                   check=True, timeout=1500, stdout=subprocess.DEVNULL)
    return out


@pytest.fixture
def served(quickstart_run):
    """`rlonce view RUN --port 0` as a user runs it; its URL from the line it prints; Ctrl-C at the end."""
    proc = subprocess.Popen([sys.executable, "-m", "rlonce.cli", "view", str(quickstart_run), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    url = re.search(r"http://127\.0\.0\.1:\d+/", line)
    assert url, line + proc.stderr.read()
    yield url.group(0)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0


def _first_shown(meta: dict) -> tuple[str, int, dict]:
    """What a click on the step's first sequence opens: its columns' prefix, its stored row and its
    outcome — the first trained group's first sequence, or (a step that trained nothing) the first
    untrained one."""
    if meta["groups"]:
        g = meta["groups"][0]
        row = next(i for i, r in enumerate(meta["rows"]) if r["group_id"] == g["group_id"] and r["sequence"] == 0)
        return "", row, g["sequences"][0]
    return "untrained_", meta["untrained_rows"].index(0), meta["untrained"][0]


def test_view_walks_a_run_from_steps_to_tokens(quickstart_run, browser, served, tmp_path):
    from playwright.sync_api import expect  # the browser fixture skipped the test if playwright is missing

    page = browser.new_page(viewport={"width": 1500, "height": 950})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(served)
    steps = stored_steps(quickstart_run)
    page.wait_for_selector("#groups .seq")
    assert page.locator("#steps tbody tr").count() == len(steps) == 2

    step = max(steps, key=lambda s: (len(read_step(quickstart_run, s)[0]["groups"]), s))
    page.click(f"#steps tbody tr[data-step='{step}']")
    expect(page.locator("#step-title")).to_have_text(f"Step {step}: groups")
    meta, cols = read_step(quickstart_run, step)
    expect(page.locator("#groups .group.trained")).to_have_count(len(meta["groups"]))
    expect(page.locator("#groups .group.untrained")).to_have_count(len({o["task_id"] for o in meta["untrained"]}))
    first = page.locator("#groups .group").first
    task = (meta["groups"] or meta["untrained"])[0]["task_id"]
    assert first.locator(".group-head").text_content().startswith(task)
    explained = first.locator(".explain dt").all_text_contents()
    want = ["baseline", "normalisation", "filtering"] if meta["groups"] else ["not trained"]
    assert explained[:len(want)] == want
    assert page.evaluate("location.hash") == f"#/step/{step}"

    first.locator(".seq").first.click()
    page.wait_for_selector("#context .tok")
    p, row, outcome = _first_shown(meta)
    a, b = int(cols[p + "row_offsets"][row]), int(cols[p + "row_offsets"][row + 1])
    n, kept = b - a, int(cols[p + "loss_mask"][a:b].sum())
    sampled = int((cols[p + "policy_versions"][a:b] >= 0).sum())
    assert page.locator("#context .tok").count() == n
    said = (f"{n} tokens, of which {kept} model tokens trained" if not p
            else f"{n} tokens, of which {sampled} sampled from the model and none trained")
    assert said in page.text_content("#context-info")
    assert page.locator("#loading").is_hidden()
    link = page.evaluate("location.href")
    assert link.endswith(f"#/step/{step}/group/0/seq/0")
    assert page.locator("#context .turn-prompt").count() == 1 and page.locator("#context .turn-model").count() >= 1
    assert page.locator("#context .turn-model .tok").count() == int((cols[p + "policy_versions"][a:b] >= 0).sum())
    assert f"status {outcome['status']}" in page.text_content("#verdict")

    first_model = page.locator("#context .turn-model .tok").first
    colours = {}
    for mode, says in (("version", f"version {meta['train_version']}"), ("mask", "trained (mask 1)"),
                       ("advantage", "advantage of trained tokens")):
        page.select_option("#mode", mode)
        assert says in page.text_content("#legend"), mode
        colours[mode] = first_model.evaluate("t => t.style.backgroundColor")
    assert len(set(colours.values())) == 3  # each mode colours anew
    coloured = "ts => ts.filter(t => t.style.backgroundColor).length"
    for mode in ("gap", "ratio"):
        page.select_option("#mode", mode)
        if p + "trainer_logprobs" in cols:  # one colour per token the trainer scored, none elsewhere
            assert "trainer − rollout" in page.text_content("#legend")
            scored = int((~np.isnan(cols[p + "trainer_logprobs"][a:b])).sum())
            assert page.locator("#context .tok").evaluate_all(coloured) == scored > 0
        else:  # not stored: said, and nothing coloured
            assert "not recorded in this run" in page.text_content("#legend")
            assert page.locator("#context .tok").evaluate_all(coloured) == 0
    first_model.hover()
    assert "loss mask 1" in page.text_content("#hover")
    page.screenshot(path=str(tmp_path / "sequence.png"))

    linked = browser.new_page(viewport={"width": 1500, "height": 950})  # the address opens the same sequence
    linked.goto(link)
    linked.wait_for_selector("#context .tok")
    assert linked.locator("#context .tok").count() == n
    assert linked.text_content("#context-title") == page.text_content("#context-title")
    linked.click(f"#steps tbody tr[data-step='{min(steps)}']")
    expect(linked.locator("#step-title")).to_have_text(f"Step {min(steps)}: groups")
    assert linked.evaluate("location.hash") == f"#/step/{min(steps)}"
    linked.go_back()
    linked.wait_for_selector("#context .tok")
    assert linked.evaluate("location.href") == link
    linked.close()

    total = sum(len(g["sequences"]) for g in meta["groups"]) + len(meta["untrained"])
    assert page.text_content("#filter-count") == f"showing {total} of {total} sequences"
    page.fill("#f-reward-min", "0.5")
    rewards = [float(x.split()[1]) for x in page.locator("#groups .seq span:nth-child(3)").all_text_contents()]
    want = sum(q["reward"] is not None and q["reward"] >= 0.5 for g in meta["groups"] for q in g["sequences"]) + sum(
        q["reward"] is not None and q["reward"] >= 0.5 for q in meta["untrained"])
    assert len(rewards) == want < total and all(r >= 0.5 for r in rewards)
    assert page.text_content("#filter-count") == f"showing {want} of {total} sequences"

    page.click("#tab-compare")
    page.select_option("#compare-a", "1")
    page.select_option("#compare-b", "2")
    expect(page.locator("#compare-table thead th")).to_have_text(["metric", "step 1", "step 2", "B − A"])
    assert page.locator("#compare-table tbody tr").count() > 10
    assert [page.text_content(f"#compare-col-{x} h2").split(" (")[0] for x in "ab"] == ["Step 1", "Step 2"]

    page.click("#tab-plots")
    images = page.locator("#plots img")
    expect(images).to_have_count(len(PLOTS))  # report.py's curves of a one-source run
    loaded = "imgs => imgs.every(i => i.complete && i.naturalWidth > 0)"  # evaluated by the driver, not by eval
    for _ in range(600):
        if images.evaluate_all(loaded):
            break
        page.wait_for_timeout(100)
    assert images.evaluate_all(loaded)
    assert errors == []
    page.close()
