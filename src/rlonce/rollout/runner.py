"""Running sequences: one environment, one session, one harness episode — and the retry boundary.

``run_sequence`` is the only place where exceptions from the episode are caught and turned
into a ``Status`` (and, for infrastructure failures, a ``FailureCategory``). An
infrastructure failure is never graded, so it can never become a low reward.
``collect`` runs many sequences concurrently on one event loop; the engine batches their
turns, the sandboxes run as subprocesses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from tqdm.auto import tqdm

from rlonce.core.records import FailureCategory, Sample, Sequence, Status
from rlonce.engine.base import Engine, EngineError, SamplingParams
from rlonce.envs.base import GradingError
from rlonce.gateway.session import TokenSession
from rlonce.harness.base import FormatError, LimitsExceeded, Submitted
from rlonce.harness.mini_bash import ARM, HarnessLimits, run_episode
from rlonce.model.chat import HermesFormat
from rlonce.sandbox.base import SandboxError


@dataclass
class RolloutSpec:
    """What every sequence of a collection shares."""

    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    chat_format: HermesFormat
    sampling: SamplingParams
    limits: HarnessLimits
    max_context: int = 1024


async def run_sequence(task, env_factory, engine: Engine, spec: RolloutSpec, *, seed: int | None = None) -> Sequence:
    """Run one sequence. With ``seed``, every turn's draw is seeded (reproducible evaluation)."""
    t0 = time.perf_counter()
    env = env_factory(task)
    session = TokenSession(engine, spec.encode, spec.decode, spec.chat_format, max_context=spec.max_context,
                           seed=seed)
    status, failure, answer, reward = Status.SUBMITTED, None, None, None
    try:
        try:
            await env.setup()
        except Exception:  # noqa: BLE001 - the retry boundary
            status, failure = Status.INFRA, FailureCategory.SETUP_FAILED
        else:
            try:
                await run_episode(env, session, spec.sampling, spec.limits)
            except Submitted as end:
                answer = end.answer
            except LimitsExceeded:
                status = Status.LIMITS
            except FormatError:
                status = Status.FORMAT_ERROR
            except EngineError:
                status, failure = Status.INFRA, FailureCategory.ENGINE_ERROR
            except SandboxError:
                status, failure = Status.INFRA, FailureCategory.SANDBOX_ERROR
        seq = Sequence(task.task_id, ARM, [session.context], status, failure, answer=answer,
                       turns=len(session.generations))
        if status is not Status.INFRA:  # graded before clean-up: a grader may read the workspace
            try:
                reward = await env.grade(seq)
            except GradingError as e:
                seq.status, seq.failure = Status.INFRA, FailureCategory(e.category)
            except Exception:  # noqa: BLE001 - a grader outage is not the model's failure
                seq.status, seq.failure = Status.INFRA, FailureCategory.GRADER_UNAVAILABLE
    finally:
        await env.cleanup()
    seq.reward = reward
    seq.metrics = {
        **getattr(env, "metrics", {}),
        "seconds": time.perf_counter() - t0,
        "model_tokens": float(session.context.model_tokens()),
        "context_tokens": float(len(session.context)),
    }
    return seq


async def collect(tasks: list, group_size: int, env_factory, engine: Engine, spec: RolloutSpec, *,
                  dispatch_step: int = 0, concurrency: int = 64, desc: str = "rollout",
                  progress: bool = True, seed: int | None = None) -> list[Sample]:
    """Run ``group_size`` sequences of every task, at most ``concurrency`` at a time.

    With ``seed``, sequence k of task i draws from seed ``(seed, i, k)``: the outcome does not
    depend on how requests happened to be batched.
    """
    sem = asyncio.Semaphore(concurrency)
    samples = [Sample(t.task_id, t.source, dispatch_step) for t in tasks]
    bar = tqdm(total=len(tasks) * group_size, desc=desc, unit="seq", disable=not progress, leave=False,
               dynamic_ncols=True)
    solved = done = 0

    async def one(i: int, k: int, task) -> None:
        nonlocal solved, done
        seq_seed = None if seed is None else (seed * 1_000_003 + i * 1009 + k) % (2**62)
        async with sem:
            seq = await run_sequence(task, env_factory, engine, spec, seed=seq_seed)
        samples[i].sequences.append(seq)
        solved += int(seq.success)
        done += 1
        bar.update(1)
        bar.set_postfix(success=f"{solved / done:.2f}", refresh=False)

    try:
        await asyncio.gather(*(one(i, k, t) for i, t in enumerate(tasks) for k in range(group_size)))
    finally:
        bar.close()
    return samples
