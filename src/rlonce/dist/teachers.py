"""Distillation under ``executor = "ray"``: each distinct teacher is an actor beside the engine
actors (``TeacherActor``: it scores rows with the teacher's forward and samples the teacher's
prefix rollouts and its held-out evaluation); each harness pool scores its groups through it
(``RemoteTeacher``) before judging them, where their tokens are. An endpoint teacher needs no
actor: each pool asks the endpoint itself (``EndpointTeacher``)."""

from __future__ import annotations

import asyncio
import os
from collections import Counter

from rlonce.config.distill import is_endpoint
from rlonce.dist.common import awaitable, first_line, ray_module
from rlonce.distill.endpoint import EndpointTeacher
from rlonce.distill.teachers import LocalTeacher, assign, resolve, scoring_rows
from rlonce.engine.base import BackendError, EngineError, Generation, SamplingParams


class TeacherActor:
    """One teacher behind an actor: ``score_rows`` (``LocalTeacher.score_rows``) and ``generate``
    (a torch engine on the same weights, built on first use)."""

    def __init__(self, cfg: dict, name: str, path: str):
        import torch

        from rlonce.config import validate

        self.run = validate(cfg)
        torch.set_num_threads(self.run.runtime.rollout_threads)
        self.teacher = LocalTeacher(name, path, dtype=self.run.model.dtype,
                                    batch_tokens=self.run.distill.teacher_batch_tokens, topk=self.run.distill.topk)
        self.engine = None

    def ready(self) -> dict:
        return {"pid": os.getpid(), "teacher": self.teacher.name}

    def score_rows(self, rows: list) -> list:
        return self.teacher.score_rows(rows)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        if self.engine is None:
            from rlonce.engine.factory import EngineSpec

            self.engine = EngineSpec.from_config(self.run, self.teacher.path).build(lm=self.teacher.lm)
        return await self.engine.generate(prompt_ids, sampling)


class RemoteTeacher:
    """``LocalTeacher.score`` over a ``TeacherActor`` (the rows travel, the teacher's forward runs there)."""

    def __init__(self, actor, timeout: float):
        self.actor, self.timeout = actor, timeout

    async def score(self, seqs) -> None:
        rows, where = scoring_rows(seqs)
        if not rows:
            return
        ray = ray_module()
        ref = self.actor.score_rows.remote(rows)
        try:
            assign(where, await asyncio.wait_for(awaitable(ref), self.timeout))
        except asyncio.TimeoutError:
            ray.cancel(ref)
            raise EngineError(f"the teacher actor did not score a group within {self.timeout:.0f} s") from None
        except ray.exceptions.RayError as e:
            raise EngineError(f"the teacher actor is unavailable: {first_line(e)}") from None


def start_teachers(cfg, run_dir, run_id: str) -> tuple[list, dict[str, str]]:
    """One ``TeacherActor`` per distinct teacher of the run's sources; returns the actors and, per
    distilled source, its teacher actor's name (what the harness pools and the driver look up) — or,
    for an endpoint teacher, which has no actor, its URL."""
    from pathlib import Path

    from rlonce.rollout.sources import plan_sources

    ray, rc = ray_module(), cfg.ray
    names: dict[str, str] = {}
    by_path: dict[str, str] = {}
    actors = []
    data = cfg.model_dump(mode="json")
    for p in plan_sources(cfg):
        if not p.distills:
            continue
        if is_endpoint(p.teacher):
            names[p.label] = p.teacher
            continue
        path = str(resolve(p.teacher, Path(run_dir) / "cache").absolute())
        if path not in by_path:
            by_path[path] = f"{run_id}-teacher-{len(by_path)}"
            actors.append(ray.remote(TeacherActor).options(
                num_cpus=rc.engine_cpus, num_gpus=rc.engine_gpus, max_restarts=rc.max_restarts, max_task_retries=0,
                max_concurrency=1000, name=by_path[path]).remote(data, p.teacher, path))
        names[p.label] = by_path[path]
    if actors:
        refs = [a.ready.remote() for a in actors]
        try:
            ray.get(refs, timeout=rc.call_timeout_s)
        except ray.exceptions.RayError as e:
            raise BackendError(f"starting the teacher actors failed: {first_line(e)}") from None
    return actors, names


class PoolDistillation:
    """A harness pool's distilled sources: each executor given its prefixes and wrapped so its
    teacher actor (or its endpoint) scores a group before the pool judges it; what they did goes
    into the group's signal stats (``take_counts``)."""

    def __init__(self, run, sources: dict, teachers: dict[str, str], timeout: float, *, vocab: int | None = None):
        from rlonce.dist.engines import RemoteEngine
        from rlonce.distill.prefixes import Prefixes

        ray = ray_module()
        self.counts: Counter = Counter()
        self.prefixes, self.teachers = {}, {}
        endpoints: dict[str, EndpointTeacher] = {}
        for label, name in teachers.items():
            plan = sources[label].plan
            if is_endpoint(name):  # no actor, and no teacher prefixes (refused by check_sources)
                actor, engine = None, None
                teacher = endpoints.setdefault(name, EndpointTeacher.from_config(run.distill, name, vocab=vocab))
            else:
                actor = ray.get_actor(name)
                engine = RemoteEngine([actor], timeout) if plan.prefix == "teacher" else None
                teacher = RemoteTeacher(actor, timeout)
            self.prefixes[label] = Prefixes(plan.prefix, plan.student_turns, domain=sources[label].domain,
                                            encode=sources[label].spec.encode, fmt=sources[label].spec.chat_format,
                                            teacher_engine=engine, seed=run.runtime.seed)
            self.teachers[label] = teacher

    def wrap(self, executors: dict) -> dict:
        from rlonce.distill.executor import DistillExecutor

        out = dict(executors)
        for label, teacher in self.teachers.items():
            plan = self.prefixes[label]
            if plan.mode != "none" or plan.student_turns:
                out[label].prefixes = plan
            out[label] = DistillExecutor(out[label], teacher, self.counts)
        return out

    def take_counts(self) -> dict[str, float]:
        """The step metrics (``Distillation.step_metrics``' keys) since the last call."""
        from rlonce.distill.executor import take_metrics

        return take_metrics(self.counts, self.prefixes)
