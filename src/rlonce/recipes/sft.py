"""The supervised warm start: the scripted expert's demonstrations, run through the real harness
and sandbox, and token-mean cross-entropy on the expert's tokens."""

from __future__ import annotations

import asyncio
import copy
import random

from tqdm.auto import tqdm

from rlonce.config import RunConfig, SFTConfig
from rlonce.core.records import Sequence, TrainingRow, sequence_to_rows
from rlonce.engine.scripted import ScriptedEngine
from rlonce.envs.domains import Domain
from rlonce.envs.toolfind.expert import expert_turns
from rlonce.harness.arms import arm_for, get_arm
from rlonce.harness.loop import HarnessLimits
from rlonce.model.chat import ChatFormat
from rlonce.rollout.runner import RolloutSpec, run_sequence
from rlonce.train.trainer import OptimSettings, Trainer


async def demonstrations(domain: Domain, spec: RolloutSpec, fmt: ChatFormat, encode, cfg: RunConfig, *,
                         progress: bool = True) -> list[Sequence]:
    """``cfg.sft.demos`` sequences of the scripted expert (each under its task's step-0 arm),
    with room for its detours (64 turns). All must succeed: the expert is exact, so a failure
    means the task generator or the sandbox is broken."""
    rng = random.Random(cfg.runtime.seed)
    spec = copy.copy(spec)
    spec.limits = HarnessLimits(max_turns=64, max_obs_chars=cfg.harness.max_obs_chars,
                                render_tools=cfg.harness.render_tools, compact_at=cfg.harness.compact_at)
    sem = asyncio.Semaphore(32)
    tasks = [domain.task("sft", i) for i in range(cfg.sft.demos)]
    bar = tqdm(total=len(tasks), desc="expert demos", unit="demo", disable=not progress, leave=False)

    async def one(task):
        arm = arm_for(spec.arm_seed, 0, task.task_id, list(spec.arms))
        turns = expert_turns(task, rng, fmt, translate=get_arm(arm).translate, detour_p=cfg.sft.detour_p,
                             max_detours=cfg.sft.max_detours)
        async with sem:
            seq = await run_sequence(task, domain.env_factory, ScriptedEngine(turns, encode), spec, arm=arm)
        bar.update(1)
        return seq

    seqs = await asyncio.gather(*(one(t) for t in tasks))
    bar.close()
    bad = [s for s in seqs if not s.passed]
    if bad:
        raise RuntimeError(f"the scripted expert failed {len(bad)} tasks (first: {bad[0].task_id}, "
                           f"status {bad[0].status.value}); the task generator or sandbox is broken")
    return seqs


def train_sft(model, demos: list[Sequence], cfg: SFTConfig, *, seed: int, progress: bool = True) -> None:
    """``cfg.epochs`` passes over the demonstrations' rows in batches of similar length."""
    rows = [r for s in demos for r in sequence_to_rows(s, 1.0)]
    steps = max(1, cfg.epochs * len(rows) // cfg.batch_rows)
    trainer = Trainer(model, OptimSettings(lr=cfg.lr, warmup_steps=cfg.warmup_steps, total_steps=steps,
                                           betas=(0.9, 0.95)))
    bar = tqdm(total=steps, desc="sft", unit="step", disable=not progress, dynamic_ncols=True)
    for batch in length_bucketed(rows, cfg.batch_rows, steps, random.Random(seed)):
        m = trainer.sft_step(batch)
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
