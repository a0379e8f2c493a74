"""Replication grading against hand-computed numbers: SSIM, the blank-page normalisation, the
structural checks, the gates; and the task generator, the spec and the expert."""

import io
import random

import numpy as np
import pytest
from PIL import Image

from rlonce.envs.visual import similarity as sim
from rlonce.envs.visual.expert import FLAWS, expert_page, expert_turns
from rlonce.envs.visual.layouts import SCHEMES, html, make_layout, spec
from rlonce.envs.visual.render import VIEWPORTS, Capture, RenderResult, Viewport
from rlonce.envs.visual.tasks import make_task
from rlonce.model.chat import get_format

C1, C2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2


def test_ssim_of_two_flat_images_is_the_luminance_term():
    # σx = σy = σxy = 0: SSIM = (2 μx μy + C1) / (μx² + μy² + C1) = (24000 + 6.5025) / (24400 + 6.5025)
    a, b = np.full((7, 7), 100, np.uint8), np.full((7, 7), 120, np.uint8)
    assert sim.ssim(a, b) == pytest.approx((2 * 100 * 120 + C1) / (100**2 + 120**2 + C1), abs=1e-9)
    assert sim.ssim(a, b) == pytest.approx(0.983611, abs=1e-6)


def test_ssim_of_a_checkerboard_and_its_negative_by_hand():
    # 7×7, one window (the only uncropped one covers the whole image), sample covariance (n − 1 = 48):
    # x has 24 pixels at 255, y = 255 − x has 25; σx² = σy² = (49/48)(24·25/49²)·255², σxy = −σx².
    x = ((np.add.outer(np.arange(7), np.arange(7)) % 2) * 255).astype(np.uint8)
    y = (255 - x).astype(np.uint8)
    mx, my = 24 * 255 / 49, 25 * 255 / 49
    var = (49 / 48) * (24 * 25 / 49**2) * 255**2
    hand = (2 * mx * my + C1) * (-2 * var + C2) / ((mx**2 + my**2 + C1) * (2 * var + C2))
    assert hand == pytest.approx(-0.99566, abs=1e-4)
    assert sim.ssim(x, y) == pytest.approx(hand, abs=1e-9)
    assert sim.ssim(x, x) == pytest.approx(1.0)


def test_viewport_score_is_zero_for_the_blank_page_one_for_the_target_and_takes_the_worst_capture():
    rng = np.random.default_rng(0)
    target = np.full((40, 60, 3), 230, np.uint8)
    target[5:20, 5:50] = (38, 70, 83)
    blank = np.full_like(target, 255)
    assert sim.viewport_score([target], target) == 1.0
    assert sim.viewport_score([blank], target) == 0.0
    noisy = np.clip(target.astype(int) + rng.integers(-4, 5, target.shape), 0, 255).astype(np.uint8)
    s, b = sim.ssim(noisy, target), sim.blank_score(target)
    assert 0 < (s - b) / (1 - b) < 1
    assert sim.viewport_score([noisy], target) == pytest.approx((s - b) / (1 - b))
    assert sim.viewport_score([target, blank], target) == 0.0  # a page that is right only once scores its worst
    background = np.full_like(target, 230)  # the target's most common colour alone
    assert sim.blank_score(target) == pytest.approx(max(sim.ssim(blank, target), sim.ssim(background, target)))
    assert sim.viewport_score([background], target) == 0.0


def test_structure_counts_whole_element_texts_in_every_viewport():
    texts = {"desktop": [{"text": " Acme "}, {"text": "Our  plans"}], "mobile": [{"text": "Acme"}]}
    assert sim.structure_score(("Acme", "Our plans"), texts) == 0.5  # "Our plans" missing on mobile
    assert sim.structure_score(("Acme",), texts) == 1.0
    assert sim.structure_score(("Acm",), texts) == 0.0  # a substring is not the element's text
    assert sim.structure_score(("Acme",), {}) == 0.0


def _png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def _render(arrays: dict[str, np.ndarray], **kw) -> RenderResult:
    fields = {"captures": [Capture(v, 0, _png(a)) for v, a in arrays.items()], "console_errors": [], "page_errors": [],
              "failed_requests": [], "doc_size": {v: (a.shape[1], a.shape[0]) for v, a in arrays.items()},
              "texts": {v: [{"text": "Hi"}] for v in arrays}, "raster_coverage": {v: 0.0 for v in arrays},
              "seconds": 1.0}
    fields.update(kw)
    return RenderResult(**fields)


def test_score_reward_and_gates():
    vps = (Viewport("a", 60, 40), Viewport("b", 40, 60))
    ta = np.full((40, 60, 3), 200, np.uint8)
    ta[:10] = (200, 30, 30)
    tb = np.full((60, 40, 3), 200, np.uint8)
    target = {"a": ta, "b": tb}
    good = sim.score(_render(target), target, ("Hi", "There"), vps)
    assert (good.pixel, good.structure, good.gate) == (1.0, 0.5, None)
    assert good.reward == pytest.approx(1.0 * (0.5 + 0.5 * 0.5))
    half = sim.score(_render({"a": ta, "b": np.full_like(tb, 255)}), target, ("Hi",), vps)
    assert half.pixel == pytest.approx(0.5) and half.reward == pytest.approx(0.5)
    for kw, gate in (({"console_errors": ["x"]}, "runtime"), ({"failed_requests": ["http://x"]}, "runtime"),
                     ({"timed_out": True}, "timed_out"), ({"crashed": True}, "crashed"),
                     ({"raster_coverage": {"a": 0.9, "b": 0.0}}, "embedded_image"),
                     ({"doc_size": {"a": (60, 40 * 3 + 1), "b": (40, 60)}}, "oversize")):
        s = sim.score(_render(target, **kw), target, ("Hi",), vps)
        assert (s.reward, s.gate) == (0.0, gate)


def test_layouts_are_reproducible_tinted_and_fit_a_small_context():
    a, b = make_task("train", 7), make_task("train", 7)
    assert a == b and a != make_task("heldout", 7)
    for i in range(100):
        lay = make_layout(random.Random(i))
        assert lay.background in {s[0] for s in SCHEMES.values()} and lay.background != "#ffffff"
        page = html(lay)
        for t in lay.texts:
            assert f">{t}<" in page and t in spec(lay)
        assert len(page) < 1200


def test_simple_layouts_keep_a_heading_and_one_banner_or_two_cards():
    for i in range(50):
        lay = make_task("train", i, layouts="simple").layout
        assert lay.nav is None and lay.footer is None and lay.block in ("banner", "cards")
        assert lay.block == "banner" or len(lay.items) == 2
    with pytest.raises(ValueError, match="unknown visual layouts"):
        make_task("train", 0, layouts="huge")


def test_expert_pages_carry_their_flaws_and_the_single_turn_reply_is_a_fenced_block():
    t = make_task("heldout", 3)
    assert expert_page(t, random.Random(0), detour_p=0.0) == t.reference_html
    flawed = {expert_page(t, random.Random(s), detour_p=1.0, max_detours=1) for s in range(30)}
    assert t.reference_html not in flawed or len(flawed) > 1
    assert len(FLAWS) == 6
    fmt = get_format("hermes")
    (turn,) = expert_turns(t, random.Random(0), fmt, single_turn=True, detour_p=0.0)
    assert turn.startswith("```html\n<body") and t.reference_html in turn
    calls = expert_turns(t, random.Random(1), fmt, single_turn=False, detour_p=0.0)
    assert "cat > index.html" in calls[-2] and '"index.html"' in calls[-1]


def test_viewports_are_the_documented_sizes():
    assert [(v.name, v.width, v.height) for v in VIEWPORTS] == [("desktop", 640, 400), ("mobile", 360, 640)]


def test_a_missing_browser_stops_a_visual_job_with_one_line_naming_the_package(monkeypatch):
    from rlonce.config import TaskConfig
    from rlonce.envs import domains
    from rlonce.envs.visual import render

    monkeypatch.setattr(render, "CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(render.BrowserMissing) as e:
        domains.domain_for(TaskConfig(name="visual"))
    assert "\n" not in str(e.value) and "'chromium'" in str(e.value) and "apt-get install chromium" in str(e.value)
