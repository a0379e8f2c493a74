"""``rlonce probe music``: shortcut tunes against the grader, next to the scripted expert.

Each route writes one answer for a task — what a policy might find cheaper than a real tune:
nothing, a header without notes, a minimal tune, one note repeated for the requested length, a
copied reference tune, random notes under a correct header, a fenced block with a second ``X:``
tune after it, a good tune placed after a fenced junk block, a huge tune, and (with tools) a
submitted path that is a link to a host file. Every answer goes through the normal grading
path. The report gives each route's mean and highest reward and the expert's median; a route
whose highest reward reaches the expert's median is a hole.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Callable

from tqdm.auto import tqdm

from rlonce.core.records import Sequence
from rlonce.envs.music.compose import METERS, header, note_text
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
}
"""Single-turn routes: the reply text."""


async def _grade(task: MusicTask, reply: str, *, link: bool = False,
                 adherence_weight: float = ADHERENCE_WEIGHT) -> tuple[float, dict[str, float]]:
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
                    r, _ = await _grade(t, "", link=True, adherence_weight=adherence_weight)
                else:
                    reply = expert_reply(t, rng) if name == "expert" else ROUTES[name](t, rng)
                    r, m = await _grade(t, reply, adherence_weight=adherence_weight)
                    if name == "expert":
                        expert.append(m)
                rewards.append(r)
                bar.update(1)
            out[name] = rewards
        return out, expert

    rewards, expert = asyncio.run(run())
    bar.close()
    median = statistics.median(rewards["expert"])
    rows = {n: {"mean": statistics.fmean(r), "max": max(r), "below_expert_median": max(r) < median}
            for n, r in rewards.items() if n != "expert"}
    items = sorted(k for k in expert[0] if k.startswith("grade/adh_"))
    return {"tasks": n_tasks, "adherence_weight": adherence_weight, "expert_median": median,
            "expert_mean": statistics.fmean(rewards["expert"]),
            "expert_feature_score_median": statistics.median(m.get("grade/music_score", 0.0) for m in expert),
            "expert_adherence_mean": statistics.fmean(m.get("grade/adherence", 0.0) for m in expert),
            "expert_items": {k[len("grade/adh_"):]: statistics.fmean(m.get(k, 0.0) for m in expert) for k in items},
            "expert_gated": sum(m.get("grade/gated", 0.0) for m in expert),
            "routes": rows, "holes": [n for n, r in rows.items() if not r["below_expert_median"]]}


def format_report(report: dict) -> str:
    lines = [f"music probes on {report['tasks']} held-out tasks, adherence weight {report['adherence_weight']:g}; "
             f"the scripted expert (its usual flaws): median reward "
             f"{report['expert_median']:.3f}, median feature score {report['expert_feature_score_median']:.3f}, "
             f"mean adherence {report['expert_adherence_mean']:.3f} ("
             + ", ".join(f"{k} {v:.2f}" for k, v in report["expert_items"].items()) + ")",
             f"{'route':<28} {'mean':>6} {'max':>6}  below the expert's median"]
    for name, r in report["routes"].items():
        lines.append(f"{name:<28} {r['mean']:>6.3f} {r['max']:>6.3f}  {'yes' if r['below_expert_median'] else 'NO'}")
    lines.append("holes: " + (", ".join(report["holes"]) or "none"))
    return "\n".join(lines)


__all__ = ["ROUTES", "format_report", "probe_music"]
