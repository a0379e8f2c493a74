"""The feature score against reference percentiles, and its combination with request adherence.

Seed 001: "Band, low and high transforms compare these measurements with reference percentiles.
A separate distribution term uses Jensen–Shannon divergence over pitch-class, interval and
duration histograms. The combined score is 100 × (0.85 × base + 0.15 × dist_s), rounded to one
decimal, then divided by one hundred and clipped into the unit interval by the pipeline."

The transforms (the seed names them without formulas; ours): with the reference's 10th, 50th
and 90th percentiles p10, p50, p90 of a feature and the width ``w = max(p90 − p10,
0.05·|p50|, 1e-3)``,

    band(x) = 1 inside [p10, p90], else max(0, 1 − distance to the interval / w)
    low(x)  = 1 at or below p50,   else max(0, 1 − (x − p50) / w)
    high(x) = 1 at or above p50,   else max(0, 1 − (p50 − x) / w)

A group's score is the mean of its features' transforms; ``base = Σ weight_g · group_g`` with the
seed's weights; ``dist_s = 1 − mean(JSD_pitch_class, JSD_interval, JSD_duration)`` against the
reference's mean histograms (JSD in bits, so in [0, 1]).

Going beyond the seed's limit ("does not use ground_truth … to verify adherence to the musical
request"): ``reward = substance · ((1 − a) · score + a · adherence)`` with ``a = adherence_weight``
(``rlonce.envs.music.adherence``) and the substance factor of ``rlonce.envs.music.substance``
(degenerate tunes that match the corpus's statistics and the request's header); ``a = 0`` is the
public scorer exactly, substance included: it is not applied.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

import numpy as np

from rlonce.envs.music.features import FEATURES, GROUPS, HIST_BINS, Score, histograms, jsd, measure

WEIGHTS = {"rhythm": 0.22, "texture": 0.20, "acoustics": 0.14, "tonality": 0.16, "register": 0.16, "structure": 0.12}
BASE_SHARE, DIST_SHARE = 0.85, 0.15
TRANSFORM = {"note_length_entropy": "band", "ioi_entropy": "band", "density": "band", "polyphony": "band",
             "coverage": "band", "roughness": "low", "harmonicity": "high", "key_certainty": "high",
             "in_scale": "high", "range": "band", "voice_leading": "band", "self_similarity": "band",
             "tension_peaks": "band"}
assert set(TRANSFORM) == set(FEATURES)


@lru_cache(maxsize=1)
def reference() -> dict:
    """The shipped reference: percentiles per feature and mean histograms of the corpus
    (``python -m rlonce.envs.music.reference`` writes it)."""
    return json.loads(resources.files("rlonce.envs.music").joinpath("reference.json").read_text())


def width(p10: float, p50: float, p90: float) -> float:
    return max(p90 - p10, 0.05 * abs(p50), 1e-3)


def transform(kind: str, x: float, p10: float, p50: float, p90: float) -> float:
    w = width(p10, p50, p90)
    if kind == "band":
        d = p10 - x if x < p10 else x - p90 if x > p90 else 0.0
    elif kind == "low":
        d = max(0.0, x - p50)
    elif kind == "high":
        d = max(0.0, p50 - x)
    else:
        raise ValueError(f"unknown transform {kind!r}")
    return max(0.0, 1.0 - d / w)


def combine(base: float, dist_s: float) -> float:
    """The seed's combined score: 100 × (0.85·base + 0.15·dist_s), rounded to one decimal, / 100,
    clipped to [0, 1]."""
    return min(1.0, max(0.0, round(100.0 * (BASE_SHARE * base + DIST_SHARE * dist_s), 1) / 100.0))


def feature_score(score: Score, ref: dict | None = None) -> tuple[float, dict[str, float]]:
    """(combined score, its parts: each feature's value and transform, group scores, base,
    dist_s and the three divergences)."""
    ref = ref or reference()
    values = measure(score)
    parts: dict[str, float] = {}
    for f in FEATURES:
        parts[f] = float(values[f])
        parts[f"t_{f}"] = transform(TRANSFORM[f], values[f], *ref["percentiles"][f])
    base = 0.0
    for g, fs in GROUPS.items():
        parts[f"group_{g}"] = float(np.mean([parts[f"t_{f}"] for f in fs]))
        base += WEIGHTS[g] * parts[f"group_{g}"]
    hists = histograms(score)
    for h in HIST_BINS:
        parts[f"jsd_{h}"] = jsd(hists[h], np.asarray(ref["histograms"][h]))
    parts["base"] = base
    parts["dist_s"] = 1.0 - float(np.mean([parts[f"jsd_{h}"] for h in HIST_BINS]))
    return combine(base, parts["dist_s"]), parts


def reward(feature: float, adherence: float, adherence_weight: float, substance: float = 1.0) -> float:
    """``substance · ((1 − a) · feature + a · adherence)``; ``feature`` alone when ``a = 0`` (the
    seed's public scorer)."""
    if adherence_weight == 0:
        return feature
    return substance * ((1.0 - adherence_weight) * feature + adherence_weight * adherence)
