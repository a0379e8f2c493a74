"""The music grader's numbers by hand: transforms, JSD, the seed's combined score, features of a
hand-built score, the substance factor, extraction and gates, request adherence."""

import math
import random

import numpy as np
import pytest

from rlonce.envs.music import abc, adherence, substance
from rlonce.envs.music.compose import Request, compose
from rlonce.envs.music.features import FEATURES, Note, Score, histograms, jsd, measure
from rlonce.envs.music.score import WEIGHTS, combine, feature_score, reward, transform


def test_weights_are_the_seeds():
    assert WEIGHTS == {"rhythm": 0.22, "texture": 0.20, "acoustics": 0.14, "tonality": 0.16, "register": 0.16,
                       "structure": 0.12}
    assert sum(WEIGHTS.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("kind,x,expected", [
    ("band", 5.0, 1.0), ("band", 2.0, 1.0), ("band", 1.0, 1 - 1 / 6), ("band", 9.0, 1 - 1 / 6), ("band", 20.0, 0.0),
    ("low", 3.0, 1.0), ("low", 6.0, 0.5), ("low", 10.0, 0.0),
    ("high", 7.0, 1.0), ("high", 0.0, 0.5), ("high", -4.0, 0.0),
])
def test_transforms_by_hand(kind, x, expected):
    # p10 = 2, p50 = 3, p90 = 8: width 6
    assert transform(kind, x, 2.0, 3.0, 8.0) == pytest.approx(expected)


def test_jensen_shannon_by_hand():
    assert jsd([1, 0], [0, 1]) == pytest.approx(1.0)
    assert jsd([1, 1], [2, 2]) == pytest.approx(0.0)
    # m = (.75, .25): KL(p||m) = .5 log2(.5/.75) + .5 log2(.5/.25); KL(q||m) = log2(1/.75)
    kl_p = 0.5 * math.log2(0.5 / 0.75) + 0.5 * math.log2(2.0)
    kl_q = math.log2(1 / 0.75)
    assert jsd([0.5, 0.5], [1.0, 0.0]) == pytest.approx(0.5 * kl_p + 0.5 * kl_q)
    assert jsd([0, 0], [1, 0]) == 1.0  # an empty histogram is as far as it gets


@pytest.mark.parametrize("base,dist,expected", [
    (0.8, 0.6, 0.77),          # 100 x (0.68 + 0.09) = 77.0
    (0.5123, 0.3, 0.48),       # 100 x (0.435455 + 0.045) = 48.0455 -> 48.0
    (0.5123, 0.31, 0.482),     # 48.1955 -> 48.2
    (1.0, 1.0, 1.0), (0.0, 0.0, 0.0),
])
def test_the_seeds_combined_score(base, dist, expected):
    assert combine(base, dist) == pytest.approx(expected)


def _scale_run() -> Score:
    """C D E F, one quarter each, in one 4/4 bar, one part."""
    notes = tuple(Note(p, float(i), float(i + 1), 0) for i, p in enumerate((60, 62, 64, 65)))
    return Score(notes, 4.0, (4, 4), 120.0)


def test_features_of_a_hand_built_score():
    f = measure(_scale_run())
    assert f["note_length_entropy"] == 0.0 and f["ioi_entropy"] == 0.0  # one duration, one gap
    assert f["density"] == 1.0  # 4 onsets over 4 quarters
    assert f["polyphony"] == 1.0 and f["coverage"] == 0.0 and f["roughness"] == 0.0  # one note at a time
    assert f["harmonicity"] == 0.5  # best triad (C-E-G, D-F-A or F-A-C) holds 2 of the 4 equal notes
    assert f["in_scale"] == 1.0  # all four are in the estimated key's scale
    assert f["range"] == 5.0 and f["voice_leading"] == pytest.approx((2 + 2 + 1) / 3)
    assert f["self_similarity"] == 0.0 and f["tension_peaks"] == 0.0  # one bar: nothing to compare
    h = histograms(_scale_run())
    assert h["interval"][12 + 2] == pytest.approx(2 / 3) and h["interval"][12 + 1] == pytest.approx(1 / 3)
    assert h["duration"][3] == 1.0  # every note four sixteenths


def test_feature_score_by_hand():
    """A reference built around the score's own values, except two features whose transforms are
    worked out by hand: the combination then follows the seed's formula exactly."""
    score = _scale_run()
    v = measure(score)
    pct = {f: [v[f] - 1, v[f], v[f] + 1] for f in FEATURES}
    pct["density"] = [2.0, 3.0, 4.0]      # band: x = 1 is 1 below p10, width 2 -> 0.5
    pct["roughness"] = [-1.0, -0.5, 0.5]  # low: x = 0 is 0.5 above p50, width 1.5 -> 2/3
    ref = {"percentiles": pct, "histograms": {k: list(h) for k, h in histograms(score).items()}}
    got, parts = feature_score(score, ref)
    rhythm, acoustics = (1 + 1 + 0.5) / 3, (2 / 3 + 1) / 2
    base = 0.22 * rhythm + 0.20 + 0.14 * acoustics + 0.16 + 0.16 + 0.12
    assert parts["t_density"] == pytest.approx(0.5) and parts["t_roughness"] == pytest.approx(2 / 3)
    assert parts["base"] == pytest.approx(base) and parts["dist_s"] == pytest.approx(1.0)
    assert got == pytest.approx(round(100 * (0.85 * base + 0.15 * 1.0), 1) / 100)
    assert got == pytest.approx(0.949)
    assert reward(got, 0.5, 0.0) == got and reward(got, 0.5, 0.5) == pytest.approx(0.5 * got + 0.25)


def _tune(pitches_per_bar, durations=None) -> Score:
    """4/4 bars of quarter notes (or the given lengths), one part; a tuple of pitches is a chord."""
    notes, t = [], 0.0
    for bar in pitches_per_bar:
        for i, p in enumerate(bar):
            d = durations[i] if durations else 4.0 / len(bar)
            notes += [Note(q, t, t + d, 0) for q in (p if isinstance(p, tuple) else (p,))]
            t += d
    return Score(tuple(notes), 4.0, (4, 4), 120.0)


def test_substance_factors_by_hand():
    # C for half a bar, D and E a quarter each: p = (1/2, 1/4, 1/4), entropy 1.5 bits, 2^1.5 pitch classes
    s = _tune([[60, 62, 64]], durations=[2.0, 1.0, 1.0])
    assert substance.variety(s) == pytest.approx(2 ** 1.5)
    assert substance.measure(s, "A")["variety"] == pytest.approx((2 ** 1.5 - 2) / 2)  # 0 at 2, 1 at 4
    assert substance.variety(_tune([[60, 72, 60, 60]])) == pytest.approx(1.0)  # one pitch class, two octaves
    # four one-note bars C C C D: 2 distinct; AB asks for 4 new bars (0.5 -> ramp 0.5), AABB for 2
    bars = _tune([[60], [60], [60], [62]])
    assert substance.novelty(bars, "AB") == pytest.approx(0.5)
    assert substance.measure(bars, "AB")["novelty"] == pytest.approx(0.5)  # 0 at 0.25, 1 at 0.75
    assert substance.novelty(bars, "AABB") == 1.0
    assert substance.novelty(_tune([[60]] * 4), "AB") == pytest.approx(0.25)
    # C D E F G then down to C: steps 2 2 1 2 (one run of 4) and a leap of 7: 4 of 5 intervals
    scale = _tune([[60, 62, 64, 65], [67, 60]])
    assert substance.scale_share(scale) == pytest.approx(0.8)
    assert substance.measure(scale, "A")["contour"] == pytest.approx((0.85 - 0.8) / 0.35)  # 1 at 0.5, 0 at 0.85
    assert substance.scale_share(_tune([[60, 62, 64, 60]])) == 0.0  # a run of two steps is not a scale
    # chords at 3 of 4 onsets: 0.75 -> (0.9 - 0.75) / 0.4
    chords = _tune([[(60, 64), (62, 65), (64, 67), 65]])
    assert substance.chord_share(chords) == pytest.approx(0.75)
    assert substance.measure(chords, "A")["line"] == pytest.approx(0.15 / 0.4)


def test_substance_is_the_product_and_the_default_reward_carries_it():
    # C D E F | G C C C: pitch classes C 4/8, D E F G 1/8 each: entropy 2 bits, 4 pitch classes (variety 1);
    # intervals 2 2 1 2 -7 0 0: one run of four steps, 4 of 7 (contour (0.85 - 4/7) / 0.35); two new bars
    # of the two AB asks for (novelty 1); one note at a time (line 1)
    tune = _tune([[60, 62, 64, 65], [67, 60, 60, 60]])
    parts = substance.measure(tune, "AB")
    assert parts["value_variety"] == pytest.approx(4.0) and parts["value_contour"] == pytest.approx(4 / 7)
    assert [parts[k] for k in ("variety", "novelty", "line")] == [1.0, 1.0, 1.0]
    s = (0.85 - 4 / 7) / 0.35
    assert parts["substance"] == pytest.approx(s) and s == pytest.approx(0.795918, abs=1e-6)
    assert reward(0.9, 1.0, 0.5, s) == pytest.approx(s * 0.95)
    assert reward(0.9, 1.0, 0.0, 0.0) == 0.9  # adherence weight 0: the public scorer, no factor
    assert reward(0.9, 1.0, 0.5) == pytest.approx(0.95)  # substance defaults to 1


@pytest.mark.parametrize("reply,expected", [
    ("Here:\n```abc\nX:1\nK:C\nCDEF|\n```\nX:2\nK:G\nGABc|\n", "X:1\nK:C\nCDEF|\n"),  # the fenced block wins
    ("```\nnot music\n```\nX:1\nK:C\nC|\nX:2\nK:D\nD|\n", "X:2\nK:D\nD|\n"),  # else from the last header
    ("no tune here", None),
])
def test_extraction_rule(reply, expected):
    assert abc.extract(reply) == expected


@pytest.mark.parametrize("text,gate", [
    (None, "no_abc"),
    ("X:1\nK:C\n" + "C" * abc.MAX_ABC_CHARS, "too_long"),
    ("X:1\nK:C\nC|\nX:2\nK:C\nD|\n", "multiple_tunes"),
    ("X:1\nK:C\nCDEF|\n\nGABc|\n", "blank_line"),
    ("X:1\nK:C\n%%MIDI program 40\nCDEF|\n%%MIDI program 41\nGABc|\n", "program_conflict"),
    ("X:1\nK:C\nV:1\n%%MIDI program 40\nCDEF|\nV:2\n%%MIDI program 41\nGABc|\n", None),  # two voices: fine
    ("X:1\nK:C\nCDEF|\n% a comment after\n", None),
])
def test_static_gates(text, gate):
    assert abc.static_gate(text) == gate


REQ = Request("G", "3/4", 8, 96, "violin", "AABB")


@pytest.mark.sandbox
@pytest.mark.abcmidi
def test_a_composed_tune_meets_its_request_and_a_spoiled_one_does_not():
    import asyncio

    from rlonce.envs.music.features import read_midi

    good = compose(random.Random(3), REQ)
    conv = asyncio.run(abc.convert(good))
    assert conv.gate(REQ.bars) is None and conv.errors == 0 and conv.bar_warnings == 0
    items = adherence.check(REQ, good, read_midi(conv.midi))
    assert items == dict.fromkeys(adherence.ITEMS, True) and adherence.adherence(items) == 1.0
    # B copied from A: the form's B sections no longer differ; a wrong tempo and key header
    lines = good.splitlines()
    a_line = next(ln for ln in lines if ln.startswith('"'))
    spoiled = "\n".join(ln if not ln.startswith('"') else a_line for ln in lines).replace("Q:1/4=96", "Q:1/4=120")
    spoiled = spoiled.replace("K:G", "K:D") + "\n"
    s2 = read_midi(asyncio.run(abc.convert(spoiled)).midi)
    items2 = adherence.check(REQ, spoiled, s2)
    assert not items2["form"] and not items2["tempo"] and not items2["key"]
    assert items2["meter"] and items2["instrument"] and items2["bars"]
    assert adherence.adherence(items2) == pytest.approx(0.5)


@pytest.mark.sandbox
@pytest.mark.abcmidi
def test_abc2midi_errors_and_bar_warnings_are_read_from_its_log():
    import asyncio

    bad = asyncio.run(abc.convert("X:1\nM:4/4\nL:1/8\nK:C\nCDEF GABc|cdef gab|z2 ~~ !!x H|\n"))
    assert bad.errors >= 1 and bad.gate(8) == "compile_error"
    long_bars = "X:1\nM:4/4\nL:1/8\nK:C\n" + "|".join(["CDEFGABcd"] * 6) + "|\n"
    conv = asyncio.run(abc.convert(long_bars))
    assert conv.errors == 0 and conv.bar_warnings >= 3 and conv.gate(6) == "bar_warnings"


def test_a_missing_abc2midi_is_infrastructure(monkeypatch):
    import asyncio

    from rlonce.core.records import FailureCategory, Sequence, Status
    from rlonce.envs.base import grade_or_infra
    from rlonce.envs.music.env import MusicEnv
    from rlonce.envs.music.tasks import make_task

    monkeypatch.setattr(abc.shutil, "which", lambda name: None)
    with pytest.raises(abc.Abc2MidiMissing, match="apt-get install abcmidi"):
        abc.require_abc2midi()
    seq = Sequence("music/train/0", "music")
    seq.answer = compose(random.Random(0), REQ)
    assert asyncio.run(grade_or_infra(MusicEnv(make_task("train", 0)), seq)) is None
    assert seq.status is Status.INFRA and seq.failure is FailureCategory.GRADER_UNAVAILABLE


@pytest.mark.abcmidi
def test_reference_is_the_corpus_generator_output():
    """The shipped statistics are what the generator gives (a small corpus checks the pipeline;
    the full rebuild is ``python -m rlonce.envs.music.reference``)."""
    from rlonce.envs.music.reference import build
    from rlonce.envs.music.score import reference

    ref = reference()
    assert ref["tunes"] >= 200 and set(ref["percentiles"]) == set(FEATURES)
    assert all(p[0] <= p[1] <= p[2] for p in ref["percentiles"].values())
    assert all(sum(h) == pytest.approx(1.0, abs=1e-4) for h in ref["histograms"].values())
    small = build(n=12)
    assert set(small["percentiles"]) == set(FEATURES)
    assert np.isfinite([x for p in small["percentiles"].values() for x in p]).all()


def test_the_expert_never_draws_a_melody_the_substance_factor_marks_down():
    """A random walk of 8 bars kept to few pitch classes or ran up the scale in about 3 % of
    draws (variety or contour under full credit), and the scripted expert's demonstration failed
    its own task. ``sections`` draws again (graded through abc2midi in
    tests/integration/test_music_domain.py); here, hand-computed cases and the bound over many draws."""
    import random

    from rlonce.envs.music.compose import MAX_RUN_SHARE, MIN_VARIETY, random_request, run_share, sections, variety

    assert run_share([0, 1, 2, 3, 3, 2]) == pytest.approx(3 / 5)  # one run of three rising steps, then a repeat
    assert run_share([0, 2, 1, 3, 2]) == 0.0  # zig-zag: no run
    assert variety([(0, 2), (4, 2)]) == pytest.approx(2.0) and variety([(0, 1), (7, 1)]) == pytest.approx(1.0)
    rng = random.Random(5)
    for _ in range(300):
        req = random_request(rng, max_bars=8)
        parts = sections(rng, req)
        notes = [n for letter in req.form for bar in parts[letter] for n in bar]
        assert run_share([d for d, _ in notes]) <= MAX_RUN_SHARE and variety(notes) >= MIN_VARIETY
