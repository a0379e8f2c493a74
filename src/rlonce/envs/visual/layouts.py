"""Generated reference pages for the replication family: a layout, its HTML, and its spec.

A ``Layout`` is drawn from a seeded generator over a small design vocabulary — a colour scheme
(page background, bar, accent, text colours), an optional navigation bar, a heading, one main
block (a row of cards, a table, a form, or a banner) and an optional footer; ``simple`` layouts
(``task.visual_layouts``) keep the heading and a banner or cards only. ``html(layout)`` is
the reference page (inline styles, short enough for a small model to write within its context);
``spec(layout)`` is the same layout in words, one line a part, given to the agent with the target
screenshot: a text-only policy replicates from the spec, a vision policy may use either. The
strings the layout shows (``texts``) are the structural items grading checks in the DOM.

Every page has a tinted, non-white background, so a blank page is far from every target
(``similarity`` normalises against the blank page's score).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SCHEMES: dict[str, tuple[str, str, str, str]] = {
    # name: (page background, bar, accent, second accent)
    "sand": ("#f4f1de", "#264653", "#e76f51", "#2a9d8f"),
    "mint": ("#e8f5e9", "#1b5e20", "#43a047", "#ffb300"),
    "sky": ("#e3f2fd", "#0d47a1", "#1e88e5", "#f4511e"),
    "rose": ("#fce4ec", "#880e4f", "#d81b60", "#5e35b1"),
    "slate": ("#eceff1", "#263238", "#546e7a", "#ff7043"),
    "lemon": ("#fffde7", "#3e2723", "#fbc02d", "#6d4c41"),
    "night": ("#212121", "#000000", "#7c4dff", "#00bfa5"),
    "peach": ("#fff3e0", "#bf360c", "#fb8c00", "#00897b"),
}
BRANDS = ("Acme", "Nova", "Orbit", "Pixel", "Cedar", "Delta", "Ember", "Flux", "Glow", "Harbor")
HEADINGS = ("Our plans", "Team", "Contact us", "Pricing", "Welcome", "Features", "Latest news", "Sign up",
            "Dashboard", "Projects", "Menu", "Events")
WORDS = ("Basic", "Pro", "Team", "Free", "Plus", "Gold", "Lite", "Max", "Home", "Blog", "Shop", "Help", "Alpha",
         "Beta", "Gamma", "Mon", "Tue", "Wed", "Red", "Blue", "Green")
FIELDS = ("Name", "Email", "Phone", "City", "Topic")
BUTTONS = ("Send", "Join", "Save", "Go", "Submit")
BLOCKS = ("cards", "table", "form", "banner")
FONT_SIZES = (20, 24, 28)
BAR_HEIGHTS = (40, 48, 56)
CARD_HEIGHTS = (60, 80, 100)
BANNER_HEIGHTS = (80, 120, 160)


@dataclass(frozen=True)
class Layout:
    scheme: str
    nav: tuple[int, str] | None
    """(height px, brand) of a top bar in the scheme's bar colour with white text; None: no bar."""
    heading: tuple[int, str, str]
    """(font size px, colour, text)."""
    block: str
    """One of ``BLOCKS``."""
    items: tuple[str, ...]
    """Cards: their labels; table: header then cells row by row; form: field labels then the
    button's label; banner: its text."""
    colours: tuple[str, ...]
    """Cards: one background each; table: header background; form: button; banner: background."""
    size: int
    """Cards: height px; table: columns; form: unused (0); banner: height px."""
    footer: str | None
    """Footer text on the bar colour, or None."""

    @property
    def background(self) -> str:
        return SCHEMES[self.scheme][0]

    @property
    def bar(self) -> str:
        return SCHEMES[self.scheme][1]

    @property
    def ink(self) -> str:
        """Body text colour: white on the dark scheme, the bar colour elsewhere."""
        return "#ffffff" if self.scheme == "night" else SCHEMES[self.scheme][1]

    @property
    def texts(self) -> tuple[str, ...]:
        """Every string the page shows, each as one element's whole text."""
        out = ([self.nav[1]] if self.nav else []) + [self.heading[2]] + list(self.items)
        return tuple(out + ([self.footer] if self.footer else []))


def make_layout(rng: random.Random, simple: bool = False) -> Layout:
    """A layout; ``simple``: no bar, no footer, a banner or a row of cards (fewer parts to copy)."""
    scheme = rng.choice(sorted(SCHEMES))
    _, bar, accent, second = SCHEMES[scheme]
    nav = (rng.choice(BAR_HEIGHTS), rng.choice(BRANDS)) if rng.random() < 0.7 and not simple else None
    heading = (rng.choice(FONT_SIZES), rng.choice((accent, second, bar if scheme != "night" else accent)),
               rng.choice(HEADINGS))
    block = rng.choice(("banner", "cards") if simple else BLOCKS)
    words = rng.sample(WORDS, 9)
    if block == "cards":
        n = 2 if simple else rng.choice((2, 3))
        items, colours, size = tuple(words[:n]), tuple(rng.choice((accent, second, bar)) for _ in range(n)), \
            rng.choice(CARD_HEIGHTS)
    elif block == "table":
        cols = rng.choice((2, 3))
        items, colours, size = tuple(words[:cols * rng.choice((2, 3))]), (rng.choice((accent, second)),), cols
    elif block == "form":
        items = (*rng.sample(FIELDS, rng.choice((1, 2))), rng.choice(BUTTONS))
        colours, size = (rng.choice((accent, second)),), 0
    else:
        items, colours, size = (words[0],), (rng.choice((accent, second)),), rng.choice(BANNER_HEIGHTS)
    footer = f"(c) {nav[1] if nav else rng.choice(BRANDS)}" if rng.random() < 0.4 and not simple else None
    return Layout(scheme, nav, heading, block, items, colours, size, footer)


def _block_html(lay: Layout) -> str:
    if lay.block == "cards":
        cards = "".join(f'<div style="flex:1;height:{lay.size}px;background:{c};color:#fff;padding:8px">{t}</div>'
                        for t, c in zip(lay.items, lay.colours))
        return f'<div style="display:flex;gap:8px;margin:12px">{cards}</div>'
    if lay.block == "table":
        cols = lay.size
        rows = [lay.items[i:i + cols] for i in range(0, len(lay.items), cols)]
        head = "".join(f"<th>{t}</th>" for t in rows[0])
        body = "".join("<tr>" + "".join(f"<td>{t}</td>" for t in r) + "</tr>" for r in rows[1:])
        return (f'<table style="margin:12px;border-collapse:collapse;color:{lay.ink}" border="1" cellpadding="6">'
                f'<tr style="background:{lay.colours[0]};color:#fff">{head}</tr>{body}</table>')
    if lay.block == "form":
        fields = "".join(f'<p style="margin:12px;color:{lay.ink}">{t}</p>'
                         f'<input style="margin:0 12px;width:200px">' for t in lay.items[:-1])
        return (f'{fields}<p><button style="margin:12px;padding:8px 16px;border:0;background:{lay.colours[0]};'
                f'color:#fff">{lay.items[-1]}</button></p>')
    return (f'<div style="margin:12px;height:{lay.size}px;background:{lay.colours[0]};color:#fff;'
            f'font-size:28px;padding:16px">{lay.items[0]}</div>')


def html(lay: Layout) -> str:
    """The reference page."""
    parts = [f'<body style="margin:0;background:{lay.background};font-family:sans-serif">']
    if lay.nav:
        h, brand = lay.nav
        parts.append(f'<div style="height:{h}px;line-height:{h}px;background:{lay.bar};color:#fff;'
                     f'padding:0 12px">{brand}</div>')
    size, colour, text = lay.heading
    parts.append(f'<h1 style="margin:12px;font-size:{size}px;color:{colour}">{text}</h1>')
    parts.append(_block_html(lay))
    if lay.footer:
        parts.append(f'<div style="margin-top:12px;background:{lay.bar};color:#fff;padding:8px 12px">'
                     f'{lay.footer}</div>')
    return "\n".join(parts) + "\n</body>\n"


def spec(lay: Layout) -> str:
    """The layout in words, one line a part, top to bottom."""
    lines = [f"font: sans-serif; page background {lay.background}; no body margin"]
    if lay.nav:
        lines.append(f'top bar: {lay.nav[0]}px high, {lay.bar}, white text "{lay.nav[1]}", 12px side padding')
    size, colour, text = lay.heading
    lines.append(f'heading h1: {size}px, {colour}, "{text}", 12px margin')
    if lay.block == "cards":
        cards = "; ".join(f'{c} "{t}"' for t, c in zip(lay.items, lay.colours))
        lines.append(f"cards in a row (flex, 8px gap, 12px margin, 8px padding, white text, "
                     f"{lay.size}px high): {cards}")
    elif lay.block == "table":
        cols = lay.size
        rows = [lay.items[i:i + cols] for i in range(0, len(lay.items), cols)]
        lines.append(f"table (border 1, collapsed, cell padding 6, 12px margin, text {lay.ink}): header row "
                     f"on {lay.colours[0]} in white: " + " | ".join(rows[0]) + "; rows: "
                     + " / ".join(" | ".join(r) for r in rows[1:]))
    elif lay.block == "form":
        lines.append(f"form: labels as paragraphs ({lay.ink}, 12px margin) each above a 200px input: "
                     + ", ".join(f'"{t}"' for t in lay.items[:-1])
                     + f'; then a button "{lay.items[-1]}" on {lay.colours[0]}, white text, no border, '
                       "padding 8px 16px, 12px margin")
    else:
        lines.append(f'banner: {lay.size}px high, {lay.colours[0]}, white 28px text "{lay.items[0]}", '
                     "16px padding, 12px margin")
    if lay.footer:
        lines.append(f'footer: {lay.bar}, white text "{lay.footer}", padding 8px 12px, 12px above')
    return "\n".join(lines)
