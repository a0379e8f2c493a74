"""Music environment: a request, an ABC tune back, a compiler-and-features grader.

Two ways to answer. Single turn (harness arm ``single-turn``): the reply is the answer, as in
the public Music recipe. With tools (any other arm): a bubblewrap workspace where ``abc2midi``
runs (the agent may convert its tune to check it), and ``submit`` with the tune's text or the
path of the ``.abc`` file it wrote (read from the host without following links).

Grading (``rlonce.envs.music.abc``, ``score``, ``adherence``, ``substance``): extract, gate,
convert in a fresh sandbox, gate again, then ``reward = substance · ((1 − a) · feature score +
a · adherence)``, or the feature score alone when ``a = 0`` (the seed's public scorer). A gated
tune earns 0. A missing abc2midi is infrastructure (``Abc2MidiMissing``), never a 0.
"""

from __future__ import annotations

import asyncio

from rlonce.core.records import Grade, Sequence
from rlonce.envs.base import function_tool
from rlonce.envs.music import abc as abcmod
from rlonce.envs.music import adherence as adh
from rlonce.envs.music import substance as sub
from rlonce.envs.music.features import read_midi
from rlonce.envs.music.score import feature_score, reward
from rlonce.envs.music.tasks import MusicTask
from rlonce.envs.workspace import BASH_TOOL, BASH_USAGE, bash_command, run_bash
from rlonce.sandbox import hostfs
from rlonce.sandbox.bwrap import BwrapSandbox, workspace_rel
from rlonce.sandbox.limits import Limits, command_limits

SYSTEM_PROMPT = ("You write tunes in ABC notation. With tools, you may check a file with `abc2midi FILE -o out.mid` "
                 "and submit the tune or the file's path.")
SUBMIT_TOOL = function_tool("submit", "Submit the tune: its ABC text or the path of the .abc file.",
                            {"answer": {"type": "string"}}, ["answer"])
ADHERENCE_WEIGHT = 0.5
PASS_SCORE = PASS_ADHERENCE = 0.5
PASS_SUBSTANCE = 0.75
"""``passed``: the tune cleared the gates, its feature score is at least ``PASS_SCORE`` and (when
adherence counts) it meets at least ``PASS_ADHERENCE`` of the request and its substance is at
least ``PASS_SUBSTANCE`` (one section for every letter of AABB has 0.5: it does not pass)."""


def _is_path(answer: str) -> bool:
    a = answer.strip()
    return bool(a) and "\n" not in a and "X:" not in a and len(a) < 256


class MusicEnv:
    def __init__(self, task: MusicTask, *, adherence_weight: float = ADHERENCE_WEIGHT, limits: Limits | None = None):
        self.task = task
        self.adherence_weight = adherence_weight
        self.limits = limits or command_limits(60, output_bytes=8192)
        self.sandbox: BwrapSandbox | None = None
        self.metrics: dict[str, float] = {}

    async def setup(self) -> None:
        abcmod.require_abc2midi()

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def user_prompt(self) -> str:
        return self.task.prompt

    def tools(self) -> list[dict]:
        return [BASH_TOOL, SUBMIT_TOOL]

    async def call_tool(self, name: str, arguments: dict) -> str:
        if name != "bash":
            raise KeyError(name)
        command = bash_command(arguments)
        if command is None:
            return BASH_USAGE
        if self.sandbox is None:  # made on first use: the single-turn arm never needs one
            self.sandbox = BwrapSandbox(self.limits)
        return await run_bash(self.sandbox, command)

    def _answer_text(self, answer: str) -> tuple[str | None, str]:
        """The text to grade, and how it was found."""
        if self.sandbox is not None and _is_path(answer):
            try:
                data = hostfs.read_file(self.sandbox.workspace, workspace_rel(answer), abcmod.MAX_ABC_CHARS * 4)
                return data.decode("utf-8", "replace"), f"read from {answer.strip()!r}"
            except (hostfs.HostileFile, OSError) as e:
                return None, f"could not read {answer.strip()!r}: {e}"
        return answer, "from the answer"

    async def grade(self, sequence: Sequence) -> Grade:
        text, how = self._answer_text(sequence.answer or "")
        return await grade_text(self.task, text, self.adherence_weight, self.metrics, how)

    async def cleanup(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()


async def grade_text(task: MusicTask, text: str | None, adherence_weight: float, metrics: dict[str, float],
                     how: str = "") -> Grade:
    """Grade ``text`` for ``task``; fills ``metrics`` under ``grade/`` (``music_score``,
    ``adherence``, one ``adh_<item>`` each, ``substance``, the group scores, ``gated``): each is
    averaged into the step's metrics."""
    req = task.request
    abc = abcmod.extract(text) if text is not None else None
    gate = abcmod.static_gate(abc)
    conv = score = None
    if gate is None:
        conv = await abcmod.convert(abc)
        gate = conv.gate(req.bars)
    if gate is None:
        try:
            score = await asyncio.to_thread(read_midi, conv.midi)
        except Exception:  # noqa: BLE001 - abc2midi wrote something no MIDI reader accepts
            gate = "compile_error"
    if gate is None and len(score.notes) < abcmod.MIN_NOTES:
        gate = "no_notes"
    if gate is None and score.seconds > abcmod.MAX_SECONDS:
        gate = "too_long_midi"
    metrics["grade/gated"] = float(gate is not None)
    if gate is not None:
        metrics.update({"grade/music_score": 0.0, "grade/adherence": 0.0, "grade/substance": 0.0})
        log = f"; abc2midi said: {conv.log.strip()[-600:]}" if conv is not None else ""
        return Grade(0.0, passed=False, transcript=f"tune {how}: rejected by the gate {gate!r}{log}")
    fs, parts = await asyncio.to_thread(feature_score, score)
    items = adh.check(req, abc, score)
    a = adh.adherence(items)
    sp = sub.measure(score, req.form)
    s = sp["substance"]
    r = float(reward(fs, a, adherence_weight, s))
    metrics.update({"grade/music_score": float(fs), "grade/adherence": float(a), "grade/substance": s,
                    **{f"grade/adh_{k}": float(v) for k, v in items.items()},
                    **{f"grade/{k}": float(v) for k, v in parts.items()
                       if k.startswith("group_") or k in ("base", "dist_s")}})
    said = ", ".join(f"{k} {'met' if v else 'missed'}" for k, v in items.items())
    factors = ", ".join(f"{k} {sp[k]:.2f} ({sp['value_' + k]:.2f})" for k in sub.FACTORS)
    passed = fs >= PASS_SCORE and (adherence_weight == 0 or (a >= PASS_ADHERENCE and s >= PASS_SUBSTANCE))
    how_r = (f"reward = feature score {r:.4f} (adherence weight 0: the public scorer)" if adherence_weight == 0 else
             f"reward {s:.3f} x ((1 - {adherence_weight:g}) x {fs:.3f} + {adherence_weight:g} x {a:.3f}) = {r:.4f}")
    return Grade(r, passed=bool(passed),
                 transcript=f"tune {how}: {len(score.notes)} notes, {adh.bar_count(score)} bars; "
                            f"feature score {fs:.3f} "
                            f"(base {parts['base']:.3f}, dist_s {parts['dist_s']:.3f}); adherence {a:.3f} ({said}); "
                            f"substance {s:.3f} ({factors}); {how_r}")
