"""A seeded folk-tune composer: requests in, ABC notation out.

Used twice, with disjoint seeds: by the reference corpus the feature score compares against
(``rlonce.envs.music.reference``: the corpus is this generator's output, not a collection of
existing tunes; provenance is the code in this file) and by the scripted expert, which adds
controlled imperfections (``rlonce.envs.music.expert``).

Style: a melody as a random walk over scale degrees (mostly steps, some skips, rare leaps)
on rhythm cells that fill the bar exactly, sections ending on the tonic (a half cadence on the
dominant at the end of a first section), one chord symbol per bar (I, IV or V chosen by the
bar's first note) which abc2midi turns into a bass-and-chord accompaniment. A form such as
AABB writes each distinct section once and repeats it verbatim, bar for bar.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

LETTERS = "CDEFGAB"
KEYS = {"C": (0, True), "G": (7, True), "D": (2, True), "A": (9, True), "F": (5, True), "Bb": (10, True),
        "Eb": (3, True), "Am": (9, False), "Em": (4, False), "Dm": (2, False), "Gm": (7, False), "Bm": (11, False)}
"""ABC key → (tonic pitch class, major)."""
FLAT_KEYS = {"F", "Bb", "Eb", "Dm", "Gm"}
SHARP_NAMES = ["C", "C#", "D", "D#", "E", "F", "F#", "G", "G#", "A", "A#", "B"]
FLAT_NAMES = ["C", "Db", "D", "Eb", "E", "F", "Gb", "G", "Ab", "A", "Bb", "B"]
METERS = {"4/4": 8, "3/4": 6, "6/8": 6, "2/4": 4}
"""Meter → eighth notes per bar (the tunes use ``L:1/8``)."""
CELLS = {
    "4/4": [[2, 2, 2, 2], [1, 1, 2, 2, 2], [2, 1, 1, 2, 2], [3, 1, 2, 2], [4, 2, 2], [2, 2, 4], [1, 1, 1, 1, 2, 2]],
    "3/4": [[2, 2, 2], [1, 1, 2, 2], [3, 1, 2], [4, 2], [2, 1, 1, 2]],
    "6/8": [[3, 3], [1, 1, 1, 3], [2, 1, 3], [3, 2, 1], [2, 1, 2, 1], [1, 1, 1, 1, 1, 1]],
    "2/4": [[2, 2], [1, 1, 2], [1, 1, 1, 1], [3, 1]],
}
CADENCE = {"4/4": [4, 4], "3/4": [4, 2], "6/8": [3, 3], "2/4": [2, 2]}
INSTRUMENTS = {"piano": 0, "harpsichord": 6, "acoustic guitar": 24, "violin": 40, "cello": 42, "trumpet": 56,
               "clarinet": 71, "flute": 73, "accordion": 21, "fiddle": 110}
"""Instrument name → General MIDI program (0-based, as ``%%MIDI program`` takes it)."""
FORMS = ("AABB", "ABAB", "AABA", "ABAC", "AB")
STEP_P = ((1, 0.30), (-1, 0.30), (2, 0.12), (-2, 0.12), (0, 0.08), (3, 0.04), (-3, 0.04))
LOW, HIGH = -3, 9
"""Melody range in scale degrees around the tonic (about a twelfth)."""


@dataclass(frozen=True)
class Request:
    key: str
    meter: str
    bars: int
    tempo: int
    """Quarter notes per minute (``Q:1/4=tempo``)."""
    instrument: str
    form: str

    @property
    def program(self) -> int:
        return INSTRUMENTS[self.instrument]

    @property
    def section_bars(self) -> int:
        return self.bars // len(self.form)


def random_request(rng: random.Random, max_bars: int = 24) -> Request:
    """A request of at most ``max_bars`` bars (at least 8: every form fits)."""
    form = rng.choice(FORMS)
    lengths = (8, 16, 16, 24) if len(form) == 4 else (8, 12, 16)
    bars = rng.choice([b for b in lengths if b <= max_bars] or [8])
    return Request(rng.choice(list(KEYS)), rng.choice(list(METERS)), bars, rng.randrange(60, 164, 4),
                   rng.choice(list(INSTRUMENTS)), form)


def note_text(key: str, degree: int, eighths: int) -> str:
    """Scale degree (0 = the tonic near middle C) as an ABC note of ``eighths`` eighth notes; the
    key signature supplies accidentals."""
    tonic_letter = LETTERS.index(key[0])
    idx = tonic_letter + degree
    letter, octave = LETTERS[idx % 7], idx // 7
    text = letter.lower() + "'" * (octave - 1) if octave >= 1 else letter + "," * (-octave)
    return text + (str(eighths) if eighths != 1 else "")


def chord_name(key: str, degree: int) -> str:
    """The chord symbol over a bar starting on ``degree``: I, IV or V (v is major in minor keys)."""
    tonic, major = KEYS[key]
    d = degree % 7
    root_step, quality = ((0, "" if major else "m") if d in (0, 2) else
                          (5, "" if major else "m") if d in (3, 5) else (7, ""))
    names = FLAT_NAMES if key in FLAT_KEYS else SHARP_NAMES
    return names[(tonic + root_step) % 12] + quality


def _walk(rng: random.Random, degree: int) -> int:
    r, acc, step = rng.random(), 0.0, 0
    for s, p in STEP_P:
        acc += p
        step = s
        if r < acc:
            break
    nxt = degree + step
    return nxt if LOW <= nxt <= HIGH else degree - step


def section(rng: random.Random, req: Request, *, final: bool, start: int = 0) -> list[list[tuple[int, int]]]:
    """Bars of (degree, eighths) for one section; the last bar cadences (tonic when ``final``,
    else the dominant)."""
    degree, bars = start, []
    for b in range(req.section_bars):
        last = b == req.section_bars - 1
        cells = CADENCE[req.meter] if last else rng.choice(CELLS[req.meter])
        bar = []
        for i, dur in enumerate(cells):
            degree = _walk(rng, degree)
            if last and i == len(cells) - 1:
                degree = (0 if abs(degree) < abs(degree - 7) else 7) if final else 4
            bar.append((degree, dur))
        bars.append(bar)
    return bars


def header(req: Request, title: str, *, program: bool = True, tempo: int | None = None) -> list[str]:
    lines = ["X:1", f"T:{title}", f"M:{req.meter}", "L:1/8", f"Q:1/4={tempo or req.tempo}", f"K:{req.key}"]
    return lines + ([f"%%MIDI program {req.program}"] if program else [])


def bar_text(key: str, bar: list[tuple[int, int]], chords: bool) -> str:
    notes = "".join(note_text(key, d, e) for d, e in bar)
    return (f'"{chord_name(key, bar[0][0])}"' if chords else "") + notes


MAX_RUN_SHARE = 0.45
"""Most of a melody's intervals that may lie in scale runs (``run_share``): the grader's contour
factor (``rlonce.envs.music.substance``) gives full credit up to 0.5."""
MIN_VARIETY = 4.2
"""Least pitch-class variety of a melody (``variety``): the grader's variety factor gives full
credit from 4. With both bounds an expert's tune never loses substance to its own random walk."""


def run_share(degrees: list[int], run: int = 3) -> float:
    """Share of the melody's intervals inside monotone runs of at least ``run`` neighbouring scale
    degrees: on a diatonic scale a neighbour is one or two semitones, so this is
    ``substance.scale_share`` of the tune before its accidentals."""
    iv = [b - a for a, b in zip(degrees, degrees[1:])]
    covered, i = 0, 0
    while i < len(iv):
        j = i
        if abs(iv[i]) == 1:
            while j + 1 < len(iv) and iv[j + 1] == iv[i]:
                j += 1
            if j - i + 1 >= run:
                covered += j - i + 1
        i = j + 1
    return covered / len(iv) if iv else 0.0


def variety(notes: list[tuple[int, int]]) -> float:
    """Perplexity of the melody's duration-weighted scale degrees (mod 7): distinct degrees are
    distinct pitch classes, so this is ``substance.variety`` of the tune before its accidentals."""
    weight: dict[int, int] = {}
    for degree, eighths in notes:
        weight[degree % 7] = weight.get(degree % 7, 0) + eighths
    total = sum(weight.values())
    return 2.0 ** -sum(w / total * math.log2(w / total) for w in weight.values()) if total else 0.0


def sections(rng: random.Random, req: Request) -> dict[str, list[list[tuple[int, int]]]]:
    """Each distinct section letter of the form, composed once; the form's last letter ends on the
    tonic, the others on the dominant unless they also close the form. A draw whose melody runs
    up or down the scale too much or keeps to too few notes (``MAX_RUN_SHARE``, ``MIN_VARIETY``)
    is drawn again."""
    for _ in range(64):
        out: dict[str, list] = {}
        for letter in req.form:
            if letter not in out:
                final = letter == req.form[-1]
                out[letter] = section(rng, req, final=final, start=rng.choice((0, 2, 4)))
        notes = [note for letter in req.form for bar in out[letter] for note in bar]
        if run_share([d for d, _ in notes]) <= MAX_RUN_SHARE and variety(notes) >= MIN_VARIETY:
            break
    return out


def render(req: Request, parts: dict[str, list], title: str, *, chords: bool = True, program: bool = True,
           tempo: int | None = None) -> str:
    """The tune's ABC text: the header, then one line per section of the form."""
    lines = header(req, title, program=program, tempo=tempo)
    for letter in req.form:
        lines.append("|".join(bar_text(req.key, bar, chords) for bar in parts[letter]) + "|")
    lines[-1] = lines[-1][:-1] + "|]"
    return "\n".join(lines) + "\n"


def compose(rng: random.Random, req: Request, title: str = "Tune") -> str:
    """A tune that meets ``req`` exactly."""
    return render(req, sections(rng, req), title)
