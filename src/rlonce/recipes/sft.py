"""The supervised warm start: the scripted expert's demonstrations, run through the real harness
and sandbox, and token-mean cross-entropy on the expert's tokens."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import math
import random

from tqdm.auto import tqdm

from rlonce.config import ConfigError, RunConfig, SFTConfig
from rlonce.core import faults
from rlonce.core.records import Sequence, Status, TrainingRow, sequence_to_rows
from rlonce.engine.scripted import ScriptedEngine
from rlonce.envs.domains import Domain
from rlonce.harness.arms import arm_for, get_arm
from rlonce.model.chat import ChatFormat
from rlonce.rollout.runner import RolloutSpec, run_sequence
from rlonce.train.trainer import OptimSettings, Trainer

log = logging.getLogger(__name__)

async def demonstrations(domain: Domain, spec: RolloutSpec, fmt: ChatFormat, encode, cfg: RunConfig, *,
                         n: int | None = None, detour_p: float | None = None,
                         progress: bool = True) -> list[Sequence]:
    """``n`` (default ``cfg.sft.demos``) sequences of the scripted expert (each under its task's
    step-0 arm) with detours at ``detour_p`` (default ``cfg.sft.detour_p``), with room for them
    (64 turns) within the source's token budgets. A
    demonstration whose detours overrun a budget (or, in a graded domain, whose flaws cost its
    pass) is played again without detours, one that failed in the infrastructure is played again;
    one that still overruns or fails so is left out, counted in a warning (the task does not fit
    the model's budgets; an outage is not the expert's). Every other must succeed: the expert
    without detours is exact, so a failure means the task generator or the sandbox is broken."""
    if domain.expert is None:
        raise ConfigError(f"task {domain.name!r} has no scripted expert for SFT: set sft.demos = 0")
    rng = random.Random(cfg.runtime.seed)
    spec = copy.copy(spec)
    spec.limits = dataclasses.replace(spec.limits, max_turns=64)  # the source's budgets, room for detours
    sem = asyncio.Semaphore(32)
    tasks = [domain.task("sft", i) for i in range(cfg.sft.demos if n is None else n)]
    bar = tqdm(total=len(tasks), desc="expert demos", unit="demo", disable=not progress, leave=False)

    async def one(task):
        arm = arm_for(spec.arm_seed, 0, task.task_id, list(spec.arms))
        for p in (cfg.sft.detour_p if detour_p is None else detour_p, 0.0):  # the second: none, or after an outage
            turns = domain.expert(task, rng, fmt, translate=get_arm(arm).translate, detour_p=p,
                                  max_detours=cfg.sft.max_detours, single_turn=get_arm(arm).single_turn)
            async with sem:
                seq = await run_sequence(task, domain.env_factory, ScriptedEngine(turns, encode), spec, arm=arm)
            if seq.status not in (Status.LIMITS, Status.INFRA) and (seq.passed or p == 0.0):
                break  # (a graded domain's flaws can cost a pass: the flawless replay must pass)
        bar.update(1)
        return seq

    seqs = await asyncio.gather(*(one(t) for t in tasks))
    bar.close()
    for status, why in ((Status.LIMITS, "overran the source's turn or token budgets even without detours"),
                        (Status.INFRA, "failed twice in the infrastructure")):
        out = [s for s in seqs if s.status is status]
        if out:
            log.warning("%d of %d %s demonstrations %s (first: %s, %s) and are left out", len(out), len(seqs),
                        domain.name, why, out[0].task_id, out[0].cause)
    seqs = [s for s in seqs if s.status not in (Status.LIMITS, Status.INFRA)]
    bad = [s for s in seqs if not s.passed]
    if bad:
        raise RuntimeError(f"the scripted expert failed {len(bad)} tasks (first: {bad[0].task_id}, "
                           f"status {bad[0].status.value}); the task generator or sandbox is broken")
    return seqs


def source_demonstrations(sources, fmt: ChatFormat, encode, cfg: RunConfig, *,
                          progress: bool = True) -> tuple[list[Sequence], list[int]]:
    """Every source's demonstrations (``rlonce.rollout.sources.Source``: its plan's ``sft_demos``
    at its ``sft_detour_p``) and, for each, its source's ``sft_epochs``."""
    demos, epochs = [], []
    for src in sources:
        if src.plan.sft_demos and src.plan.sft_epochs:
            seqs = asyncio.run(demonstrations(src.domain, src.spec, fmt, encode, cfg, n=src.plan.sft_demos,
                                              detour_p=src.plan.sft_detour_p, progress=progress))
            demos, epochs = demos + seqs, epochs + [src.plan.sft_epochs] * len(seqs)
    return demos, epochs


def sft_rows(demos: list[Sequence], counts: list[int], batch_rows: int) -> tuple[list[TrainingRow], int]:
    """The rows of ``counts[i]`` passes over each demonstration and the steps they take: with a
    common factor g of the counts, each row repeated count/g times, and g passes over those (all
    counts equal: the rows once, ``count`` passes)."""
    g = math.gcd(*counts) or 1
    rows = [r for s, k in zip(demos, counts, strict=True) for r in sequence_to_rows(s, 1.0) for _ in range(k // g)]
    return rows, g * len(rows) // batch_rows


def train_sft(model, demos: list[Sequence], cfg: SFTConfig, *, seed: int, progress: bool = True,
              epochs: list[int] | None = None) -> None:
    """``cfg.epochs`` passes over the demonstrations' rows in batches of similar length, or with
    ``epochs`` (a mixed run's per-source ``sft_epochs``, one count per demonstration) that many
    passes over each."""
    rows, steps = sft_rows(demos, [cfg.epochs] * len(demos) if epochs is None else epochs, cfg.batch_rows)
    if not rows:  # every demonstration was left out (``demonstrations`` warned why)
        log.warning("no demonstration rows to train on: SFT skipped")
        return
    steps = max(1, steps)
    trainer = Trainer(model, OptimSettings(lr=cfg.lr, warmup_steps=cfg.warmup_steps, total_steps=steps,
                                           betas=(0.9, 0.95)))
    bar = tqdm(total=steps, desc="sft", unit="step", disable=not progress, dynamic_ncols=True)
    for batch in length_bucketed(rows, cfg.batch_rows, steps, random.Random(seed)):
        m = trainer.sft_step(batch)
        faults.point("sft.batch")
        bar.update(1)
        bar.set_postfix(loss=f"{m['sft_loss']:.3f}", lr=f"{m['lr']:.1e}", refresh=False)
    bar.close()


def length_bucketed(rows: list[TrainingRow], batch_rows: int, steps: int, rng: random.Random):
    """Batches of similar-length rows (less padding), in random order, for ``steps`` batches."""
    made = 0
    while True:
        idx = list(range(len(rows)))
        rng.shuffle(idx)
        for start in range(0, len(idx), batch_rows * 8):
            chunk = sorted(idx[start:start + batch_rows * 8], key=lambda i: len(rows[i]))
            batches = [chunk[k:k + batch_rows] for k in range(0, len(chunk), batch_rows)]
            rng.shuffle(batches)
            for b in batches:
                yield [rows[i] for i in b]
                made += 1
                if made >= steps:
                    return
