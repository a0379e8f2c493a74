"""MIDI → measurements: the seed's six feature groups and three histograms.

Seed 001: "The feature model covers rhythm, texture, acoustics, tonality, register and structure,
with weights 0.22, 0.20, 0.14, 0.16, 0.16 and 0.12. Features include note-length entropy,
inter-onset intervals, density, polyphony, roughness, harmonicity, key certainty, in-scale
pitches, range, voice leading, self-similarity and tension peaks." The seed names the features,
not their definitions (the public helpers were not audited); the definitions here are ours,
each a plain statistic of the note list:

  rhythm     note_length_entropy  entropy (bits) of melody durations on a sixteenth grid
             ioi_entropy          entropy (bits) of melody inter-onset intervals, same grid
             density              melody onsets per quarter note
  texture    polyphony            mean notes sounding at each onset (all parts)
             coverage             share of onsets with two or more notes sounding
  acoustics  roughness            share of simultaneous note pairs a semitone, tone, tritone or
                                  seventh apart (interval classes 1, 2, 6, 10, 11)
             harmonicity          mean over bars of the duration share of the bar's pitch
                                  classes inside its best-fitting major or minor triad
  tonality   key_certainty        best Krumhansl–Kessler profile correlation over 24 keys
             in_scale             duration share of pitches in that key's scale
  register   range                melody range in semitones
             voice_leading        mean absolute melodic interval in semitones
  structure  self_similarity      mean over bars of the best cosine similarity of its pitch-class
                                  vector to another bar's
             tension_peaks        local maxima of the per-bar tension curve (mean pitch height
                                  plus the share of out-of-scale duration) per bar

The melody is the part (MIDI track) with the highest mean pitch, reduced to its highest note at
each onset. Histograms for the
distribution term: pitch class rotated so the estimated tonic is 0 (tunes in different keys
compare), melodic interval clipped to ±12, duration on the sixteenth grid (16 bins).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np

GROUPS = {
    "rhythm": ("note_length_entropy", "ioi_entropy", "density"),
    "texture": ("polyphony", "coverage"),
    "acoustics": ("roughness", "harmonicity"),
    "tonality": ("key_certainty", "in_scale"),
    "register": ("range", "voice_leading"),
    "structure": ("self_similarity", "tension_peaks"),
}
FEATURES = tuple(f for fs in GROUPS.values() for f in fs)
MAJOR = np.array([6.35, 2.23, 3.48, 2.33, 4.38, 4.09, 2.52, 5.19, 2.39, 3.66, 2.29, 2.88])
MINOR = np.array([6.33, 2.68, 3.52, 5.38, 2.60, 3.53, 2.54, 4.75, 3.98, 2.69, 3.34, 3.17])
"""Krumhansl–Kessler key profiles (1982)."""
MAJOR_SCALE = (0, 2, 4, 5, 7, 9, 11)
MINOR_SCALE = (0, 2, 3, 5, 7, 8, 10, 11)
"""Natural minor plus the raised seventh of harmonic minor."""
ROUGH = frozenset({1, 2, 6, 10, 11})
GRID = 0.25
"""Quantisation step in quarter notes (a sixteenth)."""
HIST_BINS = {"pitch_class": 12, "interval": 25, "duration": 16}


@dataclass(frozen=True)
class Note:
    pitch: int
    start: float
    """In quarter notes from the start."""
    end: float
    program: int
    track: int = 0
    """The MIDI part (pretty_midi instrument) it belongs to."""


@dataclass(frozen=True)
class Score:
    """What the MIDI holds, in quarter notes."""

    notes: tuple[Note, ...]
    bar_quarters: float
    meter: tuple[int, int]
    tempo_qpm: float

    @property
    def quarters(self) -> float:
        return max((n.end for n in self.notes), default=0.0)

    @property
    def seconds(self) -> float:
        return self.quarters * 60.0 / self.tempo_qpm


def read_midi(data: bytes) -> Score:
    """Parse MIDI bytes (``pretty_midi``: notes with the tempo map resolved, time signatures,
    programs). Times are converted to quarter notes with the first tempo."""
    import pretty_midi

    pm = pretty_midi.PrettyMIDI(io.BytesIO(data))
    _, tempi = pm.get_tempo_changes()
    qpm = float(tempi[0]) if len(tempi) else 120.0
    ts = pm.time_signature_changes[0] if pm.time_signature_changes else None
    meter = (ts.numerator, ts.denominator) if ts else (4, 4)
    q = qpm / 60.0
    notes = tuple(sorted((Note(n.pitch, round(n.start * q, 4), round(n.end * q, 4), inst.program, k)
                          for k, inst in enumerate(pm.instruments) if not inst.is_drum for n in inst.notes),
                         key=lambda n: (n.start, -n.pitch)))
    return Score(notes, meter[0] * 4.0 / meter[1], meter, qpm)


def melody(score: Score) -> list[Note]:
    """The melody: the part with the highest mean pitch, and in it the highest note at each onset."""
    tracks: dict[int, list[int]] = {}
    for n in score.notes:
        tracks.setdefault(n.track, []).append(n.pitch)
    if not tracks:
        return []
    top = max(tracks, key=lambda k: (float(np.mean(tracks[k])), -k))
    out: dict[float, Note] = {}
    for n in score.notes:
        if n.track != top:
            continue
        if n.start not in out or n.pitch > out[n.start].pitch:
            out[n.start] = n
    return [out[t] for t in sorted(out)]


def bar_count(score: Score) -> int:
    """The length in bars, rounded up (0 for no notes)."""
    return math.ceil(score.quarters / score.bar_quarters - 1e-6) if score.notes else 0


def melody_bars(score: Score) -> list[tuple]:
    """The melody bar by bar, each as its tuple of (pitch, onset within the bar, duration)."""
    out: list[list] = [[] for _ in range(bar_count(score))]
    for n in melody(score):
        b = min(len(out) - 1, int(n.start // score.bar_quarters))
        out[b].append((n.pitch, round(n.start - b * score.bar_quarters, 3), round(n.end - n.start, 3)))
    return [tuple(b) for b in out]


def entropy(values) -> float:
    counts = np.unique(np.asarray(values), return_counts=True)[1]
    if counts.size == 0:
        return 0.0
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def _grid(x: float) -> int:
    return max(1, round(x / GRID))


def pc_histogram(notes) -> np.ndarray:
    h = np.zeros(12)
    for n in notes:
        h[n.pitch % 12] += n.end - n.start
    return h


def best_key(h: np.ndarray) -> tuple[int, bool, float]:
    """(tonic, is_major, correlation): the Krumhansl–Schmuckler estimate."""
    if h.sum() <= 0 or np.allclose(h, h[0]):
        return 0, True, 0.0
    best = (0, True, -2.0)
    for tonic in range(12):
        for major, prof in ((True, MAJOR), (False, MINOR)):
            r = float(np.corrcoef(h, np.roll(prof, tonic))[0, 1])
            if r > best[2]:
                best = (tonic, major, r)
    return best


def scale_share(h: np.ndarray, tonic: int, major: bool) -> float:
    scale = {(tonic + s) % 12 for s in (MAJOR_SCALE if major else MINOR_SCALE)}
    total = h.sum()
    return float(sum(h[i] for i in scale) / total) if total > 0 else 0.0


def bars_of(score: Score) -> list[list[Note]]:
    """Notes by the bar they start in."""
    n_bars = max(1, math.ceil(score.quarters / score.bar_quarters - 1e-6))
    out: list[list[Note]] = [[] for _ in range(n_bars)]
    for n in score.notes:
        out[min(n_bars - 1, int(n.start // score.bar_quarters))].append(n)
    return out


def _sounding(score: Score) -> list[list[int]]:
    """Pitches sounding at each distinct onset."""
    onsets = sorted({n.start for n in score.notes})
    return [[n.pitch for n in score.notes if n.start <= t < n.end] for t in onsets]


def _triad_share(h: np.ndarray) -> float:
    total = h.sum()
    if total <= 0:
        return 0.0
    best = max(h[r] + h[(r + third) % 12] + h[(r + 7) % 12] for r in range(12) for third in (3, 4))
    return float(best / total)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else 0.0


def _structure(score: Score, tonic: int, major: bool) -> tuple[float, float]:
    bars = [b for b in bars_of(score) if b]
    vecs = [pc_histogram(b) for b in bars]
    sims = [max((_cosine(v, w) for j, w in enumerate(vecs) if j != i), default=0.0) for i, v in enumerate(vecs)]
    tension = [np.mean([n.pitch for n in b]) / 12.0 + (1.0 - scale_share(v, tonic, major)) for b, v in zip(bars, vecs)]
    peaks = sum(1 for i in range(1, len(tension) - 1) if tension[i - 1] < tension[i] > tension[i + 1])
    return (float(np.mean(sims)) if sims else 0.0), peaks / max(1, len(bars))


def measure(score: Score) -> dict[str, float]:
    """The twelve features of ``score`` (see the module docstring)."""
    mel = melody(score)
    onsets = [n.start for n in mel]
    iois = [_grid(b - a) for a, b in zip(onsets, onsets[1:])]
    h = pc_histogram(score.notes)
    tonic, major, certainty = best_key(h)
    sounding = _sounding(score)
    pairs = [(a, b) for s in sounding for i, a in enumerate(s) for b in s[i + 1:]]
    steps = [abs(b.pitch - a.pitch) for a, b in zip(mel, mel[1:])]
    bars = [b for b in bars_of(score) if b]
    similarity, peaks = _structure(score, tonic, major)
    return {
        "note_length_entropy": entropy([_grid(n.end - n.start) for n in mel]),
        "ioi_entropy": entropy(iois),
        "density": len(mel) / max(score.quarters, GRID),
        "polyphony": float(np.mean([len(s) for s in sounding])) if sounding else 0.0,
        "coverage": float(np.mean([len(s) >= 2 for s in sounding])) if sounding else 0.0,
        "roughness": float(np.mean([abs(a - b) % 12 in ROUGH for a, b in pairs])) if pairs else 0.0,
        "harmonicity": float(np.mean([_triad_share(pc_histogram(b)) for b in bars])) if bars else 0.0,
        "key_certainty": max(0.0, certainty),
        "in_scale": scale_share(h, tonic, major),
        "range": float(max(n.pitch for n in mel) - min(n.pitch for n in mel)) if mel else 0.0,
        "voice_leading": float(np.mean(steps)) if steps else 0.0,
        "self_similarity": similarity,
        "tension_peaks": peaks,
    }


def histograms(score: Score) -> dict[str, np.ndarray]:
    """Normalised pitch-class (tonic-relative), interval and duration histograms."""
    mel = melody(score)
    h = pc_histogram(score.notes)
    tonic = best_key(h)[0]
    out = {"pitch_class": np.roll(h, -tonic),
           "interval": np.bincount([max(-12, min(12, b.pitch - a.pitch)) + 12 for a, b in zip(mel, mel[1:])],
                                   minlength=25).astype(float),
           "duration": np.bincount([min(16, _grid(n.end - n.start)) - 1 for n in mel], minlength=16).astype(float)}
    return {k: v / v.sum() if v.sum() > 0 else v for k, v in out.items()}


def jsd(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen–Shannon divergence in bits (0 = equal, 1 = disjoint); an empty ``p`` is 1."""
    p, q = np.asarray(p, float), np.asarray(q, float)
    if p.sum() <= 0 or q.sum() <= 0:
        return 1.0
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2

    def kl(a, b):
        mask = a > 0
        return float((a[mask] * np.log2(a[mask] / b[mask])).sum())

    return max(0.0, min(1.0, 0.5 * kl(p, m) + 0.5 * kl(q, m)))
