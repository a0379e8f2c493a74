"""Starting Ray and the cluster a run drives: trainer, engine and harness-pool actors."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

from rlonce.config.distill import is_endpoint
from rlonce.dist.common import awaitable, first_line, ray_module
from rlonce.dist.engines import EngineActor, RemoteEngine
from rlonce.dist.pools import HarnessPool, RayExecutor, RemotePayload
from rlonce.dist.teachers import start_teachers
from rlonce.dist.trainers import TrainerActor
from rlonce.engine.base import BackendError
from rlonce.engine.factory import EngineSpec
from rlonce.model import lora
from rlonce.model.precision import wants_autocast
from rlonce.rollout.orchestrator import Judge, StepResult
from rlonce.train.request import RLRequest

_SESSION_SUFFIX = len("/session_2026-11-30_01-13-03_719857_4194304/sockets/plasma_store")
_MAX_SOCKET_PATH = 107


# ---- starting Ray --------------------------------------------------------------------------
def ray_temp_dir(wanted: Path) -> Path:
    """``wanted`` if Ray's socket paths fit under it, else a short folder in /tmp that ``wanted``
    links to (Unix socket paths are limited to 107 bytes)."""
    wanted = wanted.absolute()
    if len(str(wanted)) + _SESSION_SUFFIX <= _MAX_SOCKET_PATH:
        wanted.mkdir(parents=True, exist_ok=True)
        return wanted
    short = Path(tempfile.gettempdir()) / f"rlonce-ray-{hashlib.sha1(str(wanted).encode()).hexdigest()[:10]}"
    short.mkdir(parents=True, exist_ok=True)
    wanted.parent.mkdir(parents=True, exist_ok=True)
    if wanted.is_symlink() or not wanted.exists():
        wanted.unlink(missing_ok=True)
        wanted.symlink_to(short, target_is_directory=True)
    return short


RAY_SYSTEM_CONFIG = {"worker_niceness": 0}
"""Ray starts its workers at niceness 15: beside any ordinary CPU work (a build on the same laptop,
another job) its actors then get about a thirtieth of a core, and starting them ran past a
two-minute call timeout. rlonce's actors are the job itself, so they run at the driver's priority."""


def start_ray(rc, run_dir: Path) -> bool:
    """Connect to (``rc.address``) or start a Ray instance; True when this call started it."""
    ray = ray_module()
    if ray.is_initialized():
        return False
    common = dict(include_dashboard=rc.dashboard, log_to_driver=False, logging_level=logging.WARNING)
    if rc.address:
        ray.init(address=rc.address, **common)
    else:
        cpus = rc.num_cpus or max(4, os.cpu_count() or 1)
        temp = ray_temp_dir(Path(rc.temp_dir) if rc.temp_dir else run_dir / "ray")
        ray.init(num_cpus=cpus, _temp_dir=str(temp), _system_config=RAY_SYSTEM_CONFIG, **common)
    return True


def split_payloads(payloads: list, world: int) -> list[list]:
    """Groups to ranks, most rows first to the rank with the fewest: each payload goes to exactly
    one rank, which alone fetches it."""
    shares: list[list] = [[] for _ in range(world)]
    load = [0] * world
    for p in sorted(payloads, key=lambda p: -p.rows):
        r = min(range(world), key=load.__getitem__)
        shares[r].append(p)
        load[r] += p.rows
    return shares


def absolute_packs(cfg):
    """``cfg`` with every task pack path absolute: actors do not share the driver's directory."""
    def fix(t):
        pack = getattr(t, "pack", None)  # a domain option by convention: the folder of its task pack
        return t.model_copy(update={"pack": str(Path(pack).absolute())}) if pack else t
    return cfg.model_copy(update={"task": fix(cfg.task), "sources": [fix(x) for x in cfg.sources]})


class RayCluster:
    """The driver's handle on the actors of one run: the ``TrainerBackend`` of ``executor = "ray"``
    (``rlonce.train.backend``)."""

    def __init__(self, cfg, model_dir: Path, run_dir: Path, *, state: dict, version: int,
                 trainer_state: dict | None, optim, judge: Judge, engine_factory=None):
        ray = ray_module()
        self.started = start_ray(cfg.ray, run_dir)
        model_dir = Path(model_dir).absolute()  # actors do not share the driver's working directory
        cfg = absolute_packs(cfg)
        rc, m = cfg.ray, cfg.model
        self.rc = rc
        self._executor: RayExecutor | None = None
        t0 = time.perf_counter()
        run_id = f"rlonce-{os.getpid()}-{time.time_ns() % 10**9}"
        trainer_name = f"{run_id}-trainer"
        engine_names = [f"{run_id}-engine-{i}" for i in range(rc.engines)]
        n = rc.trainer_workers
        trainer_cls = ray.remote(TrainerActor)
        threads = max(1, cfg.runtime.train_threads // n)
        state_refs = [ray.put(state)]  # once, for every rank
        self.trainers = [trainer_cls.options(num_cpus=rc.trainer_cpus, num_gpus=rc.trainer_gpus, max_concurrency=2,
                                             name=trainer_name if r == 0 else f"{trainer_name}-{r}").remote(
            str(model_dir), m.dtype, m.lm_head_fp32, optim, threads, state_refs,
            version, rc.call_timeout_s, wants_autocast(m.autocast), (m.packing, m.share_prefix),
            cfg.runtime.micro_batch_tokens, m.lora if m.lora.rank > 0 else None) for r in range(n)]
        self.trainer = self.trainers[0]
        self._wait(self.trainers, "trainer")
        address = self._get([self.trainer.rendezvous.remote()], "the trainer rendezvous")[0] if n > 1 else None
        self._get([t.setup.remote(r, n, address, trainer_state) for r, t in enumerate(self.trainers)], "trainer setup")
        # under LoRA the engines load the base: a publish sends the adapter alone (rlonce.model.lora)
        base_dir = Path(lora.adapter_base(model_dir)) if m.lora.rank > 0 and lora.is_adapter(model_dir) else model_dir
        factory = engine_factory or EngineSpec.from_config(cfg, base_dir)
        engine_cls = ray.remote(EngineActor)
        self.engine_actors = [
            engine_cls.options(num_cpus=rc.engine_cpus, num_gpus=rc.engine_gpus, max_restarts=rc.max_restarts,
                               max_task_retries=0, max_concurrency=1000, name=name
                               ).remote(factory, i, trainer_name, rc.call_timeout_s)
            for i, name in enumerate(engine_names)]
        self._wait(self.engine_actors, "engine")
        self.engine = RemoteEngine(self.engine_actors, rc.call_timeout_s, version)
        self.teacher_actors, teacher_names = start_teachers(cfg, run_dir, run_id)
        self.teacher_engines = {label: (name, RemoteEngine([ray.get_actor(name)], rc.call_timeout_s))
                                for label, name in teacher_names.items() if not is_endpoint(name)}
        """Per distilled source: its teacher actor's name and an engine over it (``rlonce.dist.teachers``;
        a source whose teacher is an endpoint has no actor: its pools ask the endpoint)."""
        pool_cls = ray.remote(HarnessPool).options(num_cpus=rc.pool_cpus, max_restarts=rc.max_restarts,
                                                   max_task_retries=0, max_concurrency=100_000)
        data = cfg.model_dump(mode="json")
        self.pools = [pool_cls.remote(data, str(model_dir), engine_names, judge, rc.call_timeout_s,
                                      str(Path(run_dir).absolute()), rc.harness_pools, teacher_names)
                      for _ in range(rc.harness_pools)]
        self._wait(self.pools, "harness pool")
        self.start_seconds = time.perf_counter() - t0

    def _wait(self, actors: list, what: str) -> None:
        self._get([a.ready.remote() for a in actors], f"starting the {what} actors",
                  hint=": does the cluster have the CPUs/GPUs requested under [ray]? (`ray status` shows them)")

    def _get(self, refs: list, what: str, hint: str = "") -> list:
        ray = ray_module()
        try:
            return ray.get(refs, timeout=self.rc.call_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise BackendError(f"{what} did not finish within {self.rc.call_timeout_s:.0f} s "
                               f"(ray.call_timeout_s){hint}") from None
        except ray.exceptions.RayError as e:
            raise BackendError(f"{what} failed: {first_line(e)}") from None

    def executor(self, domain=None, spec=None) -> tuple[RayExecutor, int]:
        """The pools' executor, one for every source (each pool builds the run's sources from the
        config and runs a group on its own source's), and the sessions they hold at once."""
        if self._executor is None:
            self._executor = RayExecutor(self.pools, self.rc.group_timeout_s)
        return self._executor, self.rc.harness_pools * self.rc.pool_sessions

    async def train(self, batch: StepResult, request: RLRequest) -> dict:
        """One step on every trainer rank, each given its share of the groups (local rows, replayed
        from a checkpoint, go to rank 0); the metrics are global, the lag counts summed."""
        payloads: list[RemotePayload] = batch.payloads
        shares = split_payloads(payloads, len(self.trainers))
        refs = [t.rl_step.remote([p.ref for p in share], batch.rows if r == 0 else [], request)
                for r, (t, share) in enumerate(zip(self.trainers, shares))]
        try:
            out = await asyncio.wait_for(asyncio.gather(*(awaitable(x) for x in refs)), self.rc.group_timeout_s)
        except asyncio.TimeoutError:
            raise BackendError(f"the trainer actors did not finish a step within {self.rc.group_timeout_s:.0f} s "
                               "(ray.group_timeout_s)") from None
        lags: Counter = Counter()
        for m in out:
            lags.update(m.pop("lag_counts"))
        return {**out[0], "lag_counts": dict(lags)}

    async def publish(self, version: int) -> int:
        """Trainer → object store → every engine, as ``version``; in-flight turns stop at their next
        token and continue under the new weights (the engines are paused for the swap). The bytes
        of the weights each engine fetches."""
        return await asyncio.to_thread(self._publish, version)

    def _publish(self, version: int) -> int:
        refs, nbytes = self._get([t.publish.remote(version) for t in self.trainers], "publishing weights")[0]
        self.engine.pause()
        try:
            self.engine.load_published(refs, version)
        finally:
            self.engine.resume()
        return nbytes

    def pull(self, model) -> dict:
        """``model`` takes the trainer actors' weights; returns their optimizer state (for a checkpoint)."""
        model_state, trainer_state = self._get([t.state.remote() for t in self.trainers],
                                               "reading the trainer state")[0]
        model.load_state_dict(model_state)
        return trainer_state

    def close(self) -> None:
        ray = ray_module()
        self.engine.close()
        for a in [*self.pools, *self.engine_actors, *self.teacher_actors, *self.trainers]:
            ray.kill(a, no_restart=True)
        if self.started:
            ray.shutdown()
