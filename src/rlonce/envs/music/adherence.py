"""Request adherence: does the tune do what the task asked? Checked from the parsed score.

The seed's public scorer never looks at the request (seed 001: it "does not use ground_truth or
extra_info to verify adherence to the musical request"). Here each requested property is one
binary item, measured on the MIDI abc2midi wrote (what sounds), not on what the text claims:

  key         the ``K:`` field names the key and ≥ ``IN_KEY`` of the melody's duration is in its scale
  meter       the MIDI time signature
  tempo       the MIDI tempo within ±1 quarter note per minute
  instrument  the melody part's General MIDI program
  bars        the length in bars (rounded up)
  form        the melody cut into equal sections: sections the form names alike repeat
              (≥ ``SAME`` of their bars identical), sections named differently differ (< ``DIFFERENT``)

``adherence`` is the share of items met.
"""

from __future__ import annotations

import re

from rlonce.envs.music.compose import KEYS, Request
from rlonce.envs.music.features import MAJOR_SCALE, MINOR_SCALE, Score, bar_count, melody, melody_bars, pc_histogram

IN_KEY = 0.85
SAME, DIFFERENT = 0.75, 0.5
ITEMS = ("key", "meter", "tempo", "instrument", "bars", "form")
KEY_FIELD = re.compile(r"^K:\s*([A-Ga-g][#b]?)\s*(m|min|minor|maj|major)?\b", re.M | re.I)


def key_field(abc: str) -> str | None:
    """The ``K:`` field as a ``compose.KEYS`` name (``Amin`` → ``Am``), or None."""
    m = KEY_FIELD.search(abc)
    if not m:
        return None
    tonic = m.group(1)[0].upper() + m.group(1)[1:]
    minor = (m.group(2) or "").lower() in ("m", "min", "minor")
    return tonic + ("m" if minor else "")


def in_key(score: Score, key: str) -> float:
    tonic, major = KEYS[key]
    steps = MAJOR_SCALE if major else MINOR_SCALE
    h = pc_histogram(melody(score))
    total = h.sum()
    return float(sum(h[(tonic + s) % 12] for s in steps) / total) if total > 0 else 0.0


def form_holds(score: Score, form: str) -> bool:
    bars = melody_bars(score)
    if not bars or len(bars) % len(form):
        return False
    k = len(bars) // len(form)
    parts = [bars[i * k:(i + 1) * k] for i in range(len(form))]
    for i in range(len(form)):
        for j in range(i + 1, len(form)):
            same = sum(a == b for a, b in zip(parts[i], parts[j])) / k
            if (form[i] == form[j]) != (same >= SAME) or (form[i] != form[j] and same >= DIFFERENT):
                return False
    return True


def check(req: Request, abc: str, score: Score) -> dict[str, bool]:
    """Each item of ``ITEMS``: met or not."""
    mel = melody(score)
    programs = [n.program for n in mel]
    return {k: bool(v) for k, v in {
        "key": key_field(abc) == req.key and in_key(score, req.key) >= IN_KEY,
        "meter": f"{score.meter[0]}/{score.meter[1]}" == req.meter,
        "tempo": abs(score.tempo_qpm - req.tempo) <= 1.0,
        "instrument": bool(programs) and max(set(programs), key=programs.count) == req.program,
        "bars": bar_count(score) == req.bars,
        "form": bar_count(score) == req.bars and form_holds(score, req.form),
    }.items()}


def adherence(items: dict[str, bool]) -> float:
    return sum(items.values()) / len(items)
