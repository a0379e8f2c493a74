"""Page render time: ``rlonce.envs.visual.render.render`` on representative pages, next to the same
in-sandbox script run bare on the host (same Chromium, same steps, no sandbox or cgroup), in one run.

    python benchmarks/render/run.py --out DIR [--repeats 3]

Pages: plain text, cards and a table in a CSS grid, a form, a page whose JavaScript builds its
DOM, and a page of about 1 MB. Each is rendered ``--repeats`` times with the default viewports
(desktop and mobile) and capture delays (0 and 300 ms), interleaved with the bare run. Seconds
per render (p50/p95/max), the ratio to the 2.0 s target and to the bare run, and the median split
(sandbox start, Python start in the sandbox, Playwright driver start, browser launch, load and
whole time per viewport, peak memory of the cgroup) go to ``results.json``, ``results.md`` and ``render.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 2.0
PHASES = ["sandbox_start", "python_start", "driver_start", "browser_launch", "load_desktop", "load_mobile",
          "viewport_desktop", "viewport_mobile", "script", "exec", "peak_memory_mb"]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


STYLE = "<style>body{font-family:sans-serif;margin:0;padding:16px;color:#222}</style>"


def pages() -> dict[str, bytes]:
    plain = f"<!doctype html><title>Plain</title>{STYLE}<h1>Release notes</h1>" + "".join(
        f"<p>Paragraph {i}: the quick brown fox jumps over the lazy dog.</p>" for i in range(12))
    cards = "".join(f"<div class=card><h3>Plan {i}</h3><p>${9 * i}/month</p><button>Choose</button></div>"
                    for i in range(6))
    rows = "".join(f"<tr><td>Item {i}</td><td>{i * 3}</td><td>{i * 1.5:.1f}</td></tr>" for i in range(20))
    grid = (f"<!doctype html>{STYLE}<style>.grid{{display:grid;"
            "grid-template-columns:repeat(auto-fill,minmax(150px,1fr));gap:12px}"
            ".card{border:1px solid #ccc;border-radius:8px;padding:12px;background:#f7f9fc}"
            "table{border-collapse:collapse;width:100%;margin-top:16px}td{border:1px solid #ddd;padding:4px}</style>"
            f"<h1>Pricing</h1><div class=grid>{cards}</div><table>{rows}</table>")
    form = (f"<!doctype html>{STYLE}<style>label{{display:block;margin-top:8px}}input,select,textarea{{width:100%;"
            "padding:6px;box-sizing:border-box}</style><h1>Sign up</h1><form>"
            "<label>Name<input name=n placeholder='Ada Lovelace'></label><label>Email<input type=email></label>"
            "<label>Plan<select><option>Free</option><option>Pro</option></select></label>"
            "<label>About<textarea rows=4></textarea></label><label><input type=checkbox style='width:auto'> "
            "I agree</label><button type=submit>Create account</button></form>")
    js = (f"<!doctype html>{STYLE}<h1>Dashboard</h1><ul id=l></ul><script>const l = document.getElementById('l');"
          "for (let i = 0; i < 500; i++) { const li = document.createElement('li'); li.textContent = 'Row ' + i;"
          "li.style.color = i % 2 ? '#333' : '#06c'; l.appendChild(li); }</script>")
    filler = "".join(f"<p>Block {i}: " + "lorem ipsum dolor sit amet " * 30 + "</p>" for i in range(1200))
    big = f"<!doctype html>{STYLE}<h1>Archive</h1>{filler}"
    out = {"plain": plain, "css_grid": grid, "form": form, "js_dom": js, "1mb": big[: (1 << 20) - 64]}
    return {k: v.encode() for k, v in out.items()}


def bare(html: bytes) -> float:
    """The in-sandbox script run directly on the host (paths redirected to a temporary folder)."""
    from rlonce.envs.visual import render as R

    d = Path(tempfile.mkdtemp(prefix="render-bare-"))
    (d / "page").mkdir()
    (d / "page" / "index.html").write_bytes(html)
    vps = [{"name": v.name, "width": v.width, "height": v.height} for v in R.VIEWPORTS]
    t0 = time.perf_counter()
    (d / "job.json").write_text(json.dumps({
        "entry": "index.html", "deadline": time.time() + 30, "delays_ms": list(R.CAPTURE_DELAYS_MS), "viewports": vps,
        "viewport_index": {v["name"]: i for i, v in enumerate(vps)}}))
    script = Path(R.__file__).with_name("render_page.py")
    code = (f"import sys; sys.path.insert(0, {str(script.parent)!r}); import render_page as m; "
            f"m.JOB = {str(d / 'job.json')!r}; m.OUT = {str(d / 'out')!r}; m.PAGE_ROOT = {f'file://{d}/page/'!r}; "
            "m.main()")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    seconds = time.perf_counter() - t0
    report = json.loads((d / "out" / "report.json").read_text())
    assert report["launched"] and not report["timed_out"] and not report["error"], report
    subprocess.run(["rm", "-rf", str(d)], check=True)
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description="page render time, sandboxed vs bare")
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from rlonce.envs.visual.render import render

    rows, every, phases = {}, [], {p: [] for p in PHASES}
    asyncio.run(render({"index.html": b"<p>warm-up</p>"}))
    for name, html in pages().items():
        sb, br = [], []
        for _ in range(args.repeats):
            r = asyncio.run(render({"index.html": html}))
            assert r.runtime_ok and len(r.captures) == 4, (name, r.console_errors, r.page_errors, r.timed_out)
            sb.append(r.seconds)
            for p in PHASES:
                if p in r.phases:
                    phases[p].append(r.phases[p])
            br.append(bare(html))
        every += sb
        rows[name] = {"bytes": len(html), "n": len(sb), "p50_s": pct(sb, 0.5), "p95_s": pct(sb, 0.95),
                      "max_s": max(sb), "bare_p50_s": pct(br, 0.5), "bare_p95_s": pct(br, 0.95),
                      "ratio_target_p50": pct(sb, 0.5) / TARGET_S, "ratio_bare_p50": pct(sb, 0.5) / pct(br, 0.5),
                      "texts_desktop": len(r.texts.get("desktop", [])), "memory_capped": r.memory_capped}
    rows["all"] = {"bytes": 0, "n": len(every), "p50_s": pct(every, 0.5), "p95_s": pct(every, 0.95),
                   "max_s": max(every), "ratio_target_p50": pct(every, 0.5) / TARGET_S,
                   "ratio_target_p95": pct(every, 0.95) / TARGET_S}
    split = {p: statistics.median(v) for p, v in phases.items() if v}
    (out / "results.json").write_text(json.dumps({"target_s": TARGET_S, "pages": rows, "phases_median": split},
                                                 indent=2) + "\n")
    from rlonce.telemetry.bench import paired_bars, write_table

    names = [n for n in rows if n != "all"]
    table = write_table(out / "results.md", ["page", "bytes", "n", "render p50 / p95 / max (s)", "bare p50 (s)",
                                             "p50 / 2.0 s target", "p50 / bare"],
                        [[n, str(rows[n]["bytes"]), str(rows[n]["n"]),
                          f"{rows[n]['p50_s']:.2f} / {rows[n]['p95_s']:.2f} / {rows[n]['max_s']:.2f}",
                          f"{rows[n]['bare_p50_s']:.2f}", f"{rows[n]['ratio_target_p50']:.2f}",
                          f"{rows[n]['ratio_bare_p50']:.2f}"] for n in names]
                        + [["all", "", str(rows["all"]["n"]),
                            f"{rows['all']['p50_s']:.2f} / {rows['all']['p95_s']:.2f} / {rows['all']['max_s']:.2f}",
                            "", f"{rows['all']['ratio_target_p50']:.2f}", ""]])
    split_table = "\n".join(f"| {p} | {v:.3f} |" for p, v in split.items())
    with open(out / "results.md", "a") as f:
        f.write(f"\nMedian split (seconds; peak_memory_mb in MiB):\n\n| phase | median |\n|---|---|\n{split_table}\n")
    print(table)
    print(split_table)
    paired_bars(out / "render.png", names, {"sandboxed (p50)": [rows[n]["p50_s"] for n in names],
                                            "bare (p50)": [rows[n]["bare_p50_s"] for n in names],
                                            "target": [TARGET_S] * len(names)},
                ylabel="seconds per render", title="Page render time (2 viewports x 2 captures)", log=False)


if __name__ == "__main__":
    main()
