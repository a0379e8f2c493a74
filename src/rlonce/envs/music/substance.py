"""Musical substance: a factor in [0, 1] that the default reward is multiplied by.

Why: the feature score compares a tune's statistics with the corpus's, and adherence checks the
request's header items and form. A tune can satisfy both with no music in it: tonic-triad
arpeggios, one section played for every letter of the form, a scale per section, one bar
repeated, one pitch throughout, chord symbols over rests (``rlonce probe music`` has each as a
route; before this factor they earned 0.68–0.94 on average against the expert's median of
0.944). What they lack is what a melody has: several pitch classes, new bars where the form asks for new material,
a contour other than a scale, and a single line. Each is one measurement of the melody
(``features.melody``: the highest part, its top note at each onset), mapped to [0, 1] by a linear
ramp between two anchors: full credit at or beyond the level of the least varied tunes of the
reference corpus, none at the level of the plain degenerate pattern (the corpus figures below are
of 120 corpus tunes; docs/music.md has the control on all 240 and on the expert's tunes):

  variety   effective number of pitch classes, ``2 ** entropy`` (bits) of the melody's
            duration-weighted pitch-class histogram: 1 for one pitch, at most 3 for a triad.
            0 at 2, 1 at 4 (corpus: 5th percentile 4.2, lowest 3.2).
  novelty   distinct melody bars (pitch, onset in the bar and length of each note) over the
            bars the requested form calls new (``bars × distinct letters / letters``: 8 of 16
            for AABB, 12 of 16 for ABAC), at most 1. 0 at 0.25, 1 at 0.75 (corpus lowest 0.75:
            a cadence bar may recur by chance; one section for every letter of AABB is 0.5).
  contour   share of melodic intervals inside monotone stepwise runs (steps of 1 or 2
            semitones, one direction) of three or more steps, a scale fragment of four notes or
            more. 1 at 0.5, 0 at 0.85 (corpus 95th percentile 0.26, highest 0.61; a scale per
            section 0.80 and above).
  line      share of the melody part's onsets where two or more of its notes start together.
            1 at 0.5, 0 at 0.9: a melody is one line; a part that sounds a chord at nearly
            every onset is an accompaniment (chord symbols over rests leave only abc2midi's
            chord and bass parts, and the chord part is the highest).

``substance = variety × novelty × contour × line``: a product, like a gate, so one absent
dimension is enough (seed 001's report multiplies its coding reward by solution and behaviour
scores in the same way: a stylish failure cannot buy its way back). Real tunes sit at 1 on every
factor, so the expert's median is unchanged; the factor applies only with adherence
(``adherence_weight > 0``): ``adherence_weight = 0`` stays the seed's public scorer exactly.

What it does not catch: a degenerate tune that varies along all four at once (tonic and dominant
arpeggios alternating, a sequence transposed bar by bar, a scale broken into zig-zag
fragments), and an accompaniment whose chords are arpeggiated (``%%MIDI gchord`` patterns);
those are closer to music, and the feature score still compares them with the corpus. A tune
whose melody lies below abc2midi's chord part is measured on the chord part, as the feature
score measures it (``features.melody`` takes the highest part).
"""

from __future__ import annotations

import numpy as np

from rlonce.envs.music.features import Score, melody, melody_bars, pc_histogram

FACTORS = ("variety", "novelty", "contour", "line")
ANCHORS = {"variety": (2.0, 4.0), "novelty": (0.25, 0.75), "contour": (0.85, 0.5), "line": (0.9, 0.5)}
"""Per factor (value of no credit, value of full credit); a falling ramp when the first is larger."""
STEP = (1, 2)
"""Melodic intervals (semitones) that count as steps."""
RUN = 3
"""Steps in one direction that make a scale fragment."""


def ramp(x: float, zero: float, one: float) -> float:
    """0 at ``zero``, 1 at ``one``, linear between, clipped to [0, 1]."""
    return min(1.0, max(0.0, (x - zero) / (one - zero)))


def variety(score: Score) -> float:
    h = pc_histogram(melody(score))
    if h.sum() <= 0:
        return 0.0
    p = h[h > 0] / h.sum()
    return float(2.0 ** -(p * np.log2(p)).sum())


def novelty(score: Score, form: str) -> float:
    bars = melody_bars(score)
    if not bars:
        return 0.0
    new = len(bars) * len(set(form)) / len(form)
    return min(1.0, len(set(bars)) / new)


def scale_share(score: Score) -> float:
    """Share of melodic intervals inside monotone stepwise runs of at least ``RUN`` steps."""
    mel = melody(score)
    iv = [b.pitch - a.pitch for a, b in zip(mel, mel[1:])]
    if not iv:
        return 0.0
    covered, i = 0, 0
    while i < len(iv):
        j = i
        if abs(iv[i]) in STEP:
            while j + 1 < len(iv) and abs(iv[j + 1]) in STEP and (iv[j + 1] > 0) == (iv[i] > 0):
                j += 1
            if j - i + 1 >= RUN:
                covered += j - i + 1
        i = j + 1
    return covered / len(iv)


def chord_share(score: Score) -> float:
    """Share of the melody part's onsets where two or more of its notes start."""
    mel = melody(score)
    if not mel:
        return 1.0
    track = mel[0].track
    starts: dict[float, int] = {}
    for n in score.notes:
        if n.track == track:
            starts[n.start] = starts.get(n.start, 0) + 1
    return float(np.mean([c >= 2 for c in starts.values()]))


def measure(score: Score, form: str) -> dict[str, float]:
    """Each factor's raw value (``value_<factor>``), its ramp (``<factor>``) and their product
    (``substance``)."""
    values = {"variety": variety(score), "novelty": novelty(score, form), "contour": scale_share(score),
              "line": chord_share(score)}
    parts = {f"value_{k}": v for k, v in values.items()}
    parts.update({k: ramp(values[k], *ANCHORS[k]) for k in FACTORS})
    parts["substance"] = float(np.prod([parts[k] for k in FACTORS]))
    return parts
