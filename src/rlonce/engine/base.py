"""The Engine contract: token ids in, token ids out, with the log-probs that were sampled.

An engine never sees text. Each generated token comes back with the log-probability under
the distribution it was actually drawn from (after temperature, top-k and top-p), the size of
that distribution's candidate set when top-k or top-p cut it, and the policy version of the
weights that drew it, which is what makes an importance ratio mean what it says.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from rlonce.errors import RlonceError


@dataclass(frozen=True)
class Constraint:
    """What a reply must match, enforced while it is sampled (``rlonce.engine.constrain`` builds
    these and turns them into grammars): ``kind`` is ``json_schema`` (``spec``: the schema as JSON
    text), ``regex``, ``choice`` (``spec``: a JSON list of the allowed strings) or ``lark`` (a Lark
    grammar, which may embed JSON schemas as ``%json {...}``: a tool call of given tools).
    ``prefix``: tokens already sampled under it (a paused turn that resumes), consumed before the
    first new token is masked."""

    kind: str
    spec: str
    prefix: tuple[int, ...] = ()

    KINDS = ("json_schema", "regex", "choice", "lark")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise ValueError(f"constraint kind {self.kind!r} is not one of {', '.join(self.KINDS)}")


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    """Per-request seed; when set, the draw does not depend on which other requests share the batch."""
    stop_confident_run: int = 0
    """Stop rule (MiniMax-M1 §4): end the turn with finish reason 'repetition' once this many
    consecutive tokens were each sampled with probability > ``confident_p``. 0 disables it."""
    confident_p: float = 0.99
    candidate_sets: bool = True
    """Under top-k/top-p, record each token's candidate-set size (``Generation.candidates``) for the
    trainer to renormalise over. Off only to measure what that buys: the trainer then normalises
    over the whole vocabulary."""
    top_logprobs: int = 0
    """Also record, per token, up to this many most likely tokens of the distribution it was drawn
    from, with their log-probs (``Generation.top_logprobs``; what a gateway client asks for with
    ``top_logprobs``). Read after the draw: it never changes what is sampled. 0: off."""
    constraint: Constraint | None = None
    """A grammar the reply must match (JSON schema, regular expression, choice, tool call): tokens
    it does not allow get probability 0 before temperature, top-k and top-p, and the recorded
    log-probs are of that constrained distribution. A training run refuses it (docs/gateway.md,
    "Structured output"): the trainer normalises over the whole vocabulary."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0 (greedy decoding: use top_k=1)")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 disables it)")
        if self.stop_confident_run < 0 or not 0 < self.confident_p < 1:
            raise ValueError("stop_confident_run must be >= 0 and confident_p in (0, 1)")
        if self.top_logprobs < 0:
            raise ValueError("top_logprobs must be >= 0 (0 disables it)")

    @property
    def records_candidates(self) -> bool:
        """The engine records each token's candidate-set size (``Generation.candidates``): top-k or
        top-p may leave only part of the vocabulary, and ``candidate_sets`` is on."""
        return self.candidate_sets and (self.top_p < 1 or self.top_k > 0)


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    """'stop' (end-of-turn token, included in token_ids), 'length', 'repetition' (the
    confident-run stop rule), 'stop_sequence' (the caller's ``watch`` ended it) or 'abort'
    (engine paused)."""
    metrics: dict[str, float] = field(default_factory=dict)
    candidates: list[int] | None = None
    """Per token, the size k of the candidate set it was drawn from: the k tokens the policy
    ranked highest at that position, which is what top-k and top-p keep (k = 0: the whole
    vocabulary). None when nothing restricted the distribution (top_p = 1 and top_k = 0)."""
    top_logprobs: list[list[tuple[int, float]]] | None = None
    """Per token, the ``SamplingParams.top_logprobs`` most likely (token id, log-prob) of the
    distribution it was drawn from, most likely first; tokens top-k or top-p cut away are not
    listed. None when not asked for, or when the engine cannot give them (the vLLM engine)."""
    forced: bool = False
    """Tokens the policy did not sample: a distillation prefix's replayed turn (``Segment.forced``)."""
    routes: np.ndarray | None = None
    """A sparse model's routing (``rlonce.model.moe``): per position of the prompt and of the sampled
    tokens but the last (which was never run), the experts each sparse layer sent it to, as an
    unsigned (positions, layers, k) array. None for a dense model or an engine that cannot record it."""


class EngineError(RuntimeError):
    """The engine failed to serve a request (an infrastructure failure, not a model one)."""


class BackendError(RlonceError, RuntimeError):
    """A scale-out backend (Ray, vLLM) is missing, or its processes did not do what the run asked
    in time; the message says what to do. The CLI prints it as one line."""


class BackendMissing(BackendError, ImportError):
    """A backend's package is not installed."""


def candidate_size(top_logprobs: list[float], requested: int, top_k: int) -> int:
    """One position's candidate-set size from the ``requested`` highest log-probs of the processed
    distribution an engine returned for it (−inf outside the set, as vLLM's ``processed_logprobs``
    gives them): the number of finite ones, when that is the whole set — fewer than ``requested``
    are finite, or top-k caps the set within them. Otherwise 0: the size is not known, and the
    trainer normalises that token over the whole vocabulary."""
    finite = sum(1 for lp in top_logprobs if math.isfinite(lp))
    return finite if finite < requested or 0 < top_k <= requested else 0


def check_prompt(prompt_ids: list[int], sampling: SamplingParams, max_context: int) -> None:
    """Refuse an empty prompt, or one that leaves no room for ``max_tokens`` in the context."""
    if not prompt_ids:
        raise ValueError("prompt_ids is empty")
    if len(prompt_ids) + sampling.max_tokens > max_context:
        raise ValueError(f"prompt of {len(prompt_ids)} tokens + max_tokens {sampling.max_tokens} exceeds the "
                         f"model's context of {max_context}")


Watch = Callable[[int], bool]
"""Called with each token as it is sampled (from the engine's own thread, in order); returning
True ends the generation there, finish reason 'stop_sequence'. The gateway streams tokens and
checks stop sequences with it. It must be quick and thread-safe."""


def watch_after(gen: Generation, watch: Watch | None) -> Generation:
    """Apply ``watch`` to a generation that was sampled whole (an engine that cannot stream):
    every token reaches it, and the generation is cut where it asks to stop."""
    if watch is None:
        return gen
    for i, t in enumerate(gen.token_ids):
        if watch(t) and not (i == len(gen.token_ids) - 1 and gen.finish_reason == "stop"):
            n = i + 1
            return replace(gen, token_ids=gen.token_ids[:n], logprobs=gen.logprobs[:n], versions=gen.versions[:n],
                           finish_reason="stop_sequence",
                           candidates=None if gen.candidates is None else gen.candidates[:n],
                           top_logprobs=None if gen.top_logprobs is None else gen.top_logprobs[:n],
                           routes=None if gen.routes is None else gen.routes[:len(gen.routes) - len(gen.token_ids) + n])
    return gen


class Engine(Protocol):
    version: int

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, watch: Watch | None = None) -> Generation:
        ...

    def load_weights(self, state, version: int) -> None:
        """New weights, every later token stamped ``version``: a whole state dict, or (the torch
        engine, under LoRA) an adapter to merge in (``rlonce.model.lora.AdapterWeights``)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...
