"""Replication grading: pixel similarity to the reference render, structural checks, gates.

**Pixel score.** SSIM (Wang et al. 2004) from scikit-image, ``structural_similarity`` on the RGB
screenshots (7×7 uniform windows, sample covariance, ``data_range`` 255, channels averaged):

    SSIM(x, y) = mean over windows of (2 μx μy + C1)(2 σxy + C2) / ((μx² + μy² + C1)(σx² + σy² + C2)),
    C1 = (0.01·255)², C2 = (0.03·255)².

A trivial page already scores well against a page that is mostly flat colour, so each viewport's
score is normalised against the better of two trivial pages for that target — the blank (white)
page and a page of the target's most common colour alone (its background):

    b_v = max(SSIM(white, target), SSIM(flat most common colour, target))
    p_v = clip((s_v − b_v) / (1 − b_v), 0, 1),   s_v = min over capture delays of SSIM(capture, target)

and ``pixel = mean_v p_v``. The minimum over capture delays means a page that changes after load
(e.g. script that paints the target late, or only once) is scored at its worst moment.

**Structure.** Every string the reference shows (``Layout.texts``) must be the whole text of
some element of the rendered DOM, in every viewport: ``structure`` = share of the strings found.
Text drawn into an image or a canvas is not text.

**Reward** = ``pixel · (0.5 + 0.5 · structure)``, or 0 when a gate closes:
``runtime`` (a console error, an uncaught exception, a failed load — there is no network), ``timed_out``
and ``crashed`` (the page's own fault), ``embedded_image`` (images covering more than ``MAX_RASTER`` of a
viewport, whatever paints them — elements, pseudo-elements, CSS backgrounds, border images, masks,
list markers, SVG images and filters — or image paint the renderer could not bound: a screenshot
pasted as the page), ``oversize`` (the document more than ``MAX_EXTENT``
viewports wide or tall).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

import numpy as np
from PIL import Image
from skimage.metrics import structural_similarity

MAX_RASTER = 0.25
MAX_EXTENT = 3.0
GATES = ("no_page", "runtime", "timed_out", "crashed", "embedded_image", "oversize")


def rgb(png: bytes) -> np.ndarray:
    """A PNG as an H×W×3 uint8 array."""
    with Image.open(io.BytesIO(png)) as im:
        return np.asarray(im.convert("RGB"))


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        raise ValueError(f"images differ in size: {a.shape} vs {b.shape}")
    return float(structural_similarity(a, b, channel_axis=2 if a.ndim == 3 else None, data_range=255))


def blank_score(target: np.ndarray) -> float:
    """``b``: the better SSIM of a white page and a page of the target's most common colour."""
    colours, counts = np.unique(target.reshape(-1, target.shape[-1]) if target.ndim == 3 else target.reshape(-1, 1),
                                axis=0, return_counts=True)
    flat = np.broadcast_to(colours[counts.argmax()], target.shape).astype(target.dtype)
    return max(ssim(np.full_like(target, 255), target), ssim(np.ascontiguousarray(flat), target))


def viewport_score(captures: list[np.ndarray], target: np.ndarray) -> float:
    """``p_v``: the worst capture's SSIM, normalised between the trivial pages (0) and the target (1)."""
    s = min(ssim(c, target) for c in captures)
    b = blank_score(target)
    if b >= 1.0:
        return 1.0 if s >= 1.0 else 0.0
    return float(np.clip((s - b) / (1.0 - b), 0.0, 1.0))


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def structure_score(required: tuple[str, ...], texts: dict[str, list[dict]]) -> float:
    """Share of ``required`` strings that are an element's whole text in every viewport."""
    if not required:
        return 1.0
    found = [all(_norm(t) in {_norm(str(e.get("text", ""))) for e in elems} for elems in texts.values())
             if texts else False for t in required]
    return sum(found) / len(required)


def gate(render, viewports) -> str | None:
    """The gate a render closes (see the module docstring), or None."""
    if render.timed_out:
        return "timed_out"
    if render.crashed:
        return "crashed"
    if not render.runtime_ok:
        return "runtime"
    for vp in viewports:
        if render.raster_coverage.get(vp.name, 0.0) > MAX_RASTER:
            return "embedded_image"
        w, h = render.doc_size.get(vp.name, (vp.width, vp.height))
        if w > MAX_EXTENT * vp.width or h > MAX_EXTENT * vp.height:
            return "oversize"
    return None


@dataclass
class Replication:
    reward: float
    pixel: float
    structure: float
    gate: str | None
    per_viewport: dict[str, float]


def score(render, target: dict[str, np.ndarray], required: tuple[str, ...], viewports) -> Replication:
    """Grade a candidate ``render`` against the reference screenshots ``target`` (viewport → array)."""
    closed = gate(render, viewports)
    if closed is not None:
        return Replication(0.0, 0.0, 0.0, closed, {})
    per = {}
    for vp in viewports:
        caps = [rgb(c.png) for c in render.captures if c.viewport == vp.name]
        per[vp.name] = viewport_score(caps, target[vp.name]) if caps else 0.0
    pixel = float(np.mean(list(per.values())))
    structure = structure_score(required, render.texts)
    return Replication(pixel * (0.5 + 0.5 * structure), pixel, structure, None, per)
