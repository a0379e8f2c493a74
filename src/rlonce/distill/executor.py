"""Distillation in a run: each distilled source's executor wrapped so a finished group is scored by
its teacher before it is judged, its siblings started after their prefixes; the teachers' own
held-out scores for the run's summary.

``Distillation.build`` loads each distinct teacher once (a run directory means its latest
checkpoint), refuses one whose tokenizer is not the student's, and builds a teacher engine where a
source takes its prefixes from the teacher's rollouts; an endpoint teacher
(``rlonce.distill.endpoint``) is only asked, never loaded. ``DistillExecutor`` runs the group
(``LocalExecutor``, with the source's ``Prefixes``), then the teacher's ``score``: teacher
log-probs are computed once per sampled turn and stored on its segment, so the rows, the stored
rollouts and ``rlonce audit`` carry them. A teacher that fails (``EngineError``) fails the whole
group as an infrastructure failure (``engine_error``): no sequence of it is trained or judged.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path

from rlonce.config import ConfigError
from rlonce.config.distill import is_endpoint
from rlonce.core.records import FailureCategory
from rlonce.distill.endpoint import EndpointTeacher
from rlonce.distill.prefixes import Prefixes
from rlonce.distill.teachers import LocalTeacher, Teacher, check_tokenizer, resolve
from rlonce.engine.base import EngineError
from rlonce.errors import ExecutorFailure

log = logging.getLogger(__name__)

PREFLIGHT_TEXT = "Is the teacher listening? 1 + 1 = 2"
"""What an endpoint teacher is asked to score before the run (``EndpointTeacher.preflight``)."""


class DistillExecutor:
    """``inner``'s groups, each sequence's model turns scored by ``teacher`` once they ran."""

    def __init__(self, inner, teacher: Teacher, counts: Counter):
        self.inner, self.teacher, self.counts = inner, teacher, counts

    def __getattr__(self, name):  # reserve, tickets, ...: the wrapped executor's
        return getattr(self.inner, name)

    async def run_group(self, group, group_size: int):
        out = await self.inner.run_group(group, group_size)  # a LocalExecutor's sequences (Ray: in a pool)
        t0 = time.perf_counter()
        try:
            await self.teacher.score(out)
        except EngineError as e:  # the teacher's infrastructure failed, not the student: the group is infra
            raise ExecutorFailure(f"the teacher could not score the group: {e}", FailureCategory.ENGINE_ERROR) from None
        self.counts["teacher_seconds"] += time.perf_counter() - t0
        self.counts["forced_tokens"] += sum(len(s.token_ids) for q in out for c in q.contexts for s in c.segments
                                            if s.forced)
        return out


def take_metrics(counts: Counter, prefixes: dict) -> dict[str, float]:
    """What teachers did since the last call, the counts reset: scoring seconds, forced prefix
    tokens, and with teacher prefixes the teacher rollouts (and how many failed in the
    infrastructure: their siblings start without a prefix)."""
    m = {"distill/teacher_seconds": counts.pop("teacher_seconds", 0.0),
         "distill/forced_tokens": float(counts.pop("forced_tokens", 0))}
    if any(p.mode == "teacher" for p in prefixes.values()):
        m["distill/teacher_rollouts"] = float(sum(p.teacher_rollouts for p in prefixes.values()))
        m["distill/teacher_rollouts_failed"] = float(sum(p.teacher_failed for p in prefixes.values()))
        for p in prefixes.values():
            p.teacher_rollouts = p.teacher_failed = 0
    return m


class Distillation:
    """The run's teachers (by resolved path, an endpoint's by URL) and each distilled source's teacher
    and prefix plan."""

    def __init__(self, cfg, teachers: dict[str, Teacher], of_source: dict[str, str], *,
                 remote: dict[str, object] | None = None):
        self.cfg, self.teachers, self.of_source = cfg, teachers, of_source
        self.prefixes: dict[str, Prefixes] = {}
        self.engines: dict[str, object] = dict(remote or {})
        self.remote = remote is not None
        """Under Ray the teachers are actors (``rlonce.dist.teachers``): the harness pools score and
        prefix their groups, and ``engines`` holds one client per teacher actor for evaluation."""
        self.counts: Counter = Counter()

    @classmethod
    def build(cls, cfg, sources: dict, student_lm, cache_dir: Path, *, say=lambda msg: None,
              backend=None) -> Distillation | None:
        """None when no source has a teacher. A ``backend`` with teacher actors (``RayCluster``)
        keeps the teachers there (its harness pools score; an endpoint teacher needs no actor). An
        endpoint teacher is an ``EndpointTeacher`` keyed by its URL; its tokenizer cannot be
        checked against the student's (the endpoint serves token ids, not its tokenizer): it must
        serve a model of the student's family. Each endpoint scores a short prompt first
        (``EndpointTeacher.preflight``): one that refuses (a ``distill.topk`` over its limit, a wrong
        key) is a ``ConfigError`` before the run; one not answering yet is only said."""
        distilled = {k: s for k, s in sources.items() if s.plan.distills}
        if not distilled:
            return None
        endpoints = {}
        for label, src in distilled.items():
            if is_endpoint(url := src.plan.teacher) and url not in endpoints:
                say(f"teacher {url} for {label}: an endpoint (its tokenizer cannot be checked; it must be the "
                    "student's)")
                endpoints[url] = EndpointTeacher.from_config(cfg.distill, url, vocab=len(student_lm.tokenizer))
                if line := endpoints[url].preflight(student_lm.encode(PREFLIGHT_TEXT)):
                    say(line)
        actors = getattr(backend, "teacher_engines", None)
        if actors is not None:
            of_source = {label: name for label, (name, _) in actors.items()}
            of_source |= {label: src.plan.teacher for label, src in distilled.items() if is_endpoint(src.plan.teacher)}
            return cls(cfg, {}, of_source, remote={name: engine for name, engine in actors.values()})
        teachers: dict[str, Teacher] = {}
        of_source = {}
        for label, src in distilled.items():
            if is_endpoint(src.plan.teacher):
                key = of_source[label] = src.plan.teacher
                teachers[key] = endpoints[key]
                continue
            path = resolve(src.plan.teacher, cache_dir)
            key = of_source[label] = str(path.resolve())
            if key not in teachers:
                say(f"loading teacher {src.plan.teacher} ({path}) for {label}")
                teachers[key] = LocalTeacher(src.plan.teacher, path, dtype=cfg.model.dtype,
                                             batch_tokens=cfg.distill.teacher_batch_tokens, topk=cfg.distill.topk)
                check_tokenizer(teachers[key].lm, student_lm, src.plan.teacher)
        self = cls(cfg, teachers, of_source)
        for label, src in distilled.items():
            engine = self.engine_for(label) if src.plan.prefix == "teacher" else None
            self.prefixes[label] = Prefixes(src.plan.prefix, src.plan.student_turns, domain=src.domain,
                                            encode=src.spec.encode, fmt=src.spec.chat_format, teacher_engine=engine,
                                            seed=cfg.runtime.seed)
        return self

    def teacher(self, label: str) -> Teacher:
        return self.teachers[self.of_source[label]]

    def engine_for(self, label: str):
        """An engine sampling from source ``label``'s teacher (its prefixes' rollouts, its held-out
        evaluation): the run's engine settings on the teacher's loaded weights, one per teacher. An
        endpoint teacher has none (``ConfigError``): it only scores."""
        from rlonce.engine.factory import EngineSpec

        key = self.of_source[label]
        if is_endpoint(key):
            raise ConfigError(f"source {label}'s teacher {key} is an endpoint: it scores the student's tokens but "
                              "samples nothing here (no teacher prefixes, no teacher evaluation)")
        if key not in self.engines:
            self.engines[key] = EngineSpec.from_config(self.cfg, key).build(lm=self.teachers[key].lm)
        return self.engines[key]

    def wrap(self, label: str, executor):
        """``executor`` of source ``label`` distilled (unchanged for a source without a teacher, and
        under Ray, where the harness pools wrap their own)."""
        if label not in self.of_source or self.remote:
            return executor
        plan = self.prefixes[label]
        if plan.mode != "none" or plan.student_turns:
            executor.prefixes = plan
        return DistillExecutor(executor, self.teacher(label), self.counts)

    def step_metrics(self) -> dict[str, float]:
        """What the teachers did since the last call (``take_metrics``); under Ray the harness pools
        report it with each group instead."""
        return {} if self.remote else take_metrics(self.counts, self.prefixes)

    def release_unused(self) -> list[str]:
        """Close the local teacher engines no teacher prefix samples from (those the held-out
        evaluation built): each holds its batch and prefix caches, one per teacher, which five
        SmolLM2 teachers cannot afford beside the student on 24 GiB. ``engine_for`` builds one again
        if asked. Returns the released teachers."""
        if self.remote:
            return []
        keep = {p.teacher_engine for p in self.prefixes.values() if p.teacher_engine is not None}
        released = [k for k, e in self.engines.items() if e not in keep]
        for k in released:
            self.engines.pop(k).close()
        return released

    def close(self) -> None:
        for e in self.engines.values():
            e.close()
        self.engines = {}

