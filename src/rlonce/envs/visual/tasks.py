"""Visual tasks: replication of a generated reference page, or an open-ended design request.

Tasks come from seeded generators by split and index, so each split is an endless reproducible
stream and the splits never share a seed. ``family`` picks what a stream draws: ``replication``
(deterministic pixel grading against the reference page), ``open`` (a design request graded by
the group pick judge; needs a vision-capable judge) or ``mixed`` (every third task open).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlonce.envs.visual.layouts import Layout, html, make_layout, spec

SPLIT_SEEDS = {"train": 51_001, "heldout": 52_002, "sft": 53_003}
FAMILIES = ("replication", "open", "mixed")
PAGE_KINDS = ("a pricing page", "a landing page", "a contact page", "a menu page", "an events page",
              "a team page", "a product page", "a sign-up page")
BUSINESSES = ("a bakery", "a bike repair shop", "a yoga studio", "a bookshop", "a dental clinic", "a coffee roaster",
              "a language school", "a plant nursery", "a photo studio", "a climbing gym")
REQUIREMENTS = ("three price tiers", "opening hours", "a contact form", "a call-to-action button",
                "a navigation bar", "a footer with an address", "a photo-free hero section", "a short FAQ",
                "a table of prices", "two testimonials")


@dataclass(frozen=True)
class DesignRequest:
    page: str
    business: str
    requirements: tuple[str, ...]

    @property
    def text(self) -> str:
        return f"Design {self.page} for {self.business} with " + ", ".join(self.requirements) + "."


@dataclass(frozen=True)
class VisualTask:
    task_id: str
    source: str
    layout: Layout | None = None
    """Replication: the reference layout."""
    request: DesignRequest | None = None
    """Open-ended: the request."""

    @property
    def family(self) -> str:
        return "replication" if self.layout is not None else "open"

    @property
    def reference_html(self) -> str:
        if self.layout is None:
            raise ValueError(f"{self.task_id} is open-ended: it has no reference page")
        return html(self.layout)

    @property
    def texts(self) -> tuple[str, ...]:
        return self.layout.texts if self.layout is not None else ()

    @property
    def prompt(self) -> str:
        if self.layout is not None:
            return ("Replicate this page as one HTML file (shown at 640x400 and 360x640; target.png is a "
                    f"screenshot).\n{spec(self.layout)}\nAnswer with the page in one ```html block.")
        return (f"{self.request.text} One self-contained HTML file (inline CSS and JS, no images or network; "
                "shown at 640x400 and 360x640). Answer with the page in one ```html block.")


LAYOUTS = ("full", "simple")


def make_task(split: str, index: int, source: str = "visual", family: str = "replication",
              layouts: str = "full") -> VisualTask:
    if split not in SPLIT_SEEDS:
        raise ValueError(f"unknown split {split!r}; known: {sorted(SPLIT_SEEDS)}")
    if family not in FAMILIES:
        raise ValueError(f"unknown visual family {family!r}; known: {list(FAMILIES)}")
    if layouts not in LAYOUTS:
        raise ValueError(f"unknown visual layouts {layouts!r}; known: {list(LAYOUTS)}")
    rng = random.Random(f"{SPLIT_SEEDS[split]}:{index}")
    task_id = f"visual/{split}/{index}"
    if family == "open" or (family == "mixed" and index % 3 == 2):
        req = DesignRequest(rng.choice(PAGE_KINDS), rng.choice(BUSINESSES), tuple(rng.sample(REQUIREMENTS, 2)))
        return VisualTask(task_id, source, request=req)
    return VisualTask(task_id, source, layout=make_layout(rng, simple=layouts == "simple"))
