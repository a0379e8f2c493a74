"""The gateway's protocol-neutral conversation: what every wire protocol is translated into.

OpenAI Chat Completions, Anthropic Messages and OpenAI Responses all describe the same thing —
a system prompt, user turns, assistant turns that may call tools, tool results — in three
shapes. The adapters in ``rlonce.gateway.protocols`` (each an ``Adapter``) turn a request into a
``ChatRequest`` of ``Message``s and a ``Turn`` back into the protocol's reply; the session only
ever compares and encodes ``Message``s.

``check_json`` is the gate every client-supplied JSON value passes (request bodies over HTTP,
tool-call arguments sent as strings): bounded nesting, no lone UTF-16 surrogates (they cannot
be encoded to UTF-8, so the tokenizer would fail on them), no infinities (``1e400`` parses as
``inf``, which no reply may carry). Each is a 400 naming where it was found. Sampling values
and output caps are bounded too (``LIMITS``, ``MAX_TOKENS``: ``request_fields``,
``max_tokens_of``), so that an absurd one is a 400 naming the field and its range, never an
engine failure or a non-finite number echoed back.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from rlonce.engine.base import Constraint, Generation
from rlonce.model.chat import ToolCall


class ProtocolError(ValueError):
    """A request the gateway refuses; rendered as a 4xx in the protocol's own error shape."""

    def __init__(self, message: str, *, status: int = 400, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, retry_after: float | None = None,
                 details: dict | None = None):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.param = param
        self.code = code
        """OpenAI's machine-readable ``error.code`` (``context_length_exceeded``, …), when there is one."""
        self.retry_after = retry_after
        """Seconds a client should wait before retrying (the ``retry-after`` header of a 429/529)."""
        self.details = details
        """Anthropic's ``error.details`` (``{"error_code": "thread_unsupported_request"}``, …): what an
        SDK branches on to recover, when there is one."""


class Overloaded(ProtocolError):
    """The engine is saturated (``GatewaySettings.max_inflight`` turns in flight): retry later.
    OpenAI answers 429 ``rate_limit_exceeded``, Anthropic 529 ``overloaded_error``."""

    def __init__(self, inflight: int, retry_after: float = 1.0):
        super().__init__(f"the model is overloaded ({inflight} requests in flight): retry after {retry_after:g} s",
                         status=429, kind="rate_limit_error", code="rate_limit_exceeded", retry_after=retry_after)


class ContextLengthExceeded(ProtocolError):
    """The request's prompt does not fit the model's context: each protocol answers it with the
    error its real API gives (Anthropic "prompt is too long: N tokens > M maximum"; OpenAI
    ``context_length_exceeded``), which agent clients recognise and explain or compact."""

    def __init__(self, tokens: int, limit: int):
        super().__init__(f"prompt is too long: {tokens} tokens > {limit} maximum", code="context_length_exceeded",
                         param="messages")
        self.tokens = tokens
        self.limit = limit


@dataclass(frozen=True)
class Message:
    """One message of a dialogue. ``role`` is system, user, assistant or tool."""

    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    reasoning: str = ""
    """An assistant turn's reasoning (thinking blocks, reasoning items, ``reasoning_content``)."""

    def same_as(self, other: Message) -> bool:
        """Equal for prefix matching: ids and surrounding whitespace do not count, arguments
        compare as JSON values (clients re-serialise them with their own spacing), and so does
        reasoning: a client that drops or summarises it has rewritten the turn."""
        return (self.role == other.role and self.content.strip() == other.content.strip()
                and self.reasoning.strip() == other.reasoning.strip()
                and [(c.name, c.arguments) for c in self.tool_calls]
                == [(c.name, c.arguments) for c in other.tool_calls])

    def differs_only_in_reasoning(self, other: Message) -> bool:
        return self.role == other.role == "assistant" and not self.same_as(other) and \
            Message("assistant", self.content, self.tool_calls).same_as(Message("assistant", other.content,
                                                                                other.tool_calls))


@dataclass(frozen=True)
class Structure:
    """What a request asks its reply to be beyond free text, in protocol-neutral terms: a JSON
    document matching ``schema`` (Chat ``response_format``, Responses ``text.format``, Anthropic
    ``output_config.format``) and how it may call tools (``tool_choice``). ``rlonce.gateway.structured``
    parses it and turns it into the engine's ``Constraint``."""

    schema: dict | None = None
    """The JSON schema the reply must match (``json_object``: any object); None: free text."""
    schema_field: str = ""
    """Where the request gave the schema (``response_format.json_schema.schema``), for a refusal."""
    strict: bool = False
    """The schema is enforced exactly and a keyword the grammar engine does not implement is a 400;
    not strict, such keywords are ignored and the rest enforced."""
    tool_choice: str = "auto"
    """``auto`` (free text or calls), ``none`` (no call), ``required`` (one call of any offered
    tool: OpenAI ``required``, Anthropic ``any``) or ``named`` (one call of ``tool``)."""
    tool: str | None = None
    """The tool a ``named`` choice names."""
    allowed: tuple[str, ...] = ()
    """The tools a forced call may call (all offered ones for ``required``, the named one)."""
    strict_tools: tuple[tuple[str, str], ...] = ()
    """(name, where its schema was given) of the tools marked strict, whose schemas a forced call
    enforces exactly (a keyword it cannot enforce is a 400 naming the field)."""

    @property
    def forced(self) -> bool:
        return self.tool_choice in ("required", "named")

    @property
    def constrained(self) -> bool:
        """Whether the reply would be sampled under a constraint (``none`` only masks a tool call out)."""
        return self.schema is not None or self.forced


@dataclass
class ChatRequest:
    messages: list[Message]
    tools: list[dict] = field(default_factory=list)
    """Function tools as ``{"name", "description", "parameters"}``."""
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    model: str = ""
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    """Stop sequences: the turn ends where its text first contains one (not included)."""
    logprobs: bool = False
    """Return each sampled token's log-prob (Chat ``logprobs``, Responses ``include``)."""
    top_logprobs: int = 0
    """With ``logprobs``: how many of the most likely tokens to list at each position (at most
    ``MAX_TOP_LOGPROBS``)."""
    edit_trigger: EditTrigger | None = None
    """The server-side context edit the request asks for that would change its conversation once
    the prompt reaches a size (``rlonce.gateway.stateful``): the gateway applies none, so the
    session refuses such a prompt."""
    structure: Structure = field(default_factory=Structure)
    """The reply's required shape (JSON schema, tool choice), as the request asked."""
    constraint: Constraint | None = None
    """What the engine enforces for ``structure``, set by the gateway once it accepts the request
    (``rlonce.gateway.structured.accept``)."""


@dataclass(frozen=True)
class EditTrigger:
    """A server-side context edit (Anthropic ``context_management``, Responses ``context_management``)
    that changes nothing below ``tokens`` prompt tokens and would rewrite the conversation from there."""

    tokens: int
    field: str
    """Where the request asked for it (``context_management.edits[0]``), for the refusal."""
    what: str
    """What the edit would do (``clear old tool results``)."""


@dataclass
class CallOut:
    """A tool call as returned to the client, with the id the gateway gave it."""

    id: str
    name: str
    arguments: dict

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass
class Turn:
    """One sampled assistant turn as the client sees it."""

    content: str
    calls: list[CallOut]
    finish: str
    """'stop', 'tool_calls' or 'length' (the token cap, or a trajectory budget, ended it)."""
    prompt_tokens: int
    completion_tokens: int
    session_id: str = ""
    turn_index: int = 0
    stop_sequence: str | None = None
    """The request's stop sequence that ended the turn (cut from the content), if one did."""
    reasoning: str = ""
    """The turn's reasoning, split from its content by the chat format's markup."""
    dialogue: list[Message] = field(default_factory=list)
    """The dialogue after this turn as the session recorded it (the model's turn included when
    one was sampled): what a later request continues by response id."""
    reasoning_tokens: int = 0
    """How many of the sampled tokens the reasoning took, its markup included (``reasoning_tokens``)."""
    logprobs: list[TokenLogprob] | None = None
    """Every sampled token of the turn with its recorded log-prob, when the request asked for them."""


@dataclass(frozen=True)
class TokenLogprob:
    """One sampled token as a client sees it: its text, the log-prob the session recorded for it
    (of the distribution it was drawn from), and the most likely tokens at its position as
    (text, log-prob) pairs."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


def token_logprobs(gen: Generation, decode: Callable[[list[int]], str], top_n: int) -> list[TokenLogprob]:
    """The turn's tokens with their recorded log-probs and, when ``top_n`` > 0, the engine's
    ``top_n`` most likely tokens per position; an engine that gives none (scripted, vLLM) lists the
    sampled token alone. Each token's text is its own decoding (a token holding part of a UTF-8
    character decodes to U+FFFD)."""
    text: dict[int, str] = {}

    def piece(t: int) -> str:
        if t not in text:
            text[t] = decode([t])
        return text[t]

    tops = gen.top_logprobs if top_n else None
    out = []
    for i, (t, lp) in enumerate(zip(gen.token_ids, gen.logprobs)):
        alts = tops[i][:top_n] if tops is not None else ([(t, lp)] if top_n else [])
        out.append(TokenLogprob(piece(t), lp, tuple((piece(a), v) for a, v in alts)))
    return out


class Adapter(Protocol):
    """One wire protocol: a request body into a ``ChatRequest``, a sampled ``Turn`` into the
    reply body (``answer``) or, when the request streams, a ``TurnStream`` that emits the
    server-sent events as the turn is sampled (``streamer``), a refusal into the protocol's
    error shape. ``history`` is the session's store of earlier responses by id: a
    protocol that chains responses (Responses' ``previous_response_id``) reads it in ``parse``
    and adds to it in ``answer`` (or its stream's ``record``); the others carry the whole
    dialogue in every request."""

    @property
    def name(self) -> str: ...

    def parse(self, body, history: dict[str, list[Message]] | None = None) -> ChatRequest: ...

    def answer(self, turn: Turn, req: ChatRequest, body: dict, history: dict[str, list[Message]]) -> dict: ...

    def streamer(self, req: ChatRequest, body: dict, history: dict[str, list[Message]]):
        """A ``rlonce.gateway.streams.TurnStream``: the SSE events of a streamed reply, as the turn is sampled."""

    def error(self, e: ProtocolError) -> dict: ...


LIMITS = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0)}
"""Accepted ranges of client sampling values (OpenAI's; Anthropic's are narrower)."""
MAX_TOKENS = 1 << 20
"""The largest per-request output cap accepted (the session's own cap still applies)."""
MAX_TOP_LOGPROBS = 20
"""The most alternatives per token a request may ask for (OpenAI's limit)."""
MAX_DEPTH = 64
"""The deepest nesting of arrays and objects a request may hold (tool schemas need ~10)."""


def check_json(value, where: str = "body", max_depth: int = MAX_DEPTH) -> None:
    """Refuse nesting deeper than ``max_depth``, strings with lone surrogates and non-finite
    numbers anywhere in ``value`` (iteratively: a deep value cannot exhaust the stack here)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > max_depth:
                raise ProtocolError(f"{where} is nested deeper than {max_depth} levels: flatten it", param=where)
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, x in items:
                if isinstance(k, str):
                    _check_text(k, where)
                stack.append((x, depth + 1))
        elif isinstance(v, str):
            _check_text(v, where)
        elif isinstance(v, float) and not math.isfinite(v):
            raise ProtocolError(f"{where} holds a number out of range ({v}): send finite numbers", param=where)


def _check_text(s: str, where: str) -> None:
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise ProtocolError(f"{where} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape): "
                                "send valid Unicode", param=where) from None


def loads(raw: str | bytes, where: str = "body", max_depth: int = MAX_DEPTH):
    """Parse client JSON and ``check_json`` it; anything wrong is a ``ProtocolError`` (400)."""
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise ProtocolError(f"{where} is nested deeper than {max_depth} levels: flatten it", param=where) from None
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
        raise ProtocolError(f"{where} is not valid JSON: {e}", param=where) from None
    check_json(value, where, max_depth)
    return value


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def parse_arguments(raw, where: str) -> dict:
    """Tool-call arguments arrive as a JSON string (OpenAI) or an object (Anthropic)."""
    if isinstance(raw, dict):
        check_json(raw, where)
        return raw
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        value = loads(raw, f"{where} arguments")
        if isinstance(value, dict):
            return value
    raise ProtocolError(f"{where}: arguments must be a JSON object", param=where)


def text_of(content, where: str) -> str:
    """A message's text: a string, or a list of text parts (``text``/``input_text``/``output_text``)
    joined by newlines, as vLLM's OpenAI server joins them."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, p in enumerate(content):
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append(p["text"])
            elif isinstance(p, dict) and isinstance(p.get("type"), str):
                continue  # images, files, thinking: not rendered by a text-only chat template
            else:
                raise ProtocolError(f"{where}[{i}] is not a content part", param=where)
        return "\n".join(parts)
    raise ProtocolError(f"{where} must be a string or a list of content parts", param=where)


def max_tokens_of(body: dict, *keys: str) -> int | None:
    """The output cap under the first of ``keys`` the body holds, from 1 to ``MAX_TOKENS``."""
    for k in keys:
        v = body.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_TOKENS:
            raise ProtocolError(f"'{k}' must be an integer from 1 to {MAX_TOKENS}", param=k)
        return v
    return None


def _opt_float(body: dict, key: str) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    lo, hi = LIMITS[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:  # NaN fails too
        raise ProtocolError(f"'{key}' must be a number from {lo:g} to {hi:g}", param=key)
    return float(v)


MAX_STOP = 16
"""The most stop sequences a request may give (OpenAI allows 4, Anthropic more)."""


def stops_of(body: dict, key: str) -> tuple[str, ...]:
    """Stop sequences under ``key``: a string or an array of non-empty strings."""
    v = body.get(key)
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if (not isinstance(v, list) or len(v) > MAX_STOP
            or not all(isinstance(x, str) and 0 < len(x) <= 256 for x in v)):
        raise ProtocolError(f"'{key}' must be a string or an array of at most {MAX_STOP} non-empty strings",
                            param=key)
    return tuple(v)


def top_k_of(body: dict) -> int | None:
    v = body.get("top_k")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOKENS:
        raise ProtocolError("'top_k' must be a non-negative integer", param="top_k")
    return v


def top_logprobs_of(body: dict) -> int:
    v = body.get("top_logprobs")
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOP_LOGPROBS:
        raise ProtocolError(f"'top_logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS}", param="top_logprobs")
    return v


def request_fields(body: dict) -> dict:
    """The ``ChatRequest`` fields every protocol names alike: stream, model, temperature, top_p."""
    stream = body.get("stream")
    stream = False if stream is None else stream  # null is the default, as the APIs document
    if not isinstance(stream, bool):
        raise ProtocolError("'stream' must be a boolean", param="stream")
    model = body.get("model", "")
    if not isinstance(model, str):
        raise ProtocolError("'model' must be a string", param="model")
    return {"stream": stream, "model": model, "temperature": _opt_float(body, "temperature"),
            "top_p": _opt_float(body, "top_p")}
