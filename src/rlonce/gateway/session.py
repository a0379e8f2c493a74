"""In-process token session: the exact-token recorder between a harness and an engine.

One session per sequence. It owns the context's token list. The opening prompt and every
observation are encoded once, as deltas, and appended with no loss; each model turn is
appended exactly as the engine sampled it — ids, log-probs, versions — and never re-encoded
from text. That is the whole trick that keeps ``π_θ/μ`` meaningful: the trainer sees the very
tokens the rollout policy chose, with the history they were chosen in.

Budgets: ``max_context`` bounds the total trajectory (observations included); a turn's
``max_tokens`` is clipped to what is left of it. Exhausting it raises ``BudgetExceeded``.
"""

from __future__ import annotations

from dataclasses import replace

from rlonce.core.records import Context, Role, Segment
from rlonce.engine.base import Engine, Generation, SamplingParams
from rlonce.model.chat import HermesFormat


class BudgetExceeded(Exception):
    """The trajectory's token budget is spent."""


class TokenSession:
    def __init__(self, engine: Engine, encode, decode, chat_format: HermesFormat, *, max_context: int = 1024,
                 seed: int | None = None):
        self.engine = engine
        self.encode = encode
        self.decode = decode
        self.fmt = chat_format
        self.max_context = max_context
        self.context = Context()
        self.generations: list[Generation] = []
        self.seed = seed

    def _append(self, role: Role, text: str) -> None:
        ids = self.encode(text)
        if len(self.context) + len(ids) >= self.max_context:
            raise BudgetExceeded(f"context budget of {self.max_context} tokens reached")
        self.context.segments.append(Segment(role, ids))

    def open(self, system: str, user: str, tools: list[dict]) -> None:
        if self.context.segments:
            raise RuntimeError("session already opened")
        self._append(Role.PROMPT, self.fmt.opening(system, user, tools))

    async def generate(self, sampling: SamplingParams) -> tuple[str, Generation]:
        """Sample one model turn, record it exactly, return its text and the raw generation."""
        room = self.max_context - len(self.context)
        if room <= 1:
            raise BudgetExceeded(f"context budget of {self.max_context} tokens reached")
        if sampling.max_tokens > room:
            sampling = replace(sampling, max_tokens=room)
        if self.seed is not None:
            sampling = replace(sampling, seed=self.seed + 7919 * len(self.generations))
        gen = await self.engine.generate(self.context.token_ids(), sampling)
        self.context.segments.append(
            Segment(Role.MODEL, list(gen.token_ids), list(gen.logprobs), list(gen.versions), gen.finish_reason)
        )
        self.generations.append(gen)
        return self.decode(gen.token_ids), gen

    def observe(self, results: list[str]) -> None:
        """Append tool results (and the next generation prompt) as an observation segment."""
        self._append(Role.OBSERVATION, self.fmt.observation(results))

    def flag_last(self, name: str) -> None:
        """Mark the last model segment for the penalty module (e.g. a malformed tool call)."""
        for seg in reversed(self.context.segments):
            if seg.role is Role.MODEL:
                seg.flags[name] = True
                return
