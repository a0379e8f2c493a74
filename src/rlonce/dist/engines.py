"""Engine actors and the client a harness pool generates through."""

from __future__ import annotations

import asyncio
import os

from rlonce.dist.common import awaitable, first_line, ray_module
from rlonce.engine.base import BackendError, EngineError, Generation, SamplingParams, Watch, watch_after


# ---- engines ---------------------------------------------------------------------------------
class EngineActor:
    """One engine behind an actor. With ``weights_from`` (the trainer actor's name) it loads the
    latest published weights before serving — also after Ray restarts it. Peers are passed by
    name, not handle: a restartable actor's constructor arguments must outlive it."""

    def __init__(self, factory, index: int, weights_from: str | None = None, timeout: float = 300.0):
        ray = ray_module()
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

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, watch: Watch | None = None) -> Generation:
        """``watch`` sees the tokens once the whole turn is back (an actor does not stream them)."""
        return watch_after(await self._generate(prompt_ids, sampling), watch)

    async def _generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        ray = ray_module()
        i = min(range(len(self.actors)), key=self._inflight.__getitem__)
        self._inflight[i] += 1
        ref = self.actors[i].generate.remote(list(prompt_ids), sampling)
        try:
            return await asyncio.wait_for(awaitable(ref), self.timeout)
        except asyncio.TimeoutError:
            ray.cancel(ref)
            raise EngineError(f"engine actor {i} did not answer within {self.timeout:.0f} s") from None
        except asyncio.CancelledError:
            ray.cancel(ref)
            raise
        except ray.exceptions.RayTaskError as e:  # the engine raised: the same error as in-process
            raise e.as_instanceof_cause() from None
        except ray.exceptions.RayError as e:
            raise EngineError(f"engine actor {i} is unavailable: {first_line(e)}") from None
        finally:
            self._inflight[i] -= 1

    def _all(self, method: str, *args) -> list:
        ray = ray_module()
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
        self.load_published([ray_module().put(state)], version)

    def pause(self) -> None:
        self._all("pause")

    def resume(self) -> None:
        self._all("resume")

    def close(self) -> None:
        pass
