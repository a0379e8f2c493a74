"""The whole loop in one file: SFT, then GRPO on toolfind in real sandboxes.

Read it top to bottom. It uses the library's records (``Sequence`` → ``TrainingRow``), gateway,
harness, sandboxed environment and engine; the group advantages and the clipped policy loss are
written out here. ``rlonce quickstart`` runs the same algorithm with every knob, checkpoints,
metrics and the asynchronous scheduler (``recipes/grpo.py``); a test checks that the inline
advantages and loss below equal ``learning_signal`` and ``policy_loss`` on the same samples.

    python -m rlonce.recipes.minimal --out runs/minimal

How this departs from textbook GRPO (each but the aggregation is also the main job's default):
- No KL term and no reference model.
- Advantages are ``r - mean(r)`` within the group, not divided by the group's std.
- Dynamic filtering: a group whose rewards are all equal teaches nothing and is dropped.
- Clip-higher (the ratio's ceiling 1 + 0.28 is above its floor 1 - 0.2) and dual clip (a
  negative-advantage token's loss is at most ``-3·A``).
- The ratio's denominator is the log-prob the engine recorded when it sampled the token, not
  a recomputation by the trainer (the records carry it, per token, with its policy version).
- Token-mean aggregation: every trained token of the mini-batch weighs the same (the main job
  defaults to the seeds' prompt-mean, which normalises within each prompt group first).
- A sequence that failed in the infrastructure (sandbox, engine, grader) is left out of its
  group's statistics; it is never scored as a reward of 0.
- A warm start by SFT on a scripted expert's demonstrations, run through the same harness.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import math
import random
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from rlonce.config.domains import DEFAULT_DOMAIN, load_domain
from rlonce.core.records import Sample, TrainingRow, sequence_to_rows
from rlonce.engine.base import SamplingParams
from rlonce.engine.scripted import ScriptedEngine
from rlonce.engine.torch_engine import TorchEngine
from rlonce.harness.loop import HarnessLimits
from rlonce.model import loader
from rlonce.model.chat import get_format
from rlonce.rollout.runner import RolloutSpec, collect, run_sequence
from rlonce.train.trainer import pad_rows, token_logprobs

SFT_DEMOS, SFT_EPOCHS, SFT_LR, SFT_BATCH = 1000, 5, 2e-3, 16
RL_STEPS, TASKS_PER_STEP, GROUP, RL_LR, MINIBATCHES = 40, 8, 8, 2e-4, 2
CLIP_LOW, CLIP_HIGH, CLIP_C = 0.2, 0.28, 3.0
HELDOUT, EVAL_SEED = 200, 12345
ROLLOUT_THREADS, TRAIN_THREADS = 1, 2  # small-model CPU decoding is fastest on one thread; training uses two


# ---- the pieces --------------------------------------------------------------------------
def embedded_domain():
    """The embedded model's domain (toolfind) from the registry, with its default options: task
    streams by split (``sft`` for demonstrations, ``train`` for RL — far from the SFT indices —
    and ``heldout``), the environment each task runs in, and the scripted expert."""
    spec = load_domain(DEFAULT_DOMAIN)
    return spec.build(spec.options())


def rollout_spec(lm, max_turns: int = 3) -> RolloutSpec:
    """Sampling at temperature 1, up to 3 turns of 64 tokens in a 1024-token context."""
    return RolloutSpec(encode=lm.encode, decode=lm.decode, chat_format=get_format(lm.chat_format),
                       sampling=SamplingParams(max_tokens=64),
                       limits=HarnessLimits(max_turns=max_turns, max_obs_chars=600))


def adamw(model, lr: float) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)


def token_mean(values_BT: torch.Tensor, mask_BT: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """Sum over trained tokens / the mini-batch's trained-token count (so micro-batches add up)."""
    return (values_BT * mask_BT).sum() / max(n_tokens, 1)


def micro_batches(rows: list[TrainingRow], max_tokens: int = 8192):
    """Rows in length order, packed so that (rows × longest row) stays under ``max_tokens``."""
    rows, batch = sorted(rows, key=len), []
    for r in rows:
        if batch and (len(batch) + 1) * len(r) > max_tokens:
            yield batch
            batch = []
        batch.append(r)
    if batch:
        yield batch


def length_bucketed(rows: list[TrainingRow], steps: int, rng: random.Random):
    """``steps`` batches of ``SFT_BATCH`` rows of similar length (little padding), in random order:
    each pass shuffles, sorts windows of 8 batches by length, and shuffles the batches cut from them."""
    made = 0
    while True:
        order = rng.sample(rows, len(rows))
        for lo in range(0, len(order), 8 * SFT_BATCH):
            window = sorted(order[lo:lo + 8 * SFT_BATCH], key=len)
            batches = [window[k:k + SFT_BATCH] for k in range(0, len(window), SFT_BATCH)]
            for b in rng.sample(batches, len(batches)):
                yield b
                made += 1
                if made == steps:
                    return


def optimizer_step(model, opt) -> float:
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    opt.step()
    opt.zero_grad(set_to_none=True)
    return norm


# ---- 1. supervised warm start ------------------------------------------------------------
async def demonstrations(lm, domain, spec: RolloutSpec, n: int) -> list:
    """The scripted expert plays ``n`` tasks through the real harness and sandbox; the recorded
    sequences are the SFT data (all of them must succeed: the expert is exact)."""
    rng, fmt = random.Random(0), get_format(lm.chat_format)
    spec = copy.copy(spec)
    spec.limits = HarnessLimits(max_turns=64, max_obs_chars=600)
    sem = asyncio.Semaphore(32)

    async def one(i):
        task = domain.task("sft", i)
        engine = ScriptedEngine(domain.expert(task, rng, fmt, detour_p=0.5, max_detours=2), lm.encode)
        async with sem:
            return await run_sequence(task, domain.env_factory, engine, spec)

    seqs = await asyncio.gather(*(one(i) for i in range(n)))
    assert all(s.passed for s in seqs), "the scripted expert failed a task: the sandbox or generator is broken"
    return seqs


def sft(lm, seqs, rng: random.Random, progress: bool) -> None:
    """Token-mean cross-entropy on the expert's tokens (observations and prompts are masked)."""
    rows = [r for s in seqs for r in sequence_to_rows(s, 1.0)]
    steps = SFT_EPOCHS * len(rows) // SFT_BATCH
    opt = adamw(lm.model, SFT_LR)
    def lr_scale(k: int) -> float:  # 20 warm-up steps, then a cosine from the peak down to a tenth of it
        if k < 20:
            return (k + 1) / 20
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (k - 20) / max(1, steps - 20))))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_scale)
    torch.set_num_threads(TRAIN_THREADS)
    lm.model.train()
    for batch in tqdm(length_bucketed(rows, steps, rng), total=steps, desc="sft", disable=not progress):
        n = sum(sum(r.loss_mask[1:]) for r in batch)
        for mb in micro_batches(batch):
            b = pad_rows(mb)
            lp_BT, _ = token_logprobs(lm.model, b.ids_BT, b.attn_BT, mask_BT=b.mask_BT)
            token_mean(-lp_BT, b.mask_BT, n).backward()
        optimizer_step(lm.model, opt)
        sched.step()


# ---- 2. the learning signal: group advantages --------------------------------------------
def grpo_rows(samples: list[Sample]) -> list[TrainingRow]:
    """Each group's advantages ``r - mean(r)`` over its sequences that did not fail in the
    infrastructure; all-equal groups are dropped; a confirmed hack scores 0. Every model token
    of a sequence gets its sequence's advantage."""
    rows = []
    for sample in samples:
        seqs = [s for s in sample.sequences if not s.infra_failed]
        rewards = [0.0 if s.hack_confirmed else s.reward for s in seqs]
        if len(set(rewards)) < 2:
            continue
        mean = sum(rewards) / len(rewards)
        for seq, r in zip(seqs, rewards):
            rows += sequence_to_rows(seq, r - mean, group_id=sample.group_id)
    return rows


# ---- 3. the policy loss ------------------------------------------------------------------
def clipped_loss(lp_BT, old_BT, adv_BT, mask_BT, n_tokens: int) -> torch.Tensor:
    """PPO's clipped surrogate with clip-higher and dual clip, token-mean over ``n_tokens``.
    ``old_BT`` holds the log-probs the engine sampled with."""
    ratio = torch.exp((lp_BT - old_BT) * mask_BT)
    loss = torch.maximum(-adv_BT * ratio, -adv_BT * ratio.clamp(1 - CLIP_LOW, 1 + CLIP_HIGH))
    loss = torch.where(adv_BT < 0, torch.minimum(loss, -adv_BT * CLIP_C), loss)
    return token_mean(loss, mask_BT, n_tokens)


def rl_update(lm, opt, rows: list[TrainingRow], rng: random.Random) -> dict:
    """``MINIBATCHES`` optimizer steps over the step's rows (one pass, shuffled)."""
    lm.model.train()
    rows = rng.sample(rows, len(rows))
    k = max(1, min(MINIBATCHES, len(rows)))
    losses, norms = [], []
    for part in (rows[i::k] for i in range(k)):
        n = sum(sum(r.loss_mask[1:]) for r in part)
        total = 0.0
        for mb in micro_batches(part):
            b = pad_rows(mb)
            lp_BT, _ = token_logprobs(lm.model, b.ids_BT, b.attn_BT, b.temp_B, mask_BT=b.mask_BT)
            loss = clipped_loss(lp_BT, b.old_lp_BT, b.adv_BT, b.mask_BT, n)
            loss.backward()
            total += float(loss.detach())
        losses.append(total)
        norms.append(optimizer_step(lm.model, opt))
    return {"loss": sum(losses) / k, "grad_norm": max(norms)}


# ---- 4. evaluation -----------------------------------------------------------------------
async def heldout_success(engine, domain, spec: RolloutSpec, n: int, progress: bool) -> float:
    """One seeded attempt at each of ``n`` held-out tasks; infrastructure failures left out."""
    tasks = [domain.task("heldout", i) for i in range(n)]
    torch.set_num_threads(ROLLOUT_THREADS)
    samples = await collect(tasks, 1, domain.env_factory, engine, spec, seed=EVAL_SEED, concurrency=128, desc="eval",
                            progress=progress)
    scored = [s for x in samples for s in x.sequences if not s.infra_failed]
    return sum(s.passed for s in scored) / max(len(scored), 1)


# ---- the loop ----------------------------------------------------------------------------
async def rl(lm, engine: TorchEngine, domain, spec: RolloutSpec, steps: int, rng: random.Random,
             progress: bool) -> list:
    opt = adamw(lm.model, RL_LR)
    history, version = [], 0
    bar = tqdm(range(1, steps + 1), desc="grpo", disable=not progress)
    for step in bar:
        tasks = [domain.task("train", (step - 1) * TASKS_PER_STEP + i) for i in range(TASKS_PER_STEP)]
        torch.set_num_threads(ROLLOUT_THREADS)
        samples = await collect(tasks, GROUP, domain.env_factory, engine, spec, dispatch_step=step, progress=False)
        seqs = [s for x in samples for s in x.sequences]
        scored = [s for s in seqs if not s.infra_failed]
        rows = grpo_rows(samples)
        torch.set_num_threads(TRAIN_THREADS)
        m = rl_update(lm, opt, rows, rng) if rows else {}
        version += 1  # the engine samples from the new weights; its tokens carry the version
        engine.load_weights(lm.model.state_dict(), version)
        rec = {"step": step, "reward_mean": sum(s.reward for s in scored) / max(len(scored), 1),
               "infra_failed": len(seqs) - len(scored), "rows": len(rows), **m}
        history.append(rec)
        bar.set_postfix(reward=f"{rec['reward_mean']:.2f}", rows=len(rows), refresh=False)
    return history


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m rlonce.recipes.minimal", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/minimal", help="where summary.json goes (default runs/minimal)")
    ap.add_argument("--steps", type=int, default=RL_STEPS, help=f"RL steps (default {RL_STEPS})")
    ap.add_argument("--demos", type=int, default=SFT_DEMOS, help=f"SFT demonstrations (default {SFT_DEMOS})")
    ap.add_argument("--heldout", type=int, default=HELDOUT, help=f"held-out tasks (default {HELDOUT})")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    out, progress, t0 = Path(args.out), not args.quiet, time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    rng = random.Random(0)
    lm = loader.load(loader.resolve("embedded", out / "cache"))
    spec, domain = rollout_spec(lm), embedded_domain()

    sft(lm, asyncio.run(demonstrations(lm, domain, spec, args.demos)), rng, progress)
    pad = lm.tokenizer.pad_token_id
    engine = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=lm.eos_token_ids, pad_token_id=pad or 0,
                         max_batch_size=128)
    try:
        before = asyncio.run(heldout_success(engine, domain, spec, args.heldout, progress))
        history = asyncio.run(rl(lm, engine, domain, spec, args.steps, rng, progress))
        after = asyncio.run(heldout_success(engine, domain, spec, args.heldout, progress))
    finally:
        engine.close()
    summary = {"baseline_success": before, "final_success": after, "improvement": after - before,
               "heldout_tasks": args.heldout, "rl_steps": args.steps, "wall_seconds": time.perf_counter() - t0,
               "history": history}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"held-out success {before:.3f} -> {after:.3f} on {args.heldout} tasks in {summary['wall_seconds']:.0f}s; "
          f"{out / 'summary.json'}")
    return summary


if __name__ == "__main__":
    main()
