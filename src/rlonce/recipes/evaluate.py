"""Held-out evaluation: the built-in harness arms, and outside agents served over HTTP."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from tqdm.auto import tqdm

from rlonce.config import ConfigError
from rlonce.core.records import Status
from rlonce.engine.base import Engine
from rlonce.envs.base import HasWorkspace
from rlonce.envs.domains import Domain
from rlonce.rollout.runner import RolloutSpec, collect

EVAL_SEED = 12345
"""Every evaluation draws each turn from a seed of (EVAL_SEED, task, sequence): reproducible."""


async def heldout_success(domain: Domain, engine: Engine, spec: RolloutSpec, n: int, desc: str, *,
                          concurrency: int = 128, progress: bool = True) -> dict:
    """Held-out success: the first ``n`` held-out tasks under every arm of ``spec``, one seeded
    attempt each; ``success`` (the passed share) and ``reward`` (the mean reward: a graded
    domain's score) are means over arms; infrastructure failures are left out."""
    tasks = [domain.task("heldout", i) for i in range(n)]
    per_arm, rewards, scored_n, infra = {}, {}, 0, 0
    for arm in spec.arms:
        label = desc if len(spec.arms) == 1 else f"{desc} {arm}"
        samples = await collect(tasks, 1, domain.env_factory, engine, spec, arm=arm, desc=label,
                                concurrency=concurrency, progress=progress, seed=EVAL_SEED, fault="eval.sequence")
        seqs = [s for x in samples for s in x.sequences]
        scored = [s for s in seqs if not s.infra_failed]
        per_arm[arm] = sum(s.passed for s in scored) / max(len(scored), 1)
        rewards[arm] = sum(s.reward or 0.0 for s in scored) / max(len(scored), 1)
        scored_n, infra = scored_n + len(scored), infra + len(seqs) - len(scored)
    return {"success": sum(per_arm.values()) / len(per_arm), "per_arm": per_arm,
            "reward": sum(rewards.values()) / len(rewards),
            "tasks": scored_n // len(per_arm), "infra_failed": infra}


async def outside_success(domain: Domain, engine: Engine, spec: RolloutSpec, command: str, name: str, n: int,
                          timeout: float, *, progress: bool = True) -> dict:
    """Held-out success of an outside agent ``command`` (``rlonce.harness.outside``): the gateway
    serves the engine over HTTP on loopback; two agents run at a time."""
    from rlonce.gateway.http import AsyncServer, make_app
    from rlonce.harness.outside import run_outside

    tasks = [domain.task("heldout", i) for i in range(n)]
    if not isinstance(domain.env_factory(tasks[0]), HasWorkspace):
        raise ConfigError(f"task {domain.name!r} has no workspace for an outside harness to work in: "
                          "run --harness-cmd on a tool domain (e.g. task.name=toolfind)")
    gateway = spec.gateway(engine, render_tools=True,  # an outside agent's tools are new to the model
                           offload=ThreadPoolExecutor(4, thread_name_prefix="rlonce-gateway"))
    bar = tqdm(total=n, desc=f"eval {name}", unit="seq", disable=not progress, leave=False)
    sem = asyncio.Semaphore(2)  # outside agents are whole processes

    async def one(task):
        async with sem:
            seq = await run_outside(task, domain.env_factory, gateway, srv.base_url, command, name=name,
                                    timeout=timeout, timeouts=spec.timeouts)
        bar.update(1)
        return seq

    async with AsyncServer(make_app(gateway)) as srv:
        seqs = await asyncio.gather(*(one(t) for t in tasks))
    bar.close()
    scored = [s for s in seqs if not s.infra_failed]
    return {"success": sum(s.passed for s in scored) / max(len(scored), 1), "tasks": len(scored),
            "infra_failed": len(seqs) - len(scored),
            "turns_mean": sum(s.turns for s in seqs) / max(len(seqs), 1),
            "statuses": {k.value: sum(s.status is k for s in seqs) for k in Status}}
