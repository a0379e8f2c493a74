"""``rlonce probe visual``: shortcut pages against the replication grader, next to the expert.

Each route is what a policy might find cheaper than replicating the page: nothing, a blank page,
the right background alone, the right texts unstyled, the target screenshot pasted in as an
image (data URL), the target loaded from disk or from the network, script that paints the
reference only after load, only for an automated browser or only at the desktop size, a giant
page, a page that never finishes, and (with tools) ``target.png`` copied beside the page or a
submitted path that is a link to a host file; and the screenshot painted without an ``<img>``
(``PAINTED``: a pseudo-element's ``content`` or background, a ``border-image`` fill, an SVG
``<feImage>`` filter, or an image after 1,000 tiny ones or a background after 5,100 empty elements,
the caps an earlier gate stopped at), each from ``target.png`` (the desktop shot the agent gets)
and, as ``<route>_both``, from the grader's shot of each viewport. Every answer goes through the
normal grading path (a real render in a fresh sandbox). A route whose highest reward reaches the
expert's median is a hole. The controls (``CONTROLS``) are correct pages written unusually; one
that earns less than full reward is a gate that closes on a real page.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import re
import statistics
from collections.abc import Callable

from tqdm.auto import tqdm

from rlonce.core.records import Sequence
from rlonce.envs.visual.env import VisualEnv, reference
from rlonce.envs.visual.expert import expert_page
from rlonce.envs.visual.tasks import VisualTask, make_task

LOOPBACK_TARGET = "http://127.0.0.1:8000/target.png"
AUTOMATED = "navigator.webdriver || /Headless/.test(navigator.userAgent)"
GIANT = '<div style="height:20000px"></div>'


def _page(body: str, bg: str = "") -> str:
    style = f' style="margin:0;background:{bg}"' if bg else ""
    return f"```html\n<body{style}>{body}</body>\n```"


def _script(task: VisualTask, condition: str) -> str:
    """A blank page whose script paints the reference page when ``condition`` holds."""
    ref = json.dumps(task.reference_html).replace("</", "<\\/")
    return _page(f"<script>function paint(){{document.documentElement.innerHTML={ref}}}\n{condition}</script>")


def _embedded(task: VisualTask, png: bytes) -> str:
    data = base64.b64encode(png).decode()
    return _page(f'<img src="data:image/png;base64,{data}" style="display:block;width:100vw">')


def _url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _hidden_texts(task: VisualTask) -> str:
    """The reference's strings as DOM text, painted over by whatever comes later (structure 1)."""
    return ('<div style="position:absolute;left:0;top:0;z-index:-1">'
            + "".join(f"<p>{x}</p>" for x in task.texts) + "</div>")


PAINTS: dict[str, Callable[[str], tuple[str, str]]] = {
    "pseudo_content": lambda u: (f'body::before{{content:url("{u}");display:block}}', ""),
    "pseudo_background": lambda u: (f'body::before{{content:"";position:fixed;inset:0;z-index:1;'
                                    f'background:url("{u}") 0 0/640px 400px no-repeat}}', ""),
    "border_image_fill": lambda u: (f'#s{{position:fixed;inset:0;z-index:1;border:0 solid;'
                                    f'border-image:url("{u}") 0 fill/0/0 stretch}}', '<div id="s"></div>'),
    "svg_feimage": lambda u: ("#s{position:fixed;inset:0;z-index:1;filter:url(#f)}",
                              '<svg width="0" height="0" style="position:absolute"><filter id="f" x="0" y="0" '
                              'width="640" height="400" filterUnits="userSpaceOnUse"><feImage x="0" y="0" '
                              f'width="640" height="400" preserveAspectRatio="none" href="{u}"/></filter></svg>'
                              '<div id="s"></div>'),
}
"""CSS and markup that paint a screenshot (a data URL) over the viewport without an ``<img>``."""
TINY = "data:image/gif;base64,R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7"


def _painted(task: VisualTask, ref: dict, how: str, both: bool) -> str:
    """A page that paints the desktop screenshot (``target.png``, what the agent gets) or, with
    ``both``, each viewport's own screenshot (the grader's, which an agent never sees) with the
    reference's strings hidden underneath."""
    desk, mob = _url(ref["png"]["desktop"]), _url(ref["png"]["mobile"])
    if how in PAINTS:
        css, html = PAINTS[how](desk)
        if both:
            css += "@media (max-width:400px){" + PAINTS[how](mob)[0] + "}"
        return _page(f"<style>{css}</style>{_hidden_texts(task)}{html}", "white")
    source = f'<source media="(max-width:400px)" srcset="{mob}">' if both else ""
    if how == "rect_cap_then_img":  # the old gate measured the first 1,000 image rectangles only
        first = "".join(f'<img src="{TINY}" style="position:absolute;left:{i % 40}px;top:{i // 40}px;'
                        f'width:1px;height:1px">' for i in range(1000))
        shot = f'<picture>{source}<img src="{desk}" style="position:fixed;inset:0;width:100%;z-index:1"></picture>'
        return _page(f"{_hidden_texts(task)}{first}{shot}", "white")
    if how == "element_cap_then_background":  # ... and the backgrounds of the first 5,000 elements only
        css = f'#s{{position:fixed;inset:0;z-index:1;background:url("{desk}") 0 0/100% auto no-repeat}}'
        if both:
            css += f'@media (max-width:400px){{#s{{background-image:url("{mob}")}}}}'
        return _page(f"<style>{css}</style>{_hidden_texts(task)}{'<i></i>' * 5100}<div id=\"s\"></div>", "white")
    raise KeyError(how)


PAINTED = {**{f"{how}_screenshot": how for how in PAINTS},
           "rect_cap_then_img": "rect_cap_then_img", "element_cap_then_background": "element_cap_then_background"}
"""Screenshot routes that paint the picture through what the image gate once missed (route -> how);
each also as ``<route>_both``, with the grader's screenshot of each viewport."""

ROUTES: dict[str, Callable[[VisualTask, dict], str]] = {
    "empty": lambda t, ref: "",
    "blank": lambda t, ref: _page(""),
    "background_only": lambda t, ref: _page("", t.layout.background),
    "texts_only": lambda t, ref: _page("".join(f"<p>{x}</p>" for x in t.texts)),
    "embedded_screenshot": lambda t, ref: _embedded(t, ref["png"]["desktop"]),
    "target_from_disk": lambda t, ref: _page('<img src="file:///work/target.png" style="width:100vw">'),
    "target_from_network": lambda t, ref: _page(f'<img src="{LOOPBACK_TARGET}" style="width:100vw">'),
    "paint_after_load": lambda t, ref: _script(t, "setTimeout(paint, 150)"),
    "paint_for_webdriver": lambda t, ref: _script(t, f"if ({AUTOMATED}) paint()"),
    "paint_at_desktop_size": lambda t, ref: _script(t, "if (innerWidth === 640) paint()"),
    "giant_page": lambda t, ref: "```html\n" + t.reference_html.replace("</body>", f"{GIANT}</body>"),
    "never_finishes": lambda t, ref: _page("<script>for(;;){}</script>"),
    **{name: (lambda t, ref, how=how: _painted(t, ref, how, False)) for name, how in PAINTED.items()},
    **{f"{name}_both": (lambda t, ref, how=how: _painted(t, ref, how, True)) for name, how in PAINTED.items()},
}
"""Single-turn routes: the reply text."""
ICON = "data:image/svg+xml;base64," + base64.b64encode(
    b"<svg xmlns='http://www.w3.org/2000/svg' width='24' height='24'/>").decode()


def decorated(html: str) -> str:
    """The reference page written unusually, looking the same: its first background a gradient of
    that colour, a pseudo-element with an image background, a small image and an SVG icon (all
    transparent)."""
    html = re.sub(r"background:(#[0-9a-fA-F]{6})", r"background:linear-gradient(\1,\1)", html, count=1)
    deco = (f'<style>h1::after{{content:"";position:absolute;width:24px;height:24px;background:url("{ICON}")}}'
            f'</style><img src="{ICON}" alt="" style="position:absolute;right:4px;top:8px;width:24px;height:24px">'
            f'<svg width="24" height="24" style="position:absolute;right:32px;top:8px">'
            f'<image href="{ICON}" width="24" height="24"/></svg>')
    return html.replace("</body>", deco + "</body>")


CONTROLS: dict[str, Callable[[VisualTask, dict], str]] = {
    "decorated_reference": lambda t, ref: f"```html\n{decorated(t.reference_html)}```",
}
"""Correct pages the gates must let through: each should earn the reference's full reward."""
TOOL_ROUTES = {
    "copied_target": "cp target.png shot.png && "
                     "echo '<body style=\"margin:0\"><img src=\"shot.png\"></body>' > index.html",
    "symlink_answer": "ln -s /etc/passwd index.html",
}
"""Tool-arm routes: a shell command in the workspace, then ``index.html`` submitted."""


async def _grade(task: VisualTask, reply: str, command: str | None = None) -> tuple[float, dict[str, float]]:
    env = VisualEnv(task)
    seq = Sequence(task.task_id, "probe")
    try:
        if command is not None:
            await env.call_tool("bash", {"command": command})
            reply = "index.html"
        seq.answer = reply
        return (await env.grade(seq)).reward, env.metrics
    finally:
        await env.cleanup()


def probe_visual(n_tasks: int = 20, *, seed: int = 0, progress: bool = True) -> dict:
    """Every route on ``n_tasks`` held-out replication tasks, and the expert (its usual flaws)."""
    tasks = [make_task("heldout", i) for i in range(n_tasks)]
    names = [*ROUTES, *TOOL_ROUTES, *CONTROLS, "expert"]
    bar = tqdm(total=len(names) * n_tasks, desc="visual probes", unit="page", disable=not progress, leave=False)

    async def run() -> tuple[dict[str, list[float]], dict[str, float]]:
        out: dict[str, list[float]] = {}
        gates: dict[str, float] = {}
        for name in names:
            rng = random.Random(seed)
            rewards = []
            for t in tasks:
                if name in TOOL_ROUTES:
                    r, m = await _grade(t, "", TOOL_ROUTES[name])
                else:
                    ref = await reference(t)
                    reply = (f"```html\n{expert_page(t, rng)}```" if name == "expert"
                             else {**ROUTES, **CONTROLS}[name](t, ref))
                    r, m = await _grade(t, reply)
                for k, v in m.items():
                    if k.startswith("grade/gate_") and v:
                        key = f"{name}:{k.removeprefix('grade/gate_')}"
                        gates[key] = gates.get(key, 0) + 1
                rewards.append(r)
                bar.update(1)
            out[name] = rewards
        return out, gates

    rewards, gates = asyncio.run(run())
    bar.close()
    median = statistics.median(rewards["expert"])
    rows = {n: {"mean": statistics.fmean(r), "max": max(r), "below_expert_median": max(r) < median,
                "gates": {k.split(":", 1)[1]: v for k, v in gates.items() if k.split(":", 1)[0] == n}}
            for n, r in rewards.items() if n != "expert" and n not in CONTROLS}
    controls = {n: {"mean": statistics.fmean(rewards[n]), "min": min(rewards[n])} for n in CONTROLS}
    return {"tasks": n_tasks, "expert_median": median, "expert_mean": statistics.fmean(rewards["expert"]),
            "expert_pass": sum(r > 0 for r in rewards["expert"]), "routes": rows,
            "holes": [n for n, r in rows.items() if not r["below_expert_median"]], "controls": controls,
            "controls_short": [n for n, c in controls.items() if c["min"] < 1.0]}


def run_probe(options, request) -> dict:
    """``rlonce probe visual`` (``rlonce.config.domains.Probe.run``): ``probe_visual`` on
    ``request.tasks`` held-out replication tasks."""
    from rlonce.envs.visual.render import require_browser

    require_browser()
    return probe_visual(request.tasks, progress=request.progress)


def format_report(report: dict) -> str:
    lines = [f"visual probes on {report['tasks']} held-out replication tasks; the scripted expert (its usual "
             f"flaws): median reward {report['expert_median']:.3f}, mean {report['expert_mean']:.3f}",
             f"{'route':<34} {'mean':>6} {'max':>6}  below the expert's median  gates closed"]
    for name, r in report["routes"].items():
        gates = ", ".join(f"{k} {v:g}" for k, v in r["gates"].items()) or "-"
        lines.append(f"{name:<34} {r['mean']:>6.3f} {r['max']:>6.3f}  {'yes' if r['below_expert_median'] else 'NO':<26}"
                     f"{gates}")
    lines.append("holes: " + (", ".join(report["holes"]) or "none"))
    for name, c in report.get("controls", {}).items():
        lines.append(f"control {name}: mean {c['mean']:.3f}, min {c['min']:.3f} (a correct page: should be 1.000)")
    if report.get("controls_short"):
        lines.append("controls short of full reward: " + ", ".join(report["controls_short"]))
    return "\n".join(lines)


__all__ = ["CONTROLS", "ROUTES", "TOOL_ROUTES", "format_report", "probe_visual"]
