"""Running sequences: one environment, one session, one harness episode — and the retry boundary.

``run_sequence`` is the only place where exceptions from the episode are caught and turned
into a ``Status`` (and, for infrastructure failures, a ``FailureCategory``). An
infrastructure failure is never graded, so it can never become a low reward.
``collect`` runs many sequences concurrently on one event loop; the engine batches their
turns, the sandboxes run as subprocesses.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from tqdm.auto import tqdm

from rlonce.core import faults
from rlonce.core.records import FailureCategory, Sample, Sequence, Status
from rlonce.core.timeouts import Timeouts
from rlonce.engine.base import Engine, EngineError, SamplingParams
from rlonce.engine.lockstep import Lockstep
from rlonce.envs.base import grade_group_or_infra, grade_or_infra, infra_failure
from rlonce.errors import POLICY, blame, cause_of, is_internal, note_internal
from rlonce.gateway.core import Gateway
from rlonce.gateway.messages import ProtocolError
from rlonce.gateway.session import Budgets, GatewaySettings, session_metrics
from rlonce.harness.arms import arm_for, get_arm
from rlonce.harness.base import FormatError, LimitsExceeded, Submitted
from rlonce.harness.clients import CLIENTS
from rlonce.harness.loop import HarnessLimits, run_episode
from rlonce.model.chat import ChatFormat
from rlonce.sandbox.base import SandboxError


@dataclass(kw_only=True)
class RolloutSpec:
    """What every sequence of a collection shares."""

    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    chat_format: ChatFormat
    sampling: SamplingParams
    limits: HarnessLimits
    max_context: int = 1024
    arms: tuple[str, ...] = ("mini-bash",)
    """Harness arms; each task gets one by step hash (``arm_for``) unless a caller fixes it."""
    arm_seed: int = 0
    arm_per_sequence: bool = False
    """Hash each sequence (task id + sibling index) instead of each task: arms mix within a group."""
    timeouts: Timeouts = Timeouts()
    """Wall-clock limits of each sequence (trajectory, setup, reward, model request, agent idle)."""
    sequence_seed: int | None = None
    """Deterministic runs: each RL sequence samples from its own seed, drawn from this one and the
    sequence's dispatch step, source, task position and sibling index (``seed_of``)."""

    def seed_of(self, step: int, source: str, index: int, sibling: int) -> int | None:
        if self.sequence_seed is None:
            return None
        return (self.sequence_seed * 1_000_003 + step * 7919 + zlib.crc32(source.encode()) * 104729
                + index * 1009 + sibling) % 2**62

    def arm_of(self, task_id: str, sibling: int, round_: int) -> str:
        """The step-hash arm of sibling ``sibling`` of task ``task_id`` dispatched in ``round_``."""
        key = f"{task_id}#{sibling}" if self.arm_per_sequence else task_id
        return arm_for(self.arm_seed, round_, key, list(self.arms))

    def gateway(self, engine: Engine, *, render_tools: bool | None = None, offload: Executor | None = None) -> Gateway:
        """A gateway for this collection's sequences (``render_tools``: the limits' unless given;
        ``offload``: see ``GatewaySettings``)."""
        return Gateway(GatewaySettings(
            engine=engine, encode=self.encode, decode=self.decode, fmt=self.chat_format, sampling=self.sampling,
            budgets=Budgets(self.sampling.max_tokens, self.max_context),
            render_tools=self.limits.render_tools if render_tools is None else render_tools, offload=offload,
            model_timeout=self.timeouts.model))


_CATEGORIES = ((EngineError, FailureCategory.ENGINE_ERROR), (SandboxError, FailureCategory.SANDBOX_ERROR),
               (ProtocolError, FailureCategory.HARNESS_ERROR))
"""Exceptions of an episode → failure category. ``ProtocolError``: the harness and the gateway
disagree, ours and not the model's; anything else unexpected is a harness error too (or
``internal_error`` when it is a bug of ours, see ``rlonce.errors.is_internal``). A wall-clock
limit that ran out (``rlonce.core.timeouts.Expired``) keeps its own layer's category."""


def _category(e: BaseException) -> FailureCategory:
    return next((c for t, c in _CATEGORIES if isinstance(e, t)), FailureCategory.HARNESS_ERROR)


async def run_sequence(task, env_factory, engine: Engine, spec: RolloutSpec, *, seed: int | None = None,
                       arm: str | None = None, gateway: Gateway | None = None, member=None) -> Sequence:
    """Run one sequence under harness ``arm`` (default: the spec's first). With ``seed``,
    every turn's draw is seeded (reproducible evaluation). Setup, the episode and grading run
    on the sequence's clock (``spec.timeouts``); clean-up runs whatever the clock says. ``member``:
    the lockstep membership (``Ticket.member``) its setup and episode run in."""
    t0, clock = time.perf_counter(), spec.timeouts.start()
    harness = get_arm(arm or spec.arms[0])
    env = env_factory(task)
    gateway = gateway or spec.gateway(engine)
    session = gateway.open(seed=seed, metadata={"task_id": task.task_id, "arm": harness.name})
    grade = None
    try:
        async with member or contextlib.nullcontext():
            status, failure, answer, cause = await _episode(env, harness, gateway, session, spec, clock)
        seq = Sequence(task.task_id, harness.name, session.contexts, status, failure, answer=answer,
                       turns=len(session.generations), cause=cause)
        if status is not Status.INFRA:  # graded before clean-up: a grader may read the workspace
            grade = await grade_or_infra(env, seq, clock)
    finally:
        try:
            await env.cleanup()
        except Exception as e:  # noqa: BLE001 - a workspace that resists clean-up must not end the run
            cleanup_failed = 1.0
            if is_internal(e):
                note_internal(e)
        else:
            cleanup_failed = 0.0
        gateway.sessions.pop(session.id, None)
    seq.set_grade(grade)
    seq.metrics = {
        **env.metrics,
        **session_metrics(session),
        "seconds": time.perf_counter() - t0,
        "cleanup_failed": cleanup_failed,
        "model_tokens": float(session.model_tokens()),
        "context_tokens": float(sum(len(c) for c in session.contexts)),
        "versions_spanned": float(len({v for c in session.contexts for g in c.segments if g.versions and not g.forced
                                        for v in g.versions})),
    }
    return seq


async def _episode(env, harness, gateway: Gateway, session, spec: RolloutSpec, clock) -> tuple:
    """Setup and the harness episode of one sequence: (status, failure category, answer, cause)."""
    status, failure, answer, cause = Status.SUBMITTED, None, None, None
    try:
        await clock.setup(env.setup())
    except Exception as e:  # noqa: BLE001 - the retry boundary
        failure, cause = infra_failure(e, FailureCategory.SETUP_FAILED)
        return Status.INFRA, failure, None, cause
    try:
        client = CLIENTS[harness.protocol](lambda p, b: gateway.call(p, b, session.id),
                                           harness.system_prompt(env), env.user_prompt(),
                                           [t.schema for t in harness.toolset(env).values()])
        await clock.agent(run_episode(harness, env, client, session, spec.limits, spec.max_context),
                          session.last_request)
    except Submitted as end:
        answer = end.answer
    except LimitsExceeded:
        status = Status.LIMITS
    except FormatError:
        status = Status.FORMAT_ERROR
    except Exception as e:  # noqa: BLE001 - the retry boundary: whose failure it is decides the status
        if blame(e, infrastructure=tuple(t for t, _ in _CATEGORIES), tool_call=False) == POLICY:
            env.metrics["policy_input_errors"] = env.metrics.get("policy_input_errors", 0.0) + 1
            status, cause = Status.FORMAT_ERROR, cause_of(e)  # the policy's input: graded, trained
        else:  # an outage or our bug, never the model's
            status, (failure, cause) = Status.INFRA, infra_failure(e, _category(e))
    return status, failure, answer, cause


async def collect(tasks: list, group_size: int, env_factory, engine: Engine, spec: RolloutSpec, *,
                  dispatch_step: int = 0, concurrency: int = 64, desc: str = "rollout",
                  progress: bool = True, seed: int | None = None, arm: str | None = None,
                  fault: str | None = None) -> list[Sample]:
    """Run ``group_size`` sequences of every task, at most ``concurrency`` at a time.

    Each task's arm is ``arm`` if given, else the step hash of (``spec.arm_seed``,
    ``dispatch_step``, task id) over ``spec.arms``: all siblings of a group share it.
    With ``seed``, sequence k of task i draws from seed ``(seed, i, k)``: the draw does not
    depend on which requests share a batch. A task's sequences are in sibling order. On a
    ``Lockstep`` engine, ``concurrency`` sequences at a time run as one lockstep round. ``fault``:
    the fault point each ended sequence reaches (``rlonce.core.faults``).
    """
    lockstep = engine if isinstance(engine, Lockstep) else None
    sem = asyncio.Semaphore(concurrency)
    gateway = spec.gateway(engine)
    samples = [Sample(t.task_id, t.source, dispatch_step, [None] * group_size) for t in tasks]
    bar = tqdm(total=len(tasks) * group_size, desc=desc, unit="seq", disable=not progress, leave=False,
               dynamic_ncols=True)
    solved = done = 0

    async def one(i: int, k: int, task, ticket=None) -> None:
        nonlocal solved, done
        seq_seed = None if seed is None else (seed * 1_000_003 + i * 1009 + k) % (2**62)
        async with sem:
            seq = await run_sequence(task, env_factory, engine, spec, seed=seq_seed, gateway=gateway,
                                     arm=arm or spec.arm_of(task.task_id, k, dispatch_step),
                                     member=ticket and ticket.member((i, k)))
        samples[i].sequences[k] = seq
        if fault:
            faults.point(fault)
        solved += int(seq.passed)
        done += 1
        bar.update(1)
        bar.set_postfix(success=f"{solved / done:.2f}", refresh=False)

    todo = [(i, k, t) for i, t in enumerate(tasks) for k in range(group_size)]
    try:
        if lockstep is None:
            await asyncio.gather(*(one(*x) for x in todo))
        else:
            for r in range(0, len(todo), concurrency):
                ticket = lockstep.reserve(len(todo[r:r + concurrency]))
                try:
                    await asyncio.gather(*(one(*x, ticket) for x in todo[r:r + concurrency]))
                finally:
                    ticket.release()
    finally:
        bar.close()
    for t, x in zip(tasks, samples):
        await grade_group_or_infra(env_factory, t, x.sequences, spec.timeouts.reward)
    return samples


def split_by_arm(samples: list[Sample]) -> list[Sample]:
    """One group per (task, arm): advantages then compare siblings under the same harness only."""
    out = []
    for x in samples:
        for arm in dict.fromkeys(s.arm for s in x.sequences):
            out.append(Sample(f"{x.task_id}/{arm}", x.source, x.dispatch_step,
                              [s for s in x.sequences if s.arm == arm]))
    return out


class LocalExecutor:
    """Runs a group's sequences on this event loop, all through one in-process gateway."""

    def __init__(self, env_factory, engine: Engine, spec: RolloutSpec, *, offload: Executor | None = None):
        self.env_factory = env_factory
        self.engine = engine
        self.spec = spec
        self.gateway = spec.gateway(engine, offload=offload)
        self.tickets: dict[str, object] = {}
        self.prefixes = None
        """A distilled source's prefix plan (``rlonce.distill.prefixes.Prefixes``: ``plan``, ``sibling``):
        each sibling starts after its forced turns. None: every sibling starts at the task's start."""

    def reserve(self, group, group_size: int) -> None:
        """Called as the group is dispatched: on a ``Lockstep`` engine, its sequences are announced."""
        if isinstance(self.engine, Lockstep):
            self.tickets[group.gid] = self.engine.reserve(group_size)

    async def run_group(self, group, group_size: int) -> list[Sequence]:
        spec, task = self.spec, group.task
        # a Ray harness pool's group is only its task and dispatch step (never lockstep, never seeded)
        ticket = self.tickets.pop(getattr(group, "gid", None), None)
        key = (group.dispatch_step, getattr(group, "source", ""), getattr(group, "index", 0))
        try:
            parts = [(self.engine, self.gateway, spec)] * group_size
            if self.prefixes is not None:
                plan = await self.prefixes.plan(task, group, group_size, spec)
                parts = [self.prefixes.sibling(self, forced) for forced in plan]
            seqs = list(await asyncio.gather(*(
                run_sequence(task, self.env_factory, engine, sib_spec, gateway=gateway,
                             arm=spec.arm_of(task.task_id, k, group.dispatch_step), seed=spec.seed_of(*key, k),
                             member=ticket and ticket.member((*key, k)))
                for k, (engine, gateway, sib_spec) in enumerate(parts))))
        finally:
            if ticket is not None:
                ticket.release()
        faults.point("rollout.group")
        await grade_group_or_infra(self.env_factory, task, seqs, spec.timeouts.reward)  # graders that compare siblings
        return seqs
