"""What a gateway and every session it opens share: the engine, the tokenizer's functions, the
chat format, sampling, budgets and the serving limits — one frozen ``GatewaySettings``, fixed
when the gateway is built (``rlonce.gateway.session`` re-exports both names)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from rlonce.engine.base import Engine, SamplingParams
from rlonce.model.chat import ChatFormat


@dataclass(frozen=True)
class Budgets:
    max_tokens_per_turn: int = 64
    """Per-turn output cap; a request may ask for less, never more."""
    max_context: int = 1024
    """Total trajectory budget of one context in tokens: prompt, observations and model turns."""
    max_prompt: int | None = None
    """Prompt budget: the most tokens a single request's prompt may hold (``None``: max_context)."""


@dataclass(frozen=True, kw_only=True)
class GatewaySettings:
    """What a gateway and every session it opens share, fixed when the gateway is built."""

    engine: Engine
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    fmt: ChatFormat
    sampling: SamplingParams
    """The run's sampling parameters; each turn's ``max_tokens`` comes from the budgets and the request."""
    budgets: Budgets = Budgets()
    """Each session's budgets, unless ``Gateway.open`` is given others."""
    model_name: str = "rlonce"
    """The model id replies carry when a request names none, and the one ``/v1/models`` lists."""
    auto_open: bool = False
    """Open a session on first use of an unknown id (``rlonce serve``); otherwise unknown
    ids are refused with 404 and sessions are opened by whoever runs the rollout."""
    honor_client_sampling: bool = False
    """Use a request's temperature/top_p and enforce the structured output it asks for (a JSON schema,
    a forced tool call: ``rlonce.gateway.structured``). Off in training: the run plan sets each
    source's sampling, and a training row holds one temperature (``TrainingRow.temperature``), so a
    client must not change the sampling distribution; a request that asks for a constraint is
    refused (the trainer's log-probs are over the whole vocabulary, a masked sample's are not)."""
    render_tools: bool = True
    """Render a request's tool schemas into a new context's system prompt."""
    max_sessions: int = 100_000
    """The most sessions open at once; past it, opening one sweeps expired sessions or is a 429."""
    idle_ttl: float | None = None
    """Drop a session unused for this many seconds (None: never)."""
    ended_ttl: float | None = None
    """Drop an ended (truncated or closed) session unused for this many seconds (None: never)."""
    model_timeout: float | None = None
    """Seconds one engine call may take (a paused turn's continuation included); past them the
    request fails with ``Expired(model_timeout)`` and no context changes (None: unbounded)."""
    tokenizer: Any = None
    """A Hugging Face tokenizer with the model's chat template, for the re-rendering report."""
    busy_wait: float = 0.0
    """Seconds a request may wait for its session's turn in flight to end (queued in arrival order,
    at most ``MAX_QUEUED`` at once) before it is refused with 409 and ``retry-after``. 0: refused at
    once (the trainer's gateways: a rollout's agent takes one turn at a time). ``rlonce serve``
    waits, for clients that send side requests in parallel on one key."""
    max_inflight: int | None = None
    """The most turns sampled at once; a request past it is refused as overloaded (429, Anthropic
    529) with ``retry-after``, the session untouched (None: no limit — the trainer's gateways)."""
    context_errors: bool = False
    """A prompt that does not fit the context is refused with the protocol's context-length error
    (``ContextLengthExceeded``: a 400 clients recognise and explain or compact), the session left
    as it was and the refusal counted as an event; a turn the context cuts short ends with
    'length' and the session stays open. ``rlonce serve`` turns it on. Off (training), such a
    request ends the session as ``truncated``: an outcome of the rollout, not a refusal."""
    offload: Executor | None = None
    """An executor for the sessions' rendering and tokenization (None: on the event loop). A
    served gateway needs one (``make_app`` parses bodies there too); a Ray harness pool gives
    each gateway one background thread, so its event loop keeps serving other sequences."""

    @classmethod
    def serving(cls, *, engine: Engine, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
                fmt: ChatFormat, model_name: str, max_tokens: int, max_context: int, offload: Executor,
                tokenizer: Any = None, session_ttl: float = 900.0, max_inflight: int | None = 64,
                busy_wait: float = 300.0) -> GatewaySettings:
        """What ``rlonce serve`` serves a model with (and the client tests serve a scripted one with):
        a session opened by any key on first use, the client's sampling and stop sequences honoured,
        context-length errors as the real APIs give them, unused sessions dropped after ``session_ttl``
        seconds (ended ones after at most 60)."""
        return cls(engine=engine, encode=encode, decode=decode, fmt=fmt, model_name=model_name,
                   sampling=SamplingParams(max_tokens=max_tokens), budgets=Budgets(max_tokens, max_context),
                   auto_open=True, honor_client_sampling=True, idle_ttl=session_ttl,
                   ended_ttl=min(session_ttl, 60.0), tokenizer=tokenizer, max_inflight=max_inflight,
                   busy_wait=busy_wait, context_errors=True, offload=offload)
