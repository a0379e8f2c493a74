"""A scripted, deterministic engine: replays fixed assistant turns as token ids.

It is the expert that writes SFT demonstrations and the deterministic model of the tests.
It speaks the same Engine contract as the torch engine, so a demonstration goes through the
very session, harness and sandbox code an RL rollout does. Its log-probs are 0.0 (each
scripted token has probability 1 under the script) and its version is fixed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rlonce.engine.base import EngineError, Generation, SamplingParams, Watch, watch_after


class ScriptedEngine:
    def __init__(self, turns: list[str], encode: Callable[[str], list[int]], *, version: int = 0,
                 latency: float = 0.0):
        self._turns = list(turns)
        self._encode = encode
        self.version = version
        self.latency = latency
        """Seconds each turn takes (a slow engine, for the wall-clock limits' tests)."""
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, watch: Watch | None = None) -> Generation:
        self.prompts.append(list(prompt_ids))
        if self.latency:
            await asyncio.sleep(self.latency)
        if not self._turns:
            raise EngineError("scripted engine has no turns left")
        ids = self._encode(self._turns.pop(0))
        reason = "stop"
        if len(ids) > sampling.max_tokens:
            ids, reason = ids[: sampling.max_tokens], "length"
        return watch_after(Generation(ids, [0.0] * len(ids), [self.version] * len(ids), reason), watch)

    def load_weights(self, state: dict, version: int) -> None:
        self.version = version

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass
