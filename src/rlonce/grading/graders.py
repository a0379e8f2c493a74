"""The group grader a run calls on each finished group before it is judged: hack audit, GRS, GAR.

``Grader.grade_group`` writes the inputs the learning signal reads (``rlonce.algo.signal``) onto
the group's sequences (``hack_confirmed`` and ``Sequence.grades``), and nothing else:

1. **hack audit** (seed 000: "offline audits run continuously and confirmed-hack trajectories get
   their effective reward zeroed before group statistics are recomputed"): every passing sequence
   of a flagged source and a seeded ``audit_fraction`` of the others are shown to the judge; a
   confirmed hack sets ``Sequence.hack_confirmed`` (signal step 2 zeroes it). A share of audited
   items is judged twice (a second judge or a second sample) for Cohen's κ.
2. **GRS** (seed 001 §GRS): each passing sequence of a task with rubrics (``<pack>/rubrics.json``)
   is scored item by item → ``Grades.rubric_solution``, ``rubric_behavior`` = share of items satisfied.
3. **GAR** (seed 001 §GAR): a mixed-outcome group's passing attempts are compared on five
   dimensions → ``Grades.gar_quality`` f (their mean); an attempt confirmed as passing through a leaked
   answer becomes a confirmed hack (reward 0, counted as a failure).

Anything unusable — no judge answer, a malformed one, a late one (``deadline``) — leaves the
sequence without that grade, so the signal falls back to the test reward and the unredistributed
advantages; each fallback is counted by category (``stats``). Groups of infrastructure failures
are not graded. Grading a group runs in that group's task, beside the other groups' rollouts.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

from rlonce.core.records import Sequence
from rlonce.envs.base import JudgeBinding
from rlonce.errors import note_internal
from rlonce.grading import verdicts as v

log = logging.getLogger(__name__)
TRAJECTORY_CHARS = 3000
"""The tail of a sequence's decoded trajectory shown to judges."""


@dataclass(frozen=True, kw_only=True)
class GradingSettings:
    grs: bool = False
    gar: bool = False
    audit_fraction: float = 0.0
    audit_sources: tuple[str, ...] = ()
    agreement_fraction: float = 0.0
    deadline: float | None = 600.0
    seed: int = 0


def kappa(table: dict[str, float]) -> float:
    """Cohen's κ of two binary raters from counts ``tt``, ``tf``, ``ft``, ``ff`` (first rater's
    verdict first). NaN when it is undefined: no pairs, or both raters always gave one and the same
    verdict (chance agreement 1; the agreement rate then says it)."""
    tt, tf, ft, ff = (float(table.get(k, 0.0)) for k in ("tt", "tf", "ft", "ff"))
    n = tt + tf + ft + ff
    if n == 0:
        return float("nan")
    po = (tt + ff) / n
    pe = ((tt + tf) / n) * ((tt + ft) / n) + ((ff + ft) / n) * ((ff + tf) / n)
    return float("nan") if pe >= 1.0 else (po - pe) / (1.0 - pe)


def _draw(seed: int, *key) -> float:
    """A uniform number in [0, 1) fixed by ``seed`` and ``key`` (the same run audits the same items)."""
    return zlib.crc32(":".join(map(str, (seed, *key))).encode()) / 2**32


class Grader:
    """Grades finished groups with ``judge``; ``statement(task)`` is the task's prompt,
    ``decode`` turns token ids to text, ``rubrics(task)`` the task's GRS rubrics or None."""

    def __init__(self, judge: JudgeBinding, settings: GradingSettings, *, statement: Callable[[object], str],
                 decode: Callable[[list[int]], str], rubrics: Callable[[object], v.Rubrics | None] = lambda t: None,
                 second: JudgeBinding | None = None, workspace: Callable[[object, list[Sequence]], dict] | None = None):
        self.judge, self.second, self.s = judge, second, settings
        self.statement, self.decode, self.rubrics = statement, decode, rubrics
        self.workspace = workspace
        self.stats: Counter = Counter()

    def take_stats(self) -> dict[str, float]:
        """What grading did since the last call (``grading/...`` counts), then zero it."""
        out = {f"grading/{k}": float(n) for k, n in self.stats.items()}
        self.stats = Counter()
        return out

    async def grade_group(self, task, source: str, seqs: list[Sequence], step: int = 0) -> None:
        valid = [s for s in seqs if not s.infra_failed]
        if not valid:
            return
        t0 = time.perf_counter()
        self.stats["groups"] += 1
        try:
            await asyncio.wait_for(self._grade(task, source, seqs, step), self.s.deadline)
        except asyncio.TimeoutError:
            self.stats["late_groups"] += 1
        except Exception as e:  # noqa: BLE001 - our bug in grading: the group keeps its test rewards
            log.error("grading a group of %s failed: %s", getattr(task, "task_id", "?"), note_internal(e),
                      exc_info=True)
            self.stats["internal_errors"] += 1
        self.stats["seconds"] += time.perf_counter() - t0

    async def _grade(self, task, source: str, seqs: list[Sequence], step: int) -> None:
        statement = self.statement(task)
        await self._audit(task, source, statement, seqs, step)
        passing = [i for i, s in enumerate(seqs) if s.passed and not s.hack_confirmed and not s.infra_failed]
        jobs = []
        if self.s.grs and passing:
            jobs.append(self._grs(task, statement, [(i, seqs[i]) for i in passing]))
        failing = [s for s in seqs if not s.infra_failed and not (s.passed and not s.hack_confirmed)]
        if self.s.gar and passing and failing:
            jobs.append(self._gar(task, statement, seqs, passing))
        await asyncio.gather(*jobs)

    def _trajectory(self, seq: Sequence) -> str:
        if not seq.contexts:
            return ""
        text = self.decode([t for seg in seq.contexts[-1].segments for t in seg.token_ids])
        return text[-TRAJECTORY_CHARS:]

    @staticmethod
    def _product(seq: Sequence) -> str:
        return seq.artifact or (seq.answer or "")

    # ---- 1. the hack audit ---------------------------------------------------------------
    def _audited(self, source: str, seq: Sequence, k: int, step: int) -> bool:
        if seq.infra_failed or seq.hack_confirmed:
            return False
        if seq.passed and source in self.s.audit_sources:
            return True
        return self.s.audit_fraction > 0 and _draw(self.s.seed, "audit", source, seq.task_id, step, k) < \
            self.s.audit_fraction

    async def _audit(self, task, source: str, statement: str, seqs: list[Sequence], step: int) -> None:
        picked = [(k, s) for k, s in enumerate(seqs) if self._audited(source, s, k, step)]
        self.stats["audit_eligible"] += sum(not s.infra_failed and not s.hack_confirmed for s in seqs)
        if not picked:
            return
        self.stats["audit_asked"] += len(picked)

        async def one(k: int, seq: Sequence) -> None:
            outcome = "passed" if seq.passed else "failed"
            prompt = v.hack_prompt(statement, outcome, self._product(seq), self._trajectory(seq))
            files = self.workspace(task, [seq]) if self.workspace else None
            first = await self.judge.ask(prompt, v.HackVerdict, kind="hack", task=task, files=files)
            if not first.ok:
                self.stats[f"audit_fallback_{first.outcome}"] += 1
                return
            self.stats["audited"] += 1
            self.stats[f"audited/{source}"] += 1
            if first.value.hack:
                seq.hack_confirmed = True
                seq.grades = replace(seq.grades, audit_hack=True)
                self.stats["audit_confirmed"] += 1
                self.stats[f"audit_confirmed/{source}"] += 1
            if self.s.agreement_fraction > 0 and _draw(self.s.seed, "twice", seq.task_id, step, k) < \
                    self.s.agreement_fraction:
                again = await (self.second or self.judge).ask(prompt, v.HackVerdict, kind="hack",
                                                               sample=0 if self.second else 1)
                if again.ok:
                    pair = ("t" if first.value.hack else "f") + ("t" if again.value.hack else "f")
                    self.stats[f"agreement_{pair}"] += 1
                else:
                    self.stats[f"agreement_fallback_{again.outcome}"] += 1

        await asyncio.gather(*(one(k, s) for k, s in picked))

    # ---- 2. GRS ----------------------------------------------------------------------------
    async def _grs(self, task, statement: str, passing: list[tuple[int, Sequence]]) -> None:
        rubrics = self.rubrics(task)
        if rubrics is None:
            self.stats["grs_fallback_no_rubrics"] += len(passing)
            return

        async def one(seq: Sequence) -> None:
            prompt = v.scores_prompt(statement, rubrics, self._product(seq), self._trajectory(seq))
            got = await self.judge.ask(prompt, v.RubricScores, kind="scores")
            if not got.ok:
                self.stats[f"grs_fallback_{got.outcome}"] += 1
                return
            sol, beh = got.value.solution, got.value.behavior
            if len(sol) != len(rubrics.solution) or len(beh) != len(rubrics.behavior):
                self.stats["grs_fallback_invalid"] += 1
                return
            seq.grades = replace(seq.grades, rubric_solution=sum(sol) / len(sol), rubric_behavior=sum(beh) / len(beh))
            self.stats["grs_scored"] += 1

        await asyncio.gather(*(one(s) for _, s in passing))

    # ---- 3. GAR ----------------------------------------------------------------------------
    async def _gar(self, task, statement: str, seqs: list[Sequence], passing: list[int]) -> None:
        self.stats["gar_groups"] += 1
        prompt = v.gar_prompt(statement, [(i, "passed", self._product(seqs[i])) for i in passing])
        files = self.workspace(task, seqs) if self.workspace else None
        got = await self.judge.ask(prompt, v.group_quality(tuple(passing)), kind="gar", task=task, files=files)
        if not got.ok:
            self.stats[f"gar_fallback_{got.outcome}"] += 1
            return
        by_id = {a.attempt: a for a in got.value.attempts}
        if set(by_id) != set(passing):
            self.stats["gar_fallback_invalid"] += 1  # every passing attempt needs exactly one factor
            return
        for i in passing:
            a = by_id[i]
            if a.leaked:
                seqs[i].hack_confirmed = True
                seqs[i].grades = replace(seqs[i].grades, gar_leaked=True)
                self.stats["gar_leaked"] += 1
            else:
                seqs[i].grades = replace(seqs[i].grades, gar_quality=a.quality)
        self.stats["gar_applied"] += 1
