"""Multi-turn agent sessions replayed on the torch engine: the shape of a real rollout, the engine's
own tokens.

The scripted expert plays ``n`` tasks of a domain through the real gateway and harness; each
recorded session gives its prompt, the length of every reply and the tokens of every tool answer.
A replay sends the prompt, has the engine sample exactly that many tokens (no end token), appends
the engine's own reply and the recorded tool answer, and sends the next turn — what an agent loop
does, turn by turn — optionally sleeping a tool call's latency between turns and starting the
sessions staggered.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass

from rlonce.core.records import Role


@dataclass
class Shape:
    prompt: list[int]
    replies: list[int]
    """Tokens per reply."""
    answers: list[list[int]]
    """What follows each reply (tool answers, the next user turn); the last is empty."""


def record_shapes(domain: str, model: str, n: int, out, overrides: tuple[str, ...] = ()) -> list[Shape]:
    """The expert's sessions on ``n`` tasks of ``domain`` (no detours), tokenised for ``model``."""
    from rlonce.config import load_config
    from rlonce.recipes.grpo import Job
    from rlonce.recipes.sft import demonstrations

    cfg = load_config(None, [f"out={out}", f"model.name={model}", f"task.name={domain}", "sft.detour_p=0",
                                *overrides])
    job = Job.for_model(cfg, model, progress=False)
    try:
        src = next(iter(job.sources.values()))
        ctx = job.ctx
        seqs = asyncio.run(demonstrations(src.domain, src.spec, ctx.fmt, ctx.lm.encode, cfg, n=n, progress=False))
    finally:
        job.close()  # its engine's thread
    shapes = []
    for s in seqs:
        segs = s.contexts[0].segments
        shape = Shape(list(segs[0].token_ids), [], [])
        for seg in segs[1:]:
            if seg.role is Role.MODEL:
                shape.replies.append(len(seg.token_ids))
                shape.answers.append([])
            else:
                (shape.answers[-1] if shape.answers else shape.prompt).extend(seg.token_ids)
        shapes.append(shape)
    return shapes


async def replay(engine, shapes: list[Shape], *, tool_s: float = 0.0, stagger_s: float = 0.0, seed: int = 0) -> dict:
    """Replay every session concurrently; generated tokens/s, per-turn latencies and prompt tokens."""
    from rlonce.engine.base import SamplingParams

    rng = random.Random(seed)
    delays = [[rng.uniform(0.5, 1.5) * tool_s for _ in s.replies] for s in shapes]
    latencies, prompt_by_turn, cached_by_turn, generated = [], {}, {}, [0]

    async def one(i: int, s: Shape):
        await asyncio.sleep(i * stagger_s)
        ctx = list(s.prompt)
        for k, n in enumerate(s.replies):
            t0 = time.perf_counter()
            g = await engine.generate(ctx, SamplingParams(max_tokens=n, seed=seed * 1000 + i * 10 + k))
            latencies.append(time.perf_counter() - t0)
            generated[0] += len(g.token_ids)
            prompt_by_turn.setdefault(k, []).append(len(ctx))
            cached_by_turn.setdefault(k, []).append(g.metrics.get("cached_prompt_tokens", 0))
            ctx += g.token_ids + s.answers[k]
            if k + 1 < len(s.replies):
                await asyncio.sleep(delays[i][k])

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i, s) for i, s in enumerate(shapes)))
    wall = time.perf_counter() - t0
    lat = sorted(latencies)
    return {"tokens_per_s": generated[0] / wall, "wall_s": wall,
            "turn_p50_s": statistics.median(lat), "turn_p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))],
            "prefill_per_turn": {k: statistics.mean(p) - statistics.mean(cached_by_turn[k])
                                 for k, p in sorted(prompt_by_turn.items())},
            "prompt_per_turn": {k: statistics.mean(p) for k, p in sorted(prompt_by_turn.items())}}
