"""``rlonce probe music``: shortcut tunes against the grader, next to the scripted expert.

Each route writes one answer for a task — what a policy might find cheaper than a real tune:
nothing, a header without notes, a minimal tune, one note repeated for the requested length, a
copied reference tune, random notes under a correct header, a fenced block with a second ``X:``
tune after it, a good tune placed after a fenced junk block, a huge tune, and (with tools) a
submitted path that is a link to a host file. The ``DEGENERATE`` routes write well-formed tunes
with the requested header, form and chord symbols but no substance: tonic-triad arpeggios, one
section for every letter of the form, a scale per section, one bar repeated, one pitch, chord
symbols over rests. Every answer goes through the normal grading path. The report gives each
route's mean, median and highest reward and their ratios to the expert's median; a route whose
highest reward reaches the expert's median is a hole, and a degenerate route above
``DEGENERATE_RATIO`` of it at its highest is named.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Callable

from tqdm.auto import tqdm

from rlonce.core.records import Sequence
from rlonce.envs.music.compose import CELLS, HIGH, LOW, METERS, header, note_text, render, section, sections
from rlonce.envs.music.env import ADHERENCE_WEIGHT, MusicEnv
from rlonce.envs.music.expert import expert_reply, expert_tune
from rlonce.envs.music.reference import corpus
from rlonce.envs.music.tasks import MusicTask, make_task


def _fenced(abc: str) -> str:
    return f"```abc\n{abc}```"


def _filled(task: MusicTask, note: Callable[[random.Random], str], rng: random.Random) -> str:
    """The requested header, then ``bars`` bars filled with eighth notes from ``note``."""
    r = task.request
    bars = ["".join(note(rng) for _ in range(METERS[r.meter])) for _ in range(r.bars)]
    rows = ["|".join(bars[i:i + 4]) + "|" for i in range(0, len(bars), 4)]
    return "\n".join([*header(r, "Probe"), *rows]) + "\n"


def _random_note(rng: random.Random) -> str:
    return rng.choice(["", "^", "_"]) + rng.choice("CDEFGABcdefgab")


def _form_tune(task: MusicTask, bars_of: Callable[[int], list[list[tuple[int, int]]]], *, chords: bool = True) -> str:
    """The requested header and form, each distinct section letter's bars from ``bars_of(i)`` (the
    letter's index among the distinct ones), chord symbols from each bar's first degree."""
    r = task.request
    letters = list(dict.fromkeys(r.form))
    return render(r, {x: bars_of(i) for i, x in enumerate(letters)}, "Probe", chords=chords)


def _cells(task: MusicTask, rng: random.Random, degrees: Callable[[int], int]) -> list[list[tuple[int, int]]]:
    """One section of the corpus's rhythm cells whose n-th note (counted through the section) is
    on ``degrees(n)``."""
    r, n, out = task.request, 0, []
    for _ in range(r.section_bars):
        bar = []
        for dur in rng.choice(CELLS[r.meter]):
            bar.append((degrees(n), dur))
            n += 1
        out.append(bar)
    return out


def _arpeggios(task: MusicTask, rng: random.Random) -> str:
    """Only the tonic triad, up and down, over corpus rhythms; sections differ by where they start."""
    cycle = (0, 2, 4, 7, 4, 2)
    return _form_tune(task, lambda i: _cells(task, rng, lambda n: cycle[(n + 2 * i) % len(cycle)]))


def _scales(task: MusicTask, rng: random.Random) -> str:
    """Each section one scale run over the corpus's range (up in one section, down in the next),
    turning at its ends, over corpus rhythms."""
    span = HIGH - LOW

    def degree(i: int, n: int) -> int:
        k = n % (2 * span)
        up = LOW + (k if k <= span else 2 * span - k)
        return up if i % 2 == 0 else LOW + HIGH - up

    return _form_tune(task, lambda i: _cells(task, rng, lambda n: degree(i, n)))


def _repeated_section(task: MusicTask, rng: random.Random) -> str:
    """One composed section played for every letter of the form."""
    part = section(rng, task.request, final=True)
    return _form_tune(task, lambda i: part)


def _one_bar(task: MusicTask, rng: random.Random) -> str:
    """One composed bar played for the whole tune."""
    bar = section(rng, task.request, final=True)[0]
    return _form_tune(task, lambda i: [bar] * task.request.section_bars)


def _one_pitch(task: MusicTask, rng: random.Random) -> str:
    """The tonic throughout, over corpus rhythms, with the tonic chord."""
    return _form_tune(task, lambda i: _cells(task, rng, lambda n: 0))


def _chords_over_rests(task: MusicTask, rng: random.Random) -> str:
    """A composed tune's chord symbols, each over a whole-bar rest: accompaniment, no melody."""
    r = task.request
    parts = sections(rng, r)
    rest = f"z{METERS[r.meter]}"
    text = render(r, parts, "Probe")
    lines = [ln if not ln.startswith('"') else "|".join(b[:b.index('"', 1) + 1] + rest if b.startswith('"') else b
                                                          for b in ln.split("|"))
             for ln in text.split("\n")]
    return "\n".join(lines)


DEGENERATE = ("tonic_arpeggios", "repeated_section", "scale_per_section", "one_bar_repeated", "one_pitch",
              "chords_over_rests")
"""Routes that write a well-formed tune with the requested header, form and chord symbols but no
musical substance; the grader's substance factor (``rlonce.envs.music.substance``) is for them."""
DEGENERATE_RATIO = 0.6
"""What a degenerate route may earn at most, as a share of the expert's median reward."""

ROUTES: dict[str, Callable[[MusicTask, random.Random], str]] = {
    "empty": lambda t, rng: "",
    "headers_only": lambda t, rng: _fenced("\n".join(header(t.request, "Probe")) + "\n"),
    "minimal": lambda t, rng: _fenced("X:1\nK:C\nCDE|\n"),
    "repeated_note": lambda t, rng: _fenced(_filled(t, lambda _: note_text(t.request.key, 0, 1), rng)),
    "copied_reference": lambda t, rng: _fenced(corpus(1 + rng.randrange(8))[-1]),
    "random_notes": lambda t, rng: _fenced(_filled(t, _random_note, rng)),
    "second_tune_in_block": lambda t, rng: _fenced("X:1\nK:C\nC|\n" + expert_tune(t, rng, detour_p=0.0)),
    "good_tune_after_junk_block": lambda t, rng: _fenced("X:1\nK:C\nC|\n") + "\n" + expert_tune(t, rng, detour_p=0.0),
    "huge": lambda t, rng: _fenced(_filled(t, _random_note, rng) * 60),
    "tonic_arpeggios": lambda t, rng: _fenced(_arpeggios(t, rng)),
    "repeated_section": lambda t, rng: _fenced(_repeated_section(t, rng)),
    "scale_per_section": lambda t, rng: _fenced(_scales(t, rng)),
    "one_bar_repeated": lambda t, rng: _fenced(_one_bar(t, rng)),
    "one_pitch": lambda t, rng: _fenced(_one_pitch(t, rng)),
    "chords_over_rests": lambda t, rng: _fenced(_chords_over_rests(t, rng)),
}
"""Single-turn routes: the reply text."""


async def grade_reply(task: MusicTask, reply: str, *, link: bool = False,
                 adherence_weight: float = ADHERENCE_WEIGHT) -> tuple[float, dict[str, float]]:
    """The reward and grader metrics of ``reply`` for ``task`` through the normal grading path."""
    env = MusicEnv(task, adherence_weight=adherence_weight)
    seq = Sequence(task.task_id, "probe")
    try:
        if link:  # the tool arm: the agent leaves a link to a host file and submits its path
            await env.call_tool("bash", {"command": "ln -s /etc/passwd tune.abc"})
            reply = "tune.abc"
        seq.answer = reply
        return (await env.grade(seq)).reward, env.metrics
    finally:
        await env.cleanup()


def probe_music(n_tasks: int = 50, *, seed: int = 0, progress: bool = True,
                adherence_weight: float = ADHERENCE_WEIGHT) -> dict:
    """Every route on ``n_tasks`` held-out tasks, and the expert (single turn, its usual flaws),
    graded with ``adherence_weight`` (0: the seed's public scorer)."""
    tasks = [make_task("heldout", i) for i in range(n_tasks)]
    names = [*ROUTES, "symlink_answer", "expert"]
    bar = tqdm(total=len(names) * n_tasks, desc="music probes", unit="attempt", disable=not progress, leave=False)

    async def run() -> tuple[dict[str, list[float]], list[dict]]:
        out: dict[str, list[float]] = {}
        expert: list[dict] = []
        for name in names:
            rng = random.Random(seed)
            rewards = []
            for t in tasks:
                if name == "symlink_answer":
                    r, _ = await grade_reply(t, "", link=True, adherence_weight=adherence_weight)
                else:
                    reply = expert_reply(t, rng) if name == "expert" else ROUTES[name](t, rng)
                    r, m = await grade_reply(t, reply, adherence_weight=adherence_weight)
                    if name == "expert":
                        expert.append(m)
                rewards.append(r)
                bar.update(1)
            out[name] = rewards
        return out, expert

    rewards, expert = asyncio.run(run())
    bar.close()
    median = statistics.median(rewards["expert"])
    rows = {n: {"mean": statistics.fmean(r), "median": statistics.median(r), "max": max(r),
                "median_ratio": statistics.median(r) / median if median else 0.0,
                "max_ratio": max(r) / median if median else 0.0, "below_expert_median": max(r) < median}
            for n, r in rewards.items() if n != "expert"}
    items = sorted(k for k in expert[0] if k.startswith("grade/adh_"))
    return {"tasks": n_tasks, "adherence_weight": adherence_weight, "expert_median": median,
            "expert_mean": statistics.fmean(rewards["expert"]),
            "expert_feature_score_median": statistics.median(m.get("grade/music_score", 0.0) for m in expert),
            "expert_adherence_mean": statistics.fmean(m.get("grade/adherence", 0.0) for m in expert),
            "expert_items": {k[len("grade/adh_"):]: statistics.fmean(m.get(k, 0.0) for m in expert) for k in items},
            "expert_gated": sum(m.get("grade/gated", 0.0) for m in expert),
            "expert_substance_median": statistics.median(m.get("grade/substance", 0.0) for m in expert),
            "routes": rows, "holes": [n for n, r in rows.items() if not r["below_expert_median"]],
            "degenerate_above": [n for n in DEGENERATE if rows[n]["max_ratio"] > DEGENERATE_RATIO]}


def run_probe(options, request) -> dict:
    """``rlonce probe music`` (``rlonce.config.domains.Probe.run``): ``probe_music`` on
    ``request.tasks`` held-out tasks, graded with the options' adherence weight."""
    from rlonce.envs.music.abc import require_abc2midi

    require_abc2midi()
    return probe_music(request.tasks, progress=request.progress, adherence_weight=options.adherence_weight)


def format_report(report: dict) -> str:
    lines = [f"music probes on {report['tasks']} held-out tasks, adherence weight {report['adherence_weight']:g}; "
             f"the scripted expert (its usual flaws): median reward "
             f"{report['expert_median']:.3f}, median feature score {report['expert_feature_score_median']:.3f}, "
             f"mean adherence {report['expert_adherence_mean']:.3f} ("
             + ", ".join(f"{k} {v:.2f}" for k, v in report["expert_items"].items())
             + f"), median substance {report['expert_substance_median']:.3f}",
             f"{'route':<28} {'mean':>6} {'median':>6} {'max':>6} {'median/expert':>13} {'max/expert':>10}  "
             "below the expert's median"]
    for name, r in report["routes"].items():
        lines.append(f"{name:<28} {r['mean']:>6.3f} {r['median']:>6.3f} {r['max']:>6.3f} {r['median_ratio']:>13.3f} "
                     f"{r['max_ratio']:>10.3f}  {'yes' if r['below_expert_median'] else 'NO'}")
    lines.append("holes: " + (", ".join(report["holes"]) or "none"))
    lines.append(f"degenerate routes above {DEGENERATE_RATIO:g} of the expert's median at their highest: "
                 + (", ".join(report["degenerate_above"]) or "none"))
    return "\n".join(lines)


__all__ = ["DEGENERATE", "DEGENERATE_RATIO", "ROUTES", "format_report", "grade_reply", "probe_music"]
