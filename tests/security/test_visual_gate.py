"""Attack tests for the image gate: a screenshot painted over the page by any mechanism closes it.

The painted routes of ``rlonce probe visual`` (a pseudo-element's ``content`` or background, a
``border-image`` fill, an SVG ``<feImage>`` filter, 1,000 tiny images before the real one, 5,100
empty elements before a background image) each earn 0 with ``embedded_image`` named, while a
correct page written unusually (a gradient background, small decorative images, an SVG icon, a
pseudo-element with a background) keeps the reference's reward. The slow tests repeat the routes
with the grader's screenshot of each viewport and measure more mechanisms at the renderer."""

import asyncio
import base64
import io

import pytest

from rlonce.envs.visual.env import reference
from rlonce.envs.visual.probe import CONTROLS, ICON, PAINTED, ROUTES, _grade
from rlonce.envs.visual.render import VIEWPORTS, render
from rlonce.envs.visual.render_page import coverage
from rlonce.envs.visual.similarity import MAX_RASTER
from rlonce.envs.visual.tasks import make_task


def grade_all(names: list[str]) -> dict:
    task = make_task("heldout", 1)

    async def run():
        ref = await reference(task)
        out = {name: await _grade(task, ROUTES[name](task, ref)) for name in names}
        out["reference"] = await _grade(task, f"```html\n{task.reference_html}```")
        out["control"] = await _grade(task, CONTROLS["decorated_reference"](task, ref))
        return out

    return asyncio.run(run())


def test_coverage_is_the_union_in_whole_pixels_of_the_viewport():
    # a 10x10 viewport scrolled 5 px down: [0,5)x[5,10) is 25 px, [3,8)x[7,15) is 40 px, 6 px shared
    assert coverage([(0, 0, 5, 10), (3, 7, 8, 20)], 0, 5, 10, 10) == pytest.approx(0.59)
    assert coverage([(0.5, 0, 1.2, 1)], 0, 0, 10, 10) == pytest.approx(0.02)  # edges rounded outwards
    assert coverage([(-50, -50, -1, 400)], 0, 0, 10, 10) == 0.0


@pytest.mark.browser
@pytest.mark.sandbox
@pytest.mark.usefixtures("chromium")
@pytest.mark.parametrize("both", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["target_png", "both"])
def test_a_painted_screenshot_closes_the_gate_and_a_control_page_keeps_its_reward(both):
    graded = grade_all([f"{name}_both" if both else name for name in PAINTED])
    assert graded["reference"][0] == 1.0
    assert graded["control"][0] == graded["reference"][0], graded["control"]
    for name, (reward, metrics) in graded.items():
        if name not in ("reference", "control"):
            assert reward == 0.0 and metrics["grade/gate_embedded_image"] == 1.0, (name, reward)


def _png_url() -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (640, 400), (200, 30, 30)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


U = _png_url()
FIX = "position:fixed;left:0;top:0;width:640px;height:400px"
PAINTS = {
    "img overflowing its box": f'<img src="{U}" style="display:block;width:4px;height:4px;object-fit:none;'
                               f'object-position:0 0;overflow:visible">',
    "list-style-image marker": f'<ul style="list-style-image:url({U});margin:0;padding:0 0 0 640px"><li>x</li></ul>',
    "img in a closed shadow root": f'<div id=h></div><script>h.attachShadow({{mode:"closed"}}).innerHTML='
                                   f'`<img src="{U}" style="{FIX}">`</script>',
    "-webkit-image-set": f'<div style="{FIX};background-image:-webkit-image-set(url({U}) 1x)"></div>',
    "cross-fade": f'<div style="{FIX};background-image:-webkit-cross-fade(url({U}), url({U}), 50%)"></div>',
    "mask-image": f'<div style="{FIX};background:red;-webkit-mask-image:url({U})"></div>',
    "svg pattern fill": f'<svg style="{FIX}"><defs><pattern id=p width=1 height=1><image href="{U}" width=640 '
                        f'height=400 /></pattern></defs><rect width=640 height=400 fill="url(#p)"/></svg>',
    "input type=image": f'<input type=image src="{U}" style="{FIX}">',
    "canvas": f'<canvas width=640 height=400 style="{FIX}"></canvas>',
    "background set by script after load": f'<div id=d></div><script>setTimeout(() => d.style.cssText = '
                                           f'"{FIX};background:url({U})", 100)</script>',
    "html background": f'<style>html{{background:url({U}) 0 0/640px 400px no-repeat}}</style>',
    "content on an element": f'<div style="content:url({U});{FIX}"></div>',
    "a 2 px image scaled up": f'<img src="{U}" style="width:2px;height:2px;transform:scale(320);'
                              f'transform-origin:0 0;position:fixed;left:0;top:0">',
    "paint() worklet": f'<div style="{FIX};background-image:paint(x)"></div>',
    "a 40-stop gradient": f'<div style="{FIX};background:linear-gradient(90deg,'
                          + ",".join(f"rgb({i},0,0) {i}px {i + 1}px" for i in range(40)) + ')"></div>',
    "border-image outset": f'<div style="width:2px;height:2px;border-image:url({U}) 0 fill/0/400px"></div>',
}
DECORATION = {
    "a two-colour gradient over the page": f'<div style="{FIX};background:linear-gradient(red,blue)"></div>',
    "small images and image bullets": f'<img src="{U}" style="width:64px;height:40px"><div style="width:100px;'
                                      f'height:50px;background:url({U})"></div><ul style="list-style-image:'
                                      f'url({ICON})"><li>a</li><li>b</li></ul>',
}


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.sandbox
@pytest.mark.usefixtures("chromium")
def test_every_image_mechanism_is_measured_and_decoration_is_not_a_screenshot():
    async def run():
        out = {}
        for name, body in {**PAINTS, **DECORATION}.items():
            r = await render({"index.html": f"<body style='margin:0'>{body}</body>".encode()},
                             viewports=VIEWPORTS[:1], delays_ms=(0, 300))
            out[name] = r.raster_coverage.get("desktop", 0.0)
        return out

    measured = asyncio.run(run())
    for name in PAINTS:
        assert measured[name] > MAX_RASTER, (name, measured[name])
    for name in DECORATION:
        assert measured[name] < 0.1, (name, measured[name])
