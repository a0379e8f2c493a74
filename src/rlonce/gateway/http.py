"""The gateway over HTTP (FastAPI), for agents that can only be given a base URL and a key.

Every client is treated as hostile (the policy under training may be the one calling). A
session is addressed by path — ``/sessions/{id}/v1/chat/completions`` — or, on the plain
``/v1/...`` routes, named by the API key (``Authorization: Bearer KEY`` from OpenAI SDKs,
``x-api-key: KEY`` from Anthropic's); either way the key must be the one that opened the
session (``Gateway.session_for``). The trajectory, reward, re-render and listing routes need
the admin key — the trainer's — given to ``make_app`` or generated there (``app.state.admin_key``).

Bodies are read here, not by FastAPI's validation: streamed with the size cap enforced while
reading (413 at the cap, the connection closed) and a deadline for the whole body (408), then
parsed and checked (``messages.loads``: depth, lone surrogates, non-finite numbers) on the
gateway's executor, where the session also renders and tokenizes — a 4 MiB prompt never
stalls the event loop that serves everyone else. Every refusal is a 4xx in the protocol's own
error shape, and a refused request never touches a session. The documented request schemas
(``/openapi.json``) are what the fuzz tests generate from. Header and idle timeouts belong to
the server (``rlonce.gateway.server``).
"""

from __future__ import annotations

import asyncio
import hmac
import math
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict
from starlette.requests import ClientDisconnect

from rlonce.engine.base import EngineError
from rlonce.gateway.core import Gateway
from rlonce.gateway.messages import MAX_DEPTH, ProtocolError, loads
from rlonce.gateway.protocols import PROTOCOLS
from rlonce.gateway.server import AsyncServer, ServerThread  # noqa: F401 - served from here too


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
             body_timeout: float = 30.0, admin_key: str | None = None) -> FastAPI:
    app = FastAPI(title="rlonce gateway", version="1",
                  description="OpenAI Chat Completions, Anthropic Messages and OpenAI Responses over exact-token "
                              "sessions. Address a session by path (/sessions/{id}/v1/...) or by API key; the key "
                              "that opened a session is the only one that reaches it.")
    app.state.gateway = gateway
    app.state.admin_key = admin = admin_key or secrets.token_urlsafe(32)
    if gateway.offload is None:  # rendering, tokenizing and body parsing off the event loop
        gateway.offload = ThreadPoolExecutor(4, thread_name_prefix="rlonce-gateway")

    async def read_json(request: Request):
        raw = await _read_body(request, max_body_bytes, body_timeout)
        return await asyncio.get_running_loop().run_in_executor(gateway.offload, loads, raw, "body", max_depth)

    async def serve(protocol: str, request: Request, session_id: str | None):
        proto = PROTOCOLS[protocol]
        try:
            key = _key(request)
            if key is None:
                raise ProtocolError("no API key: send the session's key (Authorization: Bearer KEY or x-api-key: "
                                    "KEY)", status=401, kind="authentication_error")
            body = await read_json(request)
            session = gateway.session_for(key, session_id)
            out = await gateway.call(protocol, body, session.id)
        except ProtocolError as e:
            close = {"connection": "close"} if e.status in (408, 413) else None  # stop reading what is left
            return JSONResponse(proto.error(e), status_code=e.status, headers=close)
        except EngineError as e:  # the system failed, not the request: retryable
            return JSONResponse(proto.error(ProtocolError(f"engine unavailable: {e}", status=503,
                                                          kind="api_error")), status_code=503)
        if isinstance(out, list):
            return StreamingResponse(iter(out), media_type="text/event-stream",
                                     headers={"cache-control": "no-cache"})
        return JSONResponse(out)

    def add(path: str, protocol: str, model: type[BaseModel]) -> None:
        extra = {"requestBody": {"required": True, "content": {
            "application/json": {"schema": model.model_json_schema(ref_template="#/components/schemas/{model}")}}}}

        async def plain(request: Request):
            return await serve(protocol, request, None)

        async def by_path(session_id: str, request: Request):
            return await serve(protocol, request, session_id)

        app.add_api_route(f"/v1/{path}", plain, methods=["POST"], openapi_extra=extra, name=f"{protocol} (by key)")
        app.add_api_route(f"/sessions/{{session_id}}/v1/{path}", by_path, methods=["POST"], openapi_extra=extra,
                          name=f"{protocol} (by path)")

    for path, (protocol, model) in ROUTES.items():
        add(path, protocol, model)

    def models() -> dict:
        return {"object": "list", "data": [{"id": gateway.model_name, "object": "model", "created": 0,
                                            "owned_by": "rlonce", "type": "model", "display_name": gateway.model_name}]}

    app.add_api_route("/v1/models", models, methods=["GET"])
    app.add_api_route("/sessions/{session_id}/v1/models", lambda session_id: models(), methods=["GET"])
    _admin_routes(app, gateway, admin, read_json)

    @app.get("/health")
    def health():
        return {"status": "ok", "sessions": len(gateway.sessions), "policy_version": gateway.engine.version}

    @app.exception_handler(ProtocolError)
    async def _refused(request: Request, exc: ProtocolError):
        return JSONResponse(PROTOCOLS["openai-chat"].error(exc), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        msg = f"invalid request: {'.'.join(str(x) for x in first.get('loc', ()))}: {first.get('msg', 'bad value')}"
        return JSONResponse({"error": {"message": msg, "type": "invalid_request_error", "param": None, "code": None}},
                            status_code=400)

    return app


def _admin_routes(app: FastAPI, gateway: Gateway, admin: str, read_json) -> None:
    """The trainer's routes: a session's trajectory, its reward, its re-rendering, the list."""

    async def require_admin(request: Request) -> None:
        key = _key(request)
        if key is None or not hmac.compare_digest(key.encode(), admin.encode()):
            raise ProtocolError("this route needs the gateway's admin key (Authorization: Bearer ADMIN_KEY); "
                                "`rlonce serve` writes it to its admin key file", status=401,
                                kind="authentication_error")

    admin_only = [Depends(require_admin)]

    def _session(session_id: str):
        s = gateway.sessions.get(session_id)
        if s is None:
            raise ProtocolError(f"unknown session {session_id!r}", status=404, kind="not_found")
        return s

    reward_schema = {"requestBody": {"required": True, "content": {"application/json": {
        "schema": RewardBody.model_json_schema()}}}}

    @app.post("/sessions/{session_id}/reward", dependencies=admin_only, openapi_extra=reward_schema)
    async def reward(session_id: str, request: Request):
        """Submit the episode's reward (the trainer or an outside grader, with the admin key)."""
        body = await read_json(request)
        value = body.get("reward") if isinstance(body, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ProtocolError("'reward' must be a finite number, as in {\"reward\": 1.0}", param="reward")
        s = _session(session_id)
        s.reward = float(value)
        return {"session_id": session_id, "reward": s.reward}

    @app.get("/sessions/{session_id}/trajectory", dependencies=admin_only)
    def trajectory(session_id: str):
        """The recorded trajectory: contexts, segments with token ids, log-probs, policy versions, flags."""
        return _session(session_id).export()

    @app.get("/sessions/{session_id}/rerender", dependencies=admin_only)
    def rerender(session_id: str):
        """Where re-rendering each context through the chat template would differ from the recorded tokens."""
        s = _session(session_id)
        if gateway.tokenizer is None:
            raise ProtocolError("this gateway has no tokenizer to re-render with")
        from rlonce.gateway.fidelity import rerender_report

        return {"session_id": session_id, "contexts": rerender_report(s, gateway.tokenizer)}

    @app.get("/sessions", dependencies=admin_only)
    def sessions():
        return {"sessions": [{"id": s.id, "status": s.status, "turns": len(s.generations), "contexts": len(s.branches)}
                             for s in list(gateway.sessions.values())]}
