"""The page renderer end to end: real Chromium in a real sandbox, pages written by hand, and the
numbers read back checked against what the page draws (pixels with PIL, boxes, sizes)."""

import asyncio
import io

import pytest
from conftest import slack

from rlonce.envs.visual.render import VIEWPORTS, Viewport, png_size, render

pytestmark = [pytest.mark.browser, pytest.mark.sandbox, pytest.mark.usefixtures("chromium")]
DESKTOP = (VIEWPORTS[0],)


def page(html: str, **kw):
    return asyncio.run(render({"index.html": html.encode()}, **kw))


def test_red_box_pixels_heading_box_and_both_viewports():
    r = page("<html><body style='margin:0;background:#fff'>"
             "<div style='position:absolute;left:0;top:0;width:200px;height:100px;background:#ff0000'></div>"
             "<h1 style='position:absolute;left:20px;top:150px;margin:0;font:bold 40px/50px sans-serif;"
             "color:rgb(10,20,30)'>Quarterly report</h1></body></html>")
    from PIL import Image

    assert r.runtime_ok and not r.timed_out and not r.crashed
    assert [(c.viewport, c.delay_ms) for c in r.captures] == [("desktop", 0), ("desktop", 300), ("mobile", 0),
                                                                ("mobile", 300)]
    for c in r.captures:
        vp = next(v for v in VIEWPORTS if v.name == c.viewport)
        img = Image.open(io.BytesIO(c.png)).convert("RGB")
        assert img.size == png_size(c.png) == (vp.width, vp.height)
        assert img.getpixel((0, 0)) == img.getpixel((199, 99)) == (255, 0, 0)
        assert img.getpixel((200, 0)) == img.getpixel((0, 100)) == img.getpixel((vp.width - 1, 120)) == (255, 255, 255)
    for vp in VIEWPORTS:
        [h1] = r.texts[vp.name]
        assert h1["text"] == "Quarterly report"
        assert h1["x"] == 20 and 150 <= h1["y"] and h1["y"] + h1["h"] <= 200  # the glyphs' box, in the line box
        assert 40 <= h1["h"] <= 50 and h1["font_px"] == 40
        assert 200 < h1["w"] < 420  # 16 bold glyphs at 40 px
        assert h1["color"] == "rgb(10, 20, 30)" and h1["background"] == "rgb(255, 255, 255)"
        assert r.doc_size[vp.name] == (vp.width, vp.height)
        assert r.raster_coverage[vp.name] == 0.0
    assert r.memory_capped and r.seconds < slack(20)


def test_console_error_and_uncaught_exception_are_recorded():
    r = page("<p>hi</p><script>console.error('boom ' + 42); console.log('fine');"
             "setTimeout(() => { null.x }, 0)</script>", viewports=DESKTOP, delays_ms=(0,))
    assert r.console_errors == ["boom 42"]
    assert len(r.page_errors) == 1 and "null" in r.page_errors[0]
    assert not r.runtime_ok and not r.timed_out and not r.crashed


def test_doc_size_of_a_tall_page_and_raster_coverage():
    tall = page("<body style='margin:0'><div style='height:5000px;width:100px'>tall</div></body>",
                viewports=DESKTOP, delays_ms=(0,))
    assert tall.doc_size == {"desktop": (640, 5000)} and tall.runtime_ok
    [c] = tall.captures
    assert png_size(c.png) == (640, 400)  # the viewport, not the full page

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (0, 128, 0)).save(buf, "PNG")
    import base64

    src = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    small = Viewport("small", 320, 200)
    img = page(f"<body style='margin:0'><img src='{src}' style='display:block;width:100vw;height:100vh'></body>",
               viewports=(small,), delays_ms=(0,))
    assert img.raster_coverage["small"] == pytest.approx(1.0) and img.runtime_ok
    grad = page("<body style='margin:0'><div style='width:100vw;height:100vh;"
                "background-image:linear-gradient(red, blue)'></div></body>", viewports=(small,), delays_ms=(0,))
    assert grad.raster_coverage["small"] == 0.0
    half = page(f"<body style='margin:0'><div style='width:160px;height:200px;background:url({src})'></div>"
                f"<img src='{src}' style='position:absolute;left:0;top:0;width:160px;height:100px'></body>",
                viewports=(small,), delays_ms=(0,))
    assert half.raster_coverage["small"] == pytest.approx(0.5)  # overlapping rasters count once
