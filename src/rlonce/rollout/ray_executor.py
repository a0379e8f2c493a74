"""Scale-out on Ray: engine actors, harness-pool actors, a trainer actor, and the executor the
orchestrator drives — the same orchestrator, judge, trainer and engine code as the local run.

    driver (control plane: Job, Orchestrator, ledger; metadata only)
      ├─ RayExecutor.run_group ──► HarnessPool actor (many sequences on one event loop; sandboxes are
      │                            subprocesses, judging runs on a background thread)
      │                              └─ RemoteEngine ──► EngineActor (TorchEngine, or any Engine factory)
      │      ◄── Judged (ledger entry, statistics, sequences without contexts)   [return 1]
      │          payload = (sequences, TrainingRows) left in the object store    [return 2]
      └─ RayCluster.train(payload refs) ──► TrainerActor fetches the rows, steps, puts the weights
         into the object store once (``publish``); engines load them by version between tokens.

**Ownership.** A pool's payload is the second return value of the driver's call, so the driver
owns it and it outlives the pool that made it; only the trainer (and a checkpoint writer)
fetches it. Ray inlines values under 100 KiB into the reply instead of the object store.

**Faults.** Pools and engines are restarted by Ray (``ray.max_restarts``); a call that was in
flight on a dead actor fails, and its group becomes ``infra`` with category ``worker_lost``
(``call_timeout`` when the call outlived ``ray.group_timeout_s``) — the orchestrator books it
and dispatches on. Engine requests from a pool time out after ``ray.call_timeout_s`` and become
``engine_error``. A restarted engine loads the trainer's latest published weights before it
serves, so it never generates with a version the run has left behind.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

from rlonce.core.records import FailureCategory
from rlonce.engine.base import BackendError, BackendMissing, EngineError, Generation, SamplingParams
from rlonce.engine.factory import EngineSpec
from rlonce.rollout.orchestrator import Judge, Judged

log = logging.getLogger("rlonce.ray")
_SESSION_SUFFIX = len("/session_2026-11-30_01-13-03_719857_4194304/sockets/plasma_store")
_MAX_SOCKET_PATH = 107


def _ray():
    try:
        import ray
    except ImportError:
        raise BackendMissing("executor 'ray' needs Ray: pip install 'rlonce[ray]' (make test installs it)") from None
    return ray


class ExecutorFailure(RuntimeError):
    """A group could not be run; ``category`` says which part of the infrastructure failed."""

    def __init__(self, message: str, category: FailureCategory):
        super().__init__(message)
        self.category = category


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


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


def start_ray(rc, run_dir: Path) -> bool:
    """Connect to (``rc.address``) or start a Ray instance; True when this call started it."""
    ray = _ray()
    if ray.is_initialized():
        return False
    common = dict(include_dashboard=rc.dashboard, log_to_driver=False, logging_level=logging.WARNING)
    if rc.address:
        ray.init(address=rc.address, **common)
    else:
        cpus = rc.num_cpus or max(4, os.cpu_count() or 1)
        temp = ray_temp_dir(Path(rc.temp_dir) if rc.temp_dir else run_dir / "ray")
        ray.init(num_cpus=cpus, _temp_dir=str(temp), **common)
    return True


# ---- engines ---------------------------------------------------------------------------------
class EngineActor:
    """One engine behind an actor. With ``weights_from`` (the trainer actor's name) it loads the
    latest published weights before serving — also after Ray restarts it. Peers are passed by
    name, not handle: a restartable actor's constructor arguments must outlive it."""

    def __init__(self, factory, index: int, weights_from: str | None = None, timeout: float = 300.0):
        ray = _ray()
        self.engine = factory(index)
        if weights_from is not None:
            version, refs = ray.get(ray.get_actor(weights_from).latest.remote(), timeout=timeout)
            if refs:
                self.engine.load_weights(ray.get(refs[0], timeout=timeout), version)

    def ready(self) -> dict:
        return {"pid": os.getpid(), "version": self.engine.version}

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        return await self.engine.generate(prompt_ids, sampling)

    async def load_weights(self, refs: list, version: int) -> int:
        state = await refs[0]
        await asyncio.to_thread(self.engine.load_weights, state, version)
        return version

    def pause(self) -> None:
        self.engine.pause()

    def resume(self) -> None:
        self.engine.resume()


class RemoteEngine:
    """The Engine contract over engine actors: what a harness pool's gateway, and the driver's
    evaluation, generate through. Each request goes to the actor with the fewest requests in
    flight from this client; every call has a timeout; a lost actor is an ``EngineError``."""

    def __init__(self, actors: list, timeout: float, version: int = 0):
        self.actors = list(actors)
        self.timeout = timeout
        self.version = version
        self._inflight = [0] * len(self.actors)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        ray = _ray()
        i = min(range(len(self.actors)), key=self._inflight.__getitem__)
        self._inflight[i] += 1
        ref = self.actors[i].generate.remote(list(prompt_ids), sampling)
        try:
            return await asyncio.wait_for(_awaitable(ref), self.timeout)
        except asyncio.TimeoutError:
            ray.cancel(ref)
            raise EngineError(f"engine actor {i} did not answer within {self.timeout:.0f} s") from None
        except asyncio.CancelledError:
            ray.cancel(ref)
            raise
        except ray.exceptions.RayTaskError as e:  # the engine raised: the same error as in-process
            raise e.as_instanceof_cause() from None
        except ray.exceptions.RayError as e:
            raise EngineError(f"engine actor {i} is unavailable: {_first_line(e)}") from None
        finally:
            self._inflight[i] -= 1

    def _all(self, method: str, *args) -> list:
        ray = _ray()
        refs = [getattr(a, method).remote(*args) for a in self.actors]
        try:
            return ray.get(refs, timeout=self.timeout)
        except ray.exceptions.GetTimeoutError:
            raise BackendError(f"engine actors did not finish {method} within {self.timeout:.0f} s "
                               "(ray.call_timeout_s); see the Ray logs under RUN/ray") from None

    def load_published(self, refs: list, version: int) -> None:
        """Load weights already in the object store (``refs = [ObjectRef]``) as ``version``."""
        self._all("load_weights", refs, version)
        self.version = version

    def load_weights(self, state: dict, version: int) -> None:
        self.load_published([_ray().put(state)], version)

    def pause(self) -> None:
        self._all("pause")

    def resume(self) -> None:
        self._all("resume")

    def close(self) -> None:
        pass


async def _awaitable(ref):
    return await ref


# ---- harness pools ---------------------------------------------------------------------------
class HarnessPool:
    """Hosts many concurrent sequences on one event loop: each group's sequences run through the
    same ``LocalExecutor`` (environment, gateway session, harness loop, grader) as a local run,
    generating through ``RemoteEngine``; the group is judged here, where its tokens are. Blocking
    work runs off the loop: sandbox commands are subprocesses, rendering and tokenization run on
    one background thread, judging on another."""

    def __init__(self, cfg: dict, model_dir: str, engines: list[str], judge: Judge, call_timeout: float):
        import torch

        from rlonce.config import validate
        from rlonce.envs.domains import domain_for
        from rlonce.model import loader
        from rlonce.recipes.grpo import rollout_spec
        from rlonce.rollout.runner import LocalExecutor

        torch.set_num_threads(1)
        run = validate(cfg)
        lm = loader.load(model_dir, chat_format=run.model.chat_format, weights=False)
        self.decode = lm.decode
        self.domain = domain_for(run.task)
        self.engine = RemoteEngine([_ray().get_actor(name) for name in engines], call_timeout)
        self.executor = LocalExecutor(self.domain.env_factory, self.engine, rollout_spec(run, lm))
        # one background thread renders and tokenizes for every session of this pool: off the event
        # loop, and never two threads in one tokenizer at once
        self.executor.gateway.offload = ThreadPoolExecutor(1, thread_name_prefix="rlonce-tokenize")
        self.judge = judge
        self.groups = 0

    def ready(self) -> dict:
        return {"pid": os.getpid(), "groups": self.groups}

    async def run_group(self, task, source: str, dispatch_step: int, group_size: int):
        seqs = await self.executor.run_group(SimpleNamespace(task=task, dispatch_step=dispatch_step), group_size)
        judged = await asyncio.to_thread(self.judge, task.task_id, source, dispatch_step, seqs, self.decode)
        self.groups += 1
        light = [replace(s, contexts=[]) for s in seqs]
        return Judged(light, judged.entry, judged.stats, payload=len(judged.rows)), (seqs, judged.rows)


@dataclass
class RemotePayload:
    """A group's ``(sequences, rows)`` in the object store, owned by the driver."""

    ref: object
    rows: int
    timeout: float

    def fetch(self) -> tuple[list, list]:
        return _ray().get(self.ref, timeout=self.timeout)


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
        ray = _ray()
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            try:
                await asyncio.wait_for(_awaitable(self.pools[i].ready.remote()), max(1.0, self.probe_interval * 8))
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
        ray = _ray()
        i = await self._pick()
        self.load[i] += group_size
        meta_ref, payload_ref = self.pools[i].run_group.options(num_returns=2).remote(
            group.task, group.source, group.dispatch_step, group_size)
        try:
            judged = await asyncio.wait_for(_awaitable(meta_ref), self.timeout)
        except asyncio.TimeoutError:
            ray.cancel(meta_ref)
            raise ExecutorFailure(f"harness pool {i} did not finish group {group.gid} within {self.timeout:.0f} s",
                                  FailureCategory.CALL_TIMEOUT) from None
        except asyncio.CancelledError:  # dropped as stale: stop the sequences where they run
            ray.cancel(meta_ref)
            raise
        except ray.exceptions.RayTaskError as e:
            raise ExecutorFailure(f"harness pool {i} raised on group {group.gid}: {_first_line(e)}",
                                  FailureCategory.HARNESS_ERROR) from None
        except ray.exceptions.RayError as e:
            self.lost[i] += 1
            self._mark_lost(i)
            raise ExecutorFailure(f"harness pool {i} was lost during group {group.gid}: {_first_line(e)}",
                                  FailureCategory.WORKER_LOST) from None
        finally:
            self.load[i] -= group_size
        judged.payload = RemotePayload(payload_ref, judged.payload, self.timeout)
        return judged


# ---- training --------------------------------------------------------------------------------
class TrainerActor:
    """The trainer in its own process: fetches the rows of the groups it trains on, steps, and
    publishes its weights to the object store by version.

    With ``ray.trainer_workers = N > 1`` there are N of them, ranks of one ``torch.distributed``
    group (gloo on CPU, NCCL on GPU) training one FSDP2-sharded model (``rlonce.train.distributed``):
    each fetches only its share of the step's groups, and the update equals one process's on the
    whole batch. Rank 0 publishes the gathered weights."""

    def __init__(self, model_dir: str, dtype: str, lm_head_fp32: bool, optim, temperature: float, threads: int,
                 state_refs: list, version: int, timeout: float = 300.0):
        import torch

        from rlonce.model import loader

        ray = _ray()
        torch.set_num_threads(threads)
        self.timeout = timeout
        self.model = loader.load(model_dir, dtype=dtype, lm_head_fp32=lm_head_fp32).model
        if state_refs:
            self.model.load_state_dict(ray.get(state_refs[0], timeout=timeout))
        if torch.cuda.is_available():  # Ray shows this actor a GPU only when ray.trainer_gpus > 0
            self.model.to("cuda")
        self.optim, self.temperature = optim, temperature
        self.version, self._published = version, None
        self.rank, self.world = 0, 1

    def ready(self) -> dict:
        return {"pid": os.getpid(), "version": self.version, "rank": self.rank}

    def rendezvous(self) -> tuple[str, int]:
        """An address and free port on this actor's node for the process group (rank 0)."""
        import socket

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return _ray().util.get_node_ip_address(), port

    def setup(self, rank: int, world: int, address: tuple[str, int] | None, trainer_state: dict | None) -> dict:
        """Build the trainer: alone, or as ``rank`` of ``world`` (joining the process group at
        ``address`` and sharding the model first: the optimizer must hold the shards)."""
        from rlonce.train.trainer import Trainer

        self.rank, self.world = rank, world
        if world > 1:
            from rlonce.train.distributed import init_process_group, load_full_optimizer_state, shard_model

            os.environ.update(MASTER_ADDR=address[0], MASTER_PORT=str(address[1]), RANK=str(rank),
                              WORLD_SIZE=str(world), LOCAL_RANK="0")
            init_process_group()
            shard_model(self.model)
        self.trainer = Trainer(self.model, self.optim, temperature=self.temperature)
        if trainer_state and world > 1:
            if "optimizer_full" not in trainer_state:
                raise BackendError("this checkpoint's optimizer state is from a single trainer; resume it with "
                                   "ray.trainer_workers = 1")
            load_full_optimizer_state(self.model, self.trainer.optimizer,
                                      trainer_state["optimizer_full"] if rank == 0 else {})
            self.trainer.step = trainer_state["step"]
        elif trainer_state:
            if "optimizer_full" in trainer_state:
                raise BackendError("this checkpoint's optimizer state is from data-parallel trainers; resume it "
                                   "with ray.trainer_workers > 1")
            self.trainer.load_state_dict(trainer_state)
        self.publish(self.version)
        return self.ready()

    def rl_step(self, payload_refs: list, rows: list, kwargs: dict) -> dict:
        from rlonce.core.records import version_lags

        for _, more in _ray().get(payload_refs, timeout=self.timeout):
            rows = rows + list(more)
        metrics = self.trainer.rl_step(rows, **kwargs)
        metrics["lag_counts"] = dict(version_lags(rows, kwargs["version"]))  # this rank's rows
        return metrics

    def _full_state(self) -> dict:
        if self.world > 1:
            from rlonce.train.distributed import full_state_dict

            return full_state_dict(self.model)  # every rank takes part; rank 0 gets the weights
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}

    def publish(self, version: int) -> list | None:
        """Put the weights into the object store once (rank 0); engines fetch them by reference."""
        state = self._full_state()
        self.version = version
        if self.rank == 0:
            self._published = [_ray().put(state)]  # serialised (copied) now
        return self._published

    def latest(self) -> tuple[int, list | None]:
        return self.version, self._published

    def state(self) -> tuple[dict, dict]:
        """(weights, optimizer state) for a checkpoint; complete on rank 0."""
        model_state = self._full_state()
        if self.world > 1:
            from rlonce.train.distributed import full_optimizer_state

            return model_state, {"optimizer_full": full_optimizer_state(self.model, self.trainer.optimizer),
                                 "step": self.trainer.step}
        return model_state, self.trainer.state_dict()


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


class RayCluster:
    """The driver's handle on the actors of one run."""

    def __init__(self, cfg, model_dir: Path, run_dir: Path, *, state: dict, version: int,
                 trainer_state: dict | None, optim, judge: Judge, engine_factory=None):
        ray = _ray()
        self.started = start_ray(cfg.ray, run_dir)
        model_dir = Path(model_dir).absolute()  # actors do not share the driver's working directory
        if cfg.task.pack:
            cfg = cfg.model_copy(update={"task": cfg.task.model_copy(update={"pack": str(Path(cfg.task.pack).absolute())})})
        rc, m = cfg.ray, cfg.model
        self.rc = rc
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
            str(model_dir), m.dtype, m.lm_head_fp32, optim, cfg.harness.temperature, threads, state_refs,
            version, rc.call_timeout_s) for r in range(n)]
        self.trainer = self.trainers[0]
        self._wait(self.trainers, "trainer")
        address = self._get([self.trainer.rendezvous.remote()], "the trainer rendezvous")[0] if n > 1 else None
        self._get([t.setup.remote(r, n, address, trainer_state) for r, t in enumerate(self.trainers)], "trainer setup")
        factory = engine_factory or EngineSpec.from_config(cfg, model_dir)
        engine_cls = ray.remote(EngineActor)
        self.engine_actors = [
            engine_cls.options(num_cpus=rc.engine_cpus, num_gpus=rc.engine_gpus, max_restarts=rc.max_restarts,
                               max_task_retries=0, max_concurrency=1000, name=name
                               ).remote(factory, i, trainer_name, rc.call_timeout_s)
            for i, name in enumerate(engine_names)]
        self._wait(self.engine_actors, "engine")
        self.engine = RemoteEngine(self.engine_actors, rc.call_timeout_s, version)
        pool_cls = ray.remote(HarnessPool).options(num_cpus=rc.pool_cpus, max_restarts=rc.max_restarts,
                                                   max_task_retries=0, max_concurrency=100_000)
        data = cfg.model_dump(mode="json")
        self.pools = [pool_cls.remote(data, str(model_dir), engine_names, judge, rc.call_timeout_s)
                      for _ in range(rc.harness_pools)]
        self._wait(self.pools, "harness pool")
        self.start_seconds = time.perf_counter() - t0

    def _wait(self, actors: list, what: str) -> None:
        self._get([a.ready.remote() for a in actors], f"starting the {what} actors",
                  hint=": does the cluster have the CPUs/GPUs requested under [ray]? (`ray status` shows them)")

    def _get(self, refs: list, what: str, hint: str = "") -> list:
        ray = _ray()
        try:
            return ray.get(refs, timeout=self.rc.call_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise BackendError(f"{what} did not finish within {self.rc.call_timeout_s:.0f} s "
                               f"(ray.call_timeout_s){hint}") from None
        except ray.exceptions.RayError as e:
            raise BackendError(f"{what} failed: {_first_line(e)}") from None

    def executor(self) -> RayExecutor:
        return RayExecutor(self.pools, self.rc.group_timeout_s)

    async def train(self, payloads: list[RemotePayload], rows: list, kwargs: dict) -> dict:
        """One step on every trainer rank, each given its share of the groups (local rows, replayed
        from a checkpoint, go to rank 0); the metrics are global, the lag counts summed."""
        shares = split_payloads(payloads, len(self.trainers))
        refs = [t.rl_step.remote([p.ref for p in share], rows if r == 0 else [], kwargs)
                for r, (t, share) in enumerate(zip(self.trainers, shares))]
        try:
            out = await asyncio.wait_for(asyncio.gather(*(_awaitable(x) for x in refs)), self.rc.group_timeout_s)
        except asyncio.TimeoutError:
            raise BackendError(f"the trainer actors did not finish a step within {self.rc.group_timeout_s:.0f} s "
                               "(ray.group_timeout_s)") from None
        lags: Counter = Counter()
        for m in out:
            lags.update(m.pop("lag_counts"))
        return {**out[0], "lag_counts": dict(lags)}

    def publish(self, version: int) -> None:
        """Trainer → object store → every engine, as ``version``; in-flight turns stop at their next
        token and continue under the new weights (the engines are paused for the swap)."""
        refs = self._get([t.publish.remote(version) for t in self.trainers], "publishing weights")[0]
        self.engine.pause()
        try:
            self.engine.load_published(refs, version)
        finally:
            self.engine.resume()

    def pull(self) -> tuple[dict, dict]:
        """The trainer's model and optimizer state (for a checkpoint)."""
        return self._get([t.state.remote() for t in self.trainers], "reading the trainer state")[0]

    def close(self) -> None:
        ray = _ray()
        for a in [*self.pools, *self.engine_actors, *self.trainers]:
            ray.kill(a, no_restart=True)
        if self.started:
            ray.shutdown()
