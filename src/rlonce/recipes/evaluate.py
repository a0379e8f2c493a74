"""Held-out evaluation: the built-in harness arms, and outside agents served over HTTP."""

from __future__ import annotations

import asyncio
import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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
    per_arm, rewards, scored_n, infra, rows = {}, {}, 0, 0, []
    for arm in spec.arms:
        label = desc if len(spec.arms) == 1 else f"{desc} {arm}"
        samples = await collect(tasks, 1, domain.env_factory, engine, spec, arm=arm, desc=label,
                                concurrency=concurrency, progress=progress, seed=EVAL_SEED, fault="eval.sequence")
        seqs = [s for x in samples for s in x.sequences]
        scored = [s for s in seqs if not s.infra_failed]
        rows += [sequence_row(s) for s in seqs]
        per_arm[arm] = sum(s.passed for s in scored) / max(len(scored), 1)
        rewards[arm] = sum(s.reward or 0.0 for s in scored) / max(len(scored), 1)
        scored_n, infra = scored_n + len(scored), infra + len(seqs) - len(scored)
    return {"success": sum(per_arm.values()) / len(per_arm), "per_arm": per_arm,
            "reward": sum(rewards.values()) / len(rewards),
            "tasks": scored_n // len(per_arm), "infra_failed": infra, "rows": rows}


def sequence_row(s) -> dict:
    """One evaluated attempt as a line of ``RUN/eval/*.jsonl``: what a paired comparison of two
    evaluations on the same tasks needs."""
    return {"task_id": s.task_id, "arm": s.arm, "reward": s.reward, "passed": s.passed, "status": s.status.value,
            "infra_failed": s.infra_failed}


def keep_rows(out: Path, desc: str, per_source: dict) -> Path:
    """Moves each source's ``rows`` out of its result into ``out/eval/<desc>.jsonl`` ("baseline eval"
    → ``baseline.jsonl``, "eval 10" → ``eval-10.jsonl``); returns the file."""
    path = out / "eval" / (desc.removesuffix(" eval").replace(" ", "-") + ".jsonl")
    write_rows(path, [{"source": k, **r} for k, v in per_source.items() for r in v.pop("rows", [])])
    return path


def write_rows(path: Path, rows: list[dict], **extra) -> None:
    """Every attempt of one evaluation, one JSON line each (``extra`` keys added to each)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps({**extra, **r}) + "\n")


def compare(before: Path, after: Path) -> list[dict]:
    """Per source of ``after`` (then "all" when there are several), the paired change from ``before``
    with the two success rates over the attempts both scored. A file that is missing or not an
    evaluation's attempts is a one-line ``ConfigError``."""
    scored = {p: _scored_attempts(p) for p in (before, after)}
    sources = sorted({k[0] for k in scored[after]}, key=str)
    out = []
    for label in [*sources, *(["all"] if len(sources) > 1 else [])]:
        ch = paired_change(before, after, None if label == "all" else label)
        if ch is None:
            continue
        both = [k for k in scored[before].keys() & scored[after].keys() if label == "all" or k[0] == label]
        out.append({"source": "—" if label is None else label, **ch,
                    "before": sum(scored[before][k] for k in both) / len(both),
                    "after": sum(scored[after][k] for k in both) / len(both)})
    if not out:
        raise ConfigError(f"{before} and {after} share no scored attempt (same source, arm and task): compare two "
                          "evaluations of the same held-out tasks")
    return out


def _scored_attempts(path: Path) -> dict[tuple, bool]:
    """An evaluation file's scored attempts: (source, arm, task) → passed."""
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return {(r.get("source"), r["arm"], r["task_id"]): bool(r["passed"]) for r in rows if not r["infra_failed"]}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{path} is not an evaluation's attempts ({type(e).__name__}: {e}); pass an eval "
                          "JSONL file such as RUN/eval/baseline.jsonl or RUN/eval/final.jsonl") from None


def paired_change(before: Path, after: Path, source: str | None = None) -> dict | None:
    """Mean per-attempt reward and pass change from ``before`` to ``after`` over the attempts both
    scored (same source, arm and task; with ``source``, that source's only), with the standard
    error of the mean paired difference: the noise a before/after table hides. None when either
    file is missing or they share no scored attempt."""
    if not (before.is_file() and after.is_file()):
        return None
    def load(p):
        out = {}
        for line in p.read_text().splitlines():
            r = json.loads(line)
            if not r["infra_failed"]:
                out[(r.get("source"), r["arm"], r["task_id"])] = r
        return out

    a, b = load(before), load(after)
    keys = sorted(k for k in a.keys() & b.keys() if source is None or k[0] == source)
    if not keys:
        return None
    out = {"attempts": len(keys)}
    for name, f in (("reward", lambda r: r["reward"] or 0.0), ("passed", lambda r: float(r["passed"]))):
        d = [f(b[k]) - f(a[k]) for k in keys]
        mean = sum(d) / len(d)
        var = sum((x - mean) ** 2 for x in d) / (len(d) - 1) if len(d) > 1 else 0.0
        out[f"{name}_change"], out[f"{name}_change_se"] = mean, math.sqrt(var / len(d))
    return out


async def outside_success(domain: Domain, engine: Engine, spec: RolloutSpec, command: str, name: str, n: int,
                          timeout: float, *, concurrency: int = 2, progress: bool = True) -> dict:
    """Held-out success of an outside agent ``command`` (``rlonce.harness.outside``): the gateway
    serves the engine over HTTP on loopback; ``concurrency`` agents run at a time (each a whole
    process; the engine batches their turns)."""
    from rlonce.gateway.http import AsyncServer, make_app
    from rlonce.harness.outside import run_outside

    tasks = [domain.task("heldout", i) for i in range(n)]
    if not isinstance(domain.env_factory(tasks[0]), HasWorkspace):
        raise ConfigError(f"task {domain.name!r} has no workspace for an outside harness to work in: "
                          "run --harness-cmd on a tool domain (e.g. task.name=toolfind)")
    gateway = spec.gateway(engine, render_tools=True,  # an outside agent's tools are new to the model
                           offload=ThreadPoolExecutor(4, thread_name_prefix="rlonce-gateway"))
    bar = tqdm(total=n, desc=f"eval {name}", unit="seq", disable=not progress, leave=False)
    sem = asyncio.Semaphore(concurrency)

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
            "rows": [sequence_row(s) for s in seqs],
            "infra_failed": len(seqs) - len(scored),
            "turns_mean": sum(s.turns for s in seqs) / max(len(seqs), 1),
            "statuses": {k.value: sum(s.status is k for s in seqs) for k in Status}}
