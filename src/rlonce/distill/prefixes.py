"""History prefixes for distillation (seed 001, MOPD2): where each sequence of a group starts.

    'none'     every sibling starts at the task's start (plain on-policy distillation)
    'sft'      the scripted expert's demonstration of the task (SFT-prefix OPD: "SFT teachers do
               not cover the histories students drift into on long-horizon tasks")
    'teacher'  the teacher's own rollout of the task, run once per group and harness arm

A trajectory with n assistant turns gives n prefixes — its first j turns, j = 0 … n−1 —; sibling
k of a group takes j = k mod n and the student samples ``student_turns`` turns after it (0: the
rest of the episode). Prefix turns are replayed through the same gateway, harness and sandbox as
any turn (``PrefixEngine``), so every tool observation is the real one; their segments are marked
``forced`` and are never trained nor scored.
"""

from __future__ import annotations

import dataclasses
import random
import zlib

from rlonce.core.records import Role, Sequence
from rlonce.engine.base import Generation, SamplingParams, Watch, watch_after
from rlonce.gateway.core import Gateway
from rlonce.harness.arms import get_arm

Turn = tuple[list[int], str]
"""A prefix turn: its token ids and finish reason."""


class PrefixEngine:
    """``turns`` replayed first (``Generation.forced``: log-prob 0, never trained), then ``engine``."""

    def __init__(self, turns: list[Turn], engine):
        self.turns, self.engine = list(turns), engine

    def __getattr__(self, name):  # version, load_weights, pause, ...: the student's engine
        return getattr(self.engine, name)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, watch: Watch | None = None) -> Generation:
        if not self.turns:
            return await self.engine.generate(prompt_ids, sampling, watch)
        ids, reason = self.turns.pop(0)
        if len(ids) > sampling.max_tokens:
            ids, reason = ids[: sampling.max_tokens], "length"
        return watch_after(Generation(list(ids), [0.0] * len(ids), [0] * len(ids), reason, forced=True), watch)


def trajectory_turns(seq: Sequence) -> list[Turn]:
    """The model turns of ``seq``'s longest context, in order (the teacher's trajectory)."""
    if not seq.contexts or seq.infra_failed:
        return []
    ctx = max(seq.contexts, key=len)
    return [(list(s.token_ids), s.finish_reason or "stop") for s in ctx.segments if s.role is Role.MODEL]


def sibling_parts(executor, forced: list[Turn], student_turns: int):
    """(engine, gateway, spec) of one sibling on a ``LocalExecutor``: the prefix replayed before the
    executor's engine, and the episode cut ``student_turns`` turns after it (0: not cut)."""
    spec = executor.spec
    if student_turns:
        spec = dataclasses.replace(spec, limits=dataclasses.replace(spec.limits, max_turns=len(forced) + student_turns))
    if not forced:
        return executor.engine, executor.gateway, spec
    engine = PrefixEngine(forced, executor.engine)
    return engine, Gateway(dataclasses.replace(executor.gateway.settings, engine=engine)), spec


class Prefixes:
    """A source's prefix plan: ``plan`` gives each sibling of a group its forced turns."""

    def __init__(self, mode: str, student_turns: int, *, domain=None, encode=None, fmt=None, teacher_engine=None,
                 seed: int = 0):
        self.mode, self.student_turns = mode, student_turns
        self.domain, self.encode, self.fmt, self.teacher_engine, self.seed = domain, encode, fmt, teacher_engine, seed
        self.teacher_rollouts = 0
        self.teacher_failed = 0

    async def trajectory(self, task, arm: str, spec, key: tuple) -> list[Turn]:
        """The turns a prefix is cut from: the expert's demonstration or the teacher's rollout."""
        if self.mode == "sft":
            harness = get_arm(arm)
            rng = random.Random(zlib.crc32(f"{self.seed}:{task.task_id}".encode()))
            texts = self.domain.expert(task, rng, self.fmt, translate=harness.translate, detour_p=0.0,
                                       single_turn=harness.single_turn)
            return [(self.encode(t), "stop") for t in texts]
        from rlonce.rollout.runner import run_sequence

        seq = await run_sequence(task, self.domain.env_factory, self.teacher_engine, spec, arm=arm,
                                 seed=spec.seed_of(*key, 1_000_003))
        self.teacher_rollouts += 1
        self.teacher_failed += int(seq.infra_failed)
        return trajectory_turns(seq)

    def sibling(self, executor, forced: list[Turn]):
        """(engine, gateway, spec) of a sibling of ``executor`` (a ``LocalExecutor``) that replays ``forced``."""
        return sibling_parts(executor, forced, self.student_turns)

    async def plan(self, task, group, group_size: int, spec) -> list[list[Turn]]:
        """Sibling k's forced turns: the first k mod n turns of its arm's trajectory."""
        if self.mode == "none":
            return [[] for _ in range(group_size)]
        arms = [spec.arm_of(task.task_id, k, group.dispatch_step) for k in range(group_size)]
        key = (group.dispatch_step, getattr(group, "source", ""), getattr(group, "index", 0))
        made = {arm: await self.trajectory(task, arm, spec, key) for arm in dict.fromkeys(arms)}
        return [made[arm][: k % len(made[arm])] if made[arm] else [] for k, arm in enumerate(arms)]
