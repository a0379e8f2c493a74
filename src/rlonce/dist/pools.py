"""Harness-pool actors and the executor the orchestrator drives on the driver."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

from rlonce.core.records import FailureCategory
from rlonce.dist.common import awaitable, first_line, log, ray_module
from rlonce.dist.engines import RemoteEngine
from rlonce.errors import ExecutorFailure
from rlonce.rollout.orchestrator import Judge, Judged


class HarnessPool:
    """Hosts many concurrent sequences on one event loop: each group's sequences run through the
    same ``LocalExecutor`` (environment, gateway session, harness loop, grader) as a local run,
    generating through ``RemoteEngine``; with ``[grading]`` the run's model graders grade the group
    (``rlonce.rollout.graded``, judges built here from the config, recording to ``run_dir``); the
    group is judged here, where its tokens are. Blocking work runs off the loop: sandbox commands
    are subprocesses, rendering and tokenization run on one background thread, judging on another.
    ``pools``: how many pools the run has (they share the judges' concurrency)."""

    def __init__(self, cfg: dict, model_dir: str, engines: list[str], judge: Judge, call_timeout: float,
                 run_dir: str, pools: int = 1, teachers: dict[str, str] | None = None):
        import torch

        from rlonce.config import validate
        from rlonce.model import loader
        from rlonce.rollout.builders import rollout_spec
        from rlonce.rollout.graded import Grading
        from rlonce.rollout.runner import LocalExecutor
        from rlonce.rollout.sources import build_sources, plan_sources

        torch.set_num_threads(1)
        run = validate(cfg)
        lm = loader.load(model_dir, chat_format=run.model.chat_format, weights=False)
        self.decode = lm.decode
        self.engine = RemoteEngine([ray_module().get_actor(name) for name in engines], call_timeout)
        # one background thread renders and tokenizes for every session of this pool: off the event
        # loop, and never two threads in one tokenizer at once
        offload = ThreadPoolExecutor(1, thread_name_prefix="rlonce-tokenize")
        sources = build_sources(plan_sources(run), rollout_spec(run, lm), run_dir=Path(run_dir), grading=run.grading)
        self.executors = {label: LocalExecutor(src.domain.env_factory, self.engine, src.spec, offload=offload)
                          for label, src in sources.items()}
        """One executor per task source of the run, by label (graded first with ``[grading]``; a
        distilled source's scored by its teacher actor first, ``teachers``: label → actor name)."""
        self.distill = None
        if teachers:
            from rlonce.dist.teachers import PoolDistillation

            self.distill = PoolDistillation(run, sources, teachers, call_timeout, vocab=len(lm.tokenizer))
            self.executors = self.distill.wrap(self.executors)
        self.grading = (Grading(run, sources, self.decode, Path(run_dir), processes=pools)
                        if run.grading.enabled else None)
        if self.grading is not None:
            self.executors = {label: self.grading.wrap(label, ex) for label, ex in self.executors.items()}
        self.judge = judge
        self.groups = 0

    def ready(self) -> dict:
        return {"pid": os.getpid(), "groups": self.groups}

    async def run_group(self, task, source: str, dispatch_step: int, group_size: int):
        group = SimpleNamespace(task=task, source=source, dispatch_step=dispatch_step)
        seqs = await self.executors[source].run_group(group, group_size)
        judged = await asyncio.to_thread(self.judge, task.task_id, source, dispatch_step, seqs, self.decode)
        self.groups += 1
        light = [replace(s, contexts=[]) for s in seqs]
        counts = self.grading.take_counts() if self.grading is not None else None
        stats = {**judged.stats, **(self.distill.take_counts() if self.distill is not None else {})}
        return Judged(light, judged.entry, stats, payload=len(judged.rows), signal=judged.signal,
                      grading=counts), (seqs, judged.rows)


@dataclass
class RemotePayload:
    """A group's ``(sequences, rows)`` in the object store, owned by the driver."""

    ref: object
    rows: int
    timeout: float

    def fetch(self) -> tuple[list, list]:
        return ray_module().get(self.ref, timeout=self.timeout)


class RayExecutor:
    """The orchestrator's executor: each group goes to the healthy harness pool with the fewest
    sequences in flight; the reply is metadata, the payload stays remote.

    A pool whose call failed is taken out of rotation until it answers ``ready`` again (Ray is
    restarting it); calls sent to a restarting actor would fail too. With no pool healthy, a
    group waits for one to come back, at most ``timeout`` seconds, then fails as ``worker_lost``.
    """

    def __init__(self, pools: list, timeout: float, *, probe_interval: float = 0.25):
        self.pools = list(pools)
        self.timeout = timeout
        self.probe_interval = probe_interval
        self.load = [0] * len(self.pools)
        self.healthy = [True] * len(self.pools)
        self.lost: Counter = Counter()
        """Groups lost per pool index (the actor died under them)."""
        self._recovering: dict[int, asyncio.Task] = {}

    async def _recover(self, i: int) -> None:
        ray = ray_module()
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            try:
                await asyncio.wait_for(awaitable(self.pools[i].ready.remote()), max(1.0, self.probe_interval * 8))
            except (asyncio.TimeoutError, ray.exceptions.RayError):
                await asyncio.sleep(self.probe_interval)
                continue
            self.healthy[i] = True
            log.warning("harness pool %d is back", i)
            return
        log.error("harness pool %d did not come back within %.0f s; it gets no more work", i, self.timeout)

    def _mark_lost(self, i: int) -> None:
        self.healthy[i] = False
        task = self._recovering.get(i)
        if task is None or task.done():
            self._recovering[i] = asyncio.get_running_loop().create_task(self._recover(i))

    async def _pick(self) -> int:
        while True:
            live = [i for i, ok in enumerate(self.healthy) if ok]
            if live:
                return min(live, key=self.load.__getitem__)
            waiting = [t for t in self._recovering.values() if not t.done()]
            if not waiting:
                raise ExecutorFailure("no harness pool is alive (all exhausted ray.max_restarts); see RUN/ray logs",
                                      FailureCategory.WORKER_LOST)
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)

    async def run_group(self, group, group_size: int) -> Judged:
        ray = ray_module()
        i = await self._pick()
        self.load[i] += group_size
        meta_ref, payload_ref = self.pools[i].run_group.options(num_returns=2).remote(
            group.task, group.source, group.dispatch_step, group_size)
        try:
            judged = await asyncio.wait_for(awaitable(meta_ref), self.timeout)
        except asyncio.TimeoutError:
            ray.cancel(meta_ref)
            raise ExecutorFailure(f"harness pool {i} did not finish group {group.gid} within {self.timeout:.0f} s",
                                  FailureCategory.CALL_TIMEOUT) from None
        except asyncio.CancelledError:  # dropped as stale: stop the sequences where they run
            ray.cancel(meta_ref)
            raise
        except ray.exceptions.RayTaskError as e:  # the pool's own ExecutorFailure keeps its category
            category = getattr(e.cause, "category", FailureCategory.HARNESS_ERROR)
            raise ExecutorFailure(f"harness pool {i} raised on group {group.gid}: {first_line(e)}",
                                  category) from None
        except ray.exceptions.RayError as e:
            self.lost[i] += 1
            self._mark_lost(i)
            raise ExecutorFailure(f"harness pool {i} was lost during group {group.gid}: {first_line(e)}",
                                  FailureCategory.WORKER_LOST) from None
        finally:
            self.load[i] -= group_size
        judged.payload = RemotePayload(payload_ref, judged.payload, self.timeout)
        return judged
