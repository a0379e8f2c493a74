"""The gateway over HTTP (FastAPI), for agents that can only be given a base URL and a key.

Every client is treated as hostile (the policy under training may be the one calling). A
session is addressed by path — ``/sessions/{id}/v1/chat/completions`` — or, on the plain
``/v1/...`` routes, named by the API key (``Authorization: Bearer KEY`` from OpenAI SDKs,
``x-api-key: KEY`` from Anthropic's); either way the key must be the one that opened the
session (``Gateway.session_for``). The trajectory, reward, re-render and listing routes need
the admin key — the trainer's — given to ``make_app`` or generated there (``app.state.admin_key``).
``/v1/completions`` only scores prompts of token ids, vLLM's way (``rlonce.gateway.scoring``): what
an endpoint teacher asks of a served model; it opens no session.

Bodies are read here, not by FastAPI's validation: streamed with the size cap enforced while
reading (413 at the cap, the connection closed) and a deadline for the whole body (408), then
parsed and checked (``messages.loads``: depth, lone surrogates, non-finite numbers) on the
gateway's executor, where the session also renders and tokenizes — a 4 MiB prompt never
stalls the event loop that serves everyone else. Every refusal is a 4xx in the protocol's own
error shape, and a refused request never touches a session. The documented request schemas
(``/openapi.json``) are what the fuzz tests generate from. Header and idle timeouts belong to
the server (``rlonce.gateway.server``).

``make_app`` only assembles: the routes are the module's functions below it, which reach the
gateway, the admin key and the body limits through ``request.app.state``, and every refusal's
body comes from ``error_response``.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from rlonce.core.timeouts import Expired
from rlonce.engine.base import EngineError
from rlonce.gateway import scoring
from rlonce.gateway.core import Gateway
from rlonce.gateway.messages import MAX_DEPTH, Overloaded, ProtocolError, loads
from rlonce.gateway.protocols import PROTOCOLS
from rlonce.gateway.server import MAX_HEAD_BYTES, AsyncServer, ServerThread  # noqa: F401 - served from here too
from rlonce.gateway.session import Session, SessionClosed


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ChatCompletionBody(_Open):
    model: str = ""
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False


class MessagesBody(_Open):
    model: str = ""
    system: str | list[dict[str, Any]] | None = None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    stream: bool = False


class ResponsesBody(_Open):
    model: str = ""
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    temperature: float | None = None
    stream: bool = False


class CompletionBody(_Open):
    """A scoring request (``rlonce.gateway.scoring``): the only completions request served."""

    model: str = ""
    prompt: list[int]
    max_tokens: int
    prompt_logprobs: int
    temperature: float | None = None


class RewardBody(BaseModel):
    reward: float


ROUTES = {"chat/completions": ("openai-chat", ChatCompletionBody), "messages": ("anthropic-messages", MessagesBody),
          "responses": ("openai-responses", ResponsesBody)}


def _key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer ") and auth[7:].strip():
        return auth[7:].strip()
    return request.headers.get("x-api-key") or None


async def _read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The request body, read as it arrives: 413 as soon as it passes ``limit`` bytes, 408 if
    it has not all arrived within ``timeout`` seconds."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise ProtocolError(f"request body over {limit} bytes: send a smaller request", status=413,
                            kind="request_too_large")
    buf = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                buf += chunk
                if len(buf) > limit:
                    raise ProtocolError(f"request body over {limit} bytes: send a smaller request", status=413,
                                        kind="request_too_large")
    except TimeoutError:
        raise ProtocolError(f"request body not received within {timeout:g} s: send it at once", status=408,
                            kind="timeout_error") from None
    except ClientDisconnect:
        raise ProtocolError("the client disconnected before sending the whole body") from None
    return bytes(buf)


def load_admin_key(path: str | Path) -> str:
    """The admin key kept in ``path``; a new random one is written there first (mode 0600)
    when the file does not exist."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_text().strip()
        if not key:
            raise ValueError(f"the admin key file {path} is empty: delete it to have a new key made") from None
        return key
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()


def make_app(gateway: Gateway, *, max_body_bytes: int = 4 << 20, max_depth: int = MAX_DEPTH,
             body_timeout: float = 30.0, admin_key: str | None = None, api_keys: list[str] | None = None) -> FastAPI:
    """The gateway's routes over FastAPI. The gateway must have an executor
    (``GatewaySettings.offload``): request bodies are parsed there and its sessions render and
    tokenize there, so nothing slow runs on the event loop. With ``api_keys`` only a request
    carrying one of them reaches a session (401 otherwise): what serving beyond loopback needs."""
    if gateway.settings.offload is None:
        raise ValueError("a served gateway renders and tokenizes off the event loop: build it with "
                         "GatewaySettings(offload=ThreadPoolExecutor(...))")
    app = FastAPI(title="rlonce gateway", version="1",
                  description="OpenAI Chat Completions, Anthropic Messages and OpenAI Responses over exact-token "
                              "sessions. Address a session by path (/sessions/{id}/v1/...) or by API key; the key "
                              "that opened a session is the only one that reaches it.")
    app.state.gateway = gateway
    app.state.admin_key = admin_key or secrets.token_urlsafe(32)
    app.state.body = BodyLimits(max_body_bytes, body_timeout, max_depth)
    app.state.api_keys = [k.encode() for k in api_keys] if api_keys else None
    app.state.scoring = threading.Lock()
    """One prompt-scoring forward at a time (``completions``): its vocabulary-wide logits are large."""
    for path, (protocol, model) in ROUTES.items():
        extra = _body_schema(model)
        app.add_api_route(f"/v1/{path}", by_key, methods=["POST"], openapi_extra=extra, name=f"{protocol} (by key)")
        app.add_api_route(f"/sessions/{{session_id}}/v1/{path}", by_path, methods=["POST"], openapi_extra=extra,
                          name=f"{protocol} (by path)")
    app.add_api_route("/v1/completions", completions, methods=["POST"], openapi_extra=_body_schema(CompletionBody),
                      name="prompt scoring (vLLM's prompt_logprobs)")
    for path in ("/v1/messages/count_tokens", "/sessions/{session_id}/v1/messages/count_tokens"):
        app.add_api_route(path, count_tokens, methods=["POST"], openapi_extra=_body_schema(MessagesBody),
                          name="Anthropic token count")
    app.add_api_route("/v1/models", models, methods=["GET"])
    app.add_api_route("/sessions/{session_id}/v1/models", session_models, methods=["GET"])
    app.include_router(admin)
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/", health, methods=["GET", "HEAD"], include_in_schema=False)  # clients' connectivity checks
    app.add_exception_handler(ProtocolError, _refused)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(HTTPException, _no_route)
    app.add_middleware(HeadCap)
    return app


class HeadCap:
    """431 for a request whose line and headers together pass ``MAX_HEAD_BYTES``. The server's h11
    bound holds only while a head is still arriving; a head that arrives whole in one read is
    measured here, before any route (or session) sees it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            size = (len(scope["method"]) + len(scope.get("raw_path") or scope["path"].encode())
                    + len(scope.get("query_string", b"")) + sum(len(k) + len(v) + 4 for k, v in scope["headers"]))
            if size > MAX_HEAD_BYTES:
                protocol = "anthropic-messages" if any(k == b"anthropic-version" for k, _ in scope["headers"]) \
                    else "openai-chat"
                e = ProtocolError(f"request line and headers of {size} bytes, over the {MAX_HEAD_BYTES}-byte cap: "
                                  "send smaller headers", status=431)
                await error_response(e, protocol, close=True)(scope, receive, send)
                return
        await self.app(scope, receive, send)


@dataclass(frozen=True)
class BodyLimits:
    max_bytes: int
    """The largest body accepted (413 past it)."""
    timeout: float
    """Seconds the whole body has to arrive (408 past them)."""
    max_depth: int
    """The deepest nesting of arrays and objects accepted (400 past it)."""


def _body_schema(model: type[BaseModel]) -> dict:
    """The documented request body (``/openapi.json``): what the fuzz tests generate from."""
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": model.model_json_schema(ref_template="#/components/schemas/{model}")}}}}


def error_response(e: ProtocolError, protocol: str = "openai-chat", *, close: bool = False) -> JSONResponse:
    """A refusal as its status and the protocol's error body; ``close`` ends the connection
    instead of reading the rest of a body that was refused unread. An overloaded engine is a 529
    for Anthropic clients (their API's status for it), a 429 for OpenAI's, with ``retry-after``."""
    headers = {"connection": "close"} if close else {}
    if e.retry_after is not None:
        headers["retry-after"] = f"{e.retry_after:g}"
    if isinstance(e, SessionClosed):  # the SDKs retry a 409 unless told: this one never succeeds
        headers["x-should-retry"] = "false"
    status = 529 if isinstance(e, Overloaded) and protocol == "anthropic-messages" else e.status
    return JSONResponse(PROTOCOLS[protocol].error(e), status_code=status, headers=headers or None)


async def _refused(request: Request, exc: ProtocolError) -> JSONResponse:
    """A refusal raised outside the protocol routes (the admin key, the trainer's routes)."""
    return error_response(exc)


async def _no_route(request: Request, exc: HTTPException) -> JSONResponse:
    """An unknown path or method (404, 405), in the error shape of the client's protocol."""
    protocol = "anthropic-messages" if "anthropic-version" in request.headers else "openai-chat"
    msg = (f"{request.method} {request.url.path}: {exc.detail}; this gateway serves POST /v1/chat/completions, "
           "/v1/messages, /v1/messages/count_tokens and /v1/responses (also under /sessions/ID), /v1/completions "
           "(prompt scoring), GET /v1/models")
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    out = error_response(ProtocolError(msg, status=exc.status_code, kind=kind), protocol)
    out.headers.update(exc.headers or {})
    return out


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    msg = f"invalid request: {'.'.join(str(x) for x in first.get('loc', ()))}: {first.get('msg', 'bad value')}"
    return error_response(ProtocolError(msg))


INLINE_BODY = 16 << 10
"""Bodies up to this size are parsed on the event loop (microseconds); larger ones on the executor."""


async def read_json(request: Request):
    """The request's JSON body, read within the app's ``BodyLimits`` and checked — on the executor
    unless it is small enough that the hop would cost more than the parse (a streamed reply's
    first token waits for it)."""
    limits: BodyLimits = request.app.state.body
    raw = await _read_body(request, limits.max_bytes, limits.timeout)
    if len(raw) <= INLINE_BODY:
        return loads(raw, "body", limits.max_depth)
    return await asyncio.get_running_loop().run_in_executor(
        request.app.state.gateway.settings.offload, loads, raw, "body", limits.max_depth)


# ---- the protocol routes -------------------------------------------------------------------

PROTOCOL_AT = {route: protocol for path, (protocol, _) in ROUTES.items()
               for route in (f"/v1/{path}", f"/sessions/{{session_id}}/v1/{path}")}
"""The protocol each route path speaks."""


async def by_key(request: Request):  # the session its API key names
    return await _serve(request, None)


async def by_path(session_id: str, request: Request):  # the session its path names (the key must own it)
    return await _serve(request, session_id)


def _client_key(request: Request) -> str:
    """The request's API key, if the gateway accepts it (401 otherwise)."""
    key = _key(request)
    if key is None:
        raise ProtocolError("no API key: send the session's key (Authorization: Bearer KEY or x-api-key: "
                            "KEY)", status=401, kind="authentication_error")
    allowed = request.app.state.api_keys
    if allowed is not None and not any(hmac.compare_digest(key.encode(), k) for k in allowed):
        raise ProtocolError("invalid API key: send one of the keys this gateway was started with (--api-key)",
                            status=401, kind="authentication_error")
    return key


async def _serve(request: Request, session_id: str | None):
    gateway: Gateway = request.app.state.gateway
    protocol = PROTOCOL_AT[request.scope["route"].path]
    try:
        key = _client_key(request)
        body = await read_json(request)
        out = await gateway.call(protocol, body, session_id, key=key)
    except ProtocolError as e:
        return error_response(e, protocol, close=e.status in (408, 413))  # stop reading what is left
    except EngineError as e:  # the system failed, not the request: retryable
        return error_response(ProtocolError(f"engine unavailable: {e}", status=503, kind="api_error"), protocol)
    except Expired as e:  # the model request outlived gateway.settings.model_timeout; the session records it
        return error_response(ProtocolError(f"the model did not answer in time ({e})", status=504,
                                            kind="timeout_error"), protocol)
    if not isinstance(out, dict):  # a streamed turn: its events as they are sampled
        return StreamingResponse(out, media_type="text/event-stream", headers={"cache-control": "no-cache"})
    return JSONResponse(out)


async def count_tokens(request: Request):
    """Anthropic's token count (Claude Code asks it to size its context): ``{"input_tokens": N}``
    for a Messages body, rendered off the event loop; no session is read or opened."""
    gateway: Gateway = request.app.state.gateway
    try:
        _client_key(request)
        body = await read_json(request)
        out = await asyncio.get_running_loop().run_in_executor(gateway.settings.offload, gateway.count_tokens, body)
    except ProtocolError as e:
        return error_response(e, "anthropic-messages", close=e.status in (408, 413))
    return JSONResponse(out)


async def completions(request: Request):
    """vLLM's prompt log-probs for a prompt of token ids (``rlonce.gateway.scoring``: what an endpoint
    teacher asks), one forward at a time on a worker thread; any other completions request is a 400."""
    gateway: Gateway = request.app.state.gateway
    try:
        _client_key(request)
        body = await read_json(request)
        model = getattr(gateway.settings.engine, "model", None)
        if model is None:
            raise ProtocolError("this gateway's engine has no model to score prompts with")
        ids, k = scoring.scoring_request(body, vocab=scoring.vocabulary(model),
                                         max_context=gateway.settings.budgets.max_context)
        entries = await asyncio.to_thread(_locked, request.app.state.scoring, scoring.prompt_logprobs, model, ids, k,
                                          gateway.settings.decode)
    except ProtocolError as e:
        return error_response(e, close=e.status in (408, 413))
    except ArithmeticError as e:  # the model failed, not the request
        return error_response(ProtocolError(f"engine unavailable: {e}", status=503, kind="api_error"))
    return JSONResponse(scoring.completion_reply(ids, entries, gateway.settings.model_name))


def _locked(lock: threading.Lock, fn, *args):
    with lock:
        return fn(*args)


def models(request: Request) -> dict:
    name = request.app.state.gateway.settings.model_name
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "rlonce",
                                        "type": "model", "display_name": name}]}


def session_models(session_id: str, request: Request):
    return models(request)


def health(request: Request):
    gateway: Gateway = request.app.state.gateway
    return {"status": "ok", "sessions": len(gateway.sessions), "policy_version": gateway.settings.engine.version}


# ---- the trainer's routes: a session's trajectory, its reward, its re-rendering, the list -----

async def require_admin(request: Request) -> None:
    key = _key(request)
    if key is None or not hmac.compare_digest(key.encode(), request.app.state.admin_key.encode()):
        raise ProtocolError("this route needs the gateway's admin key (Authorization: Bearer ADMIN_KEY); "
                            "`rlonce serve` writes it to its admin key file", status=401, kind="authentication_error")


admin = APIRouter(dependencies=[Depends(require_admin)])


def _session(request: Request, session_id: str) -> Session:
    s = request.app.state.gateway.sessions.get(session_id)
    if s is None:
        raise ProtocolError(f"unknown session {session_id!r}", status=404, kind="not_found")
    return s


@admin.post("/sessions/{session_id}/reward", openapi_extra=_body_schema(RewardBody))
async def reward(session_id: str, request: Request):
    """Submit the episode's reward (the trainer or an outside grader, with the admin key)."""
    body = await read_json(request)
    value = body.get("reward") if isinstance(body, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProtocolError("'reward' must be a finite number, as in {\"reward\": 1.0}", param="reward")
    s = _session(request, session_id)
    s.reward = float(value)
    return {"session_id": session_id, "reward": s.reward}


@admin.get("/sessions/{session_id}/trajectory")
def trajectory(session_id: str, request: Request):
    """The recorded trajectory: contexts, segments with token ids, log-probs, policy versions, flags."""
    return _session(request, session_id).export()


@admin.get("/sessions/{session_id}/rerender")
def rerender(session_id: str, request: Request):
    """Where re-rendering each context through the chat template would differ from the recorded tokens."""
    s = _session(request, session_id)
    tokenizer = request.app.state.gateway.settings.tokenizer
    if tokenizer is None:
        raise ProtocolError("this gateway has no tokenizer to re-render with")
    from rlonce.gateway.fidelity import rerender_report

    return {"session_id": session_id, "contexts": rerender_report(s, tokenizer)}


@admin.get("/sessions")
def sessions(request: Request):
    return {"sessions": [{"id": s.id, "status": s.status, "turns": len(s.generations), "contexts": len(s.branches)}
                         for s in list(request.app.state.gateway.sessions.values())]}
