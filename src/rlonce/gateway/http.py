"""The gateway over HTTP (FastAPI), for agents that can only be given a base URL and a key.

A session is addressed by path — ``/sessions/{id}/v1/chat/completions`` — or by the API key:
``Authorization: Bearer ID`` (OpenAI SDKs) or ``x-api-key: ID`` (Anthropic SDKs) on the plain
``/v1/...`` routes. Bodies are parsed here, not by FastAPI's validation, so every refusal —
malformed JSON, wrong types, unknown session, a body over ``max_body_bytes`` — is a 4xx in
the protocol's own error shape, and a refused request never touches the session. The
documented request schemas (``/openapi.json``) are what the fuzz tests generate from.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict

from rlonce.engine.base import EngineError
from rlonce.gateway.core import Gateway
from rlonce.gateway.messages import ProtocolError
from rlonce.gateway.protocols import PROTOCOLS


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


def make_app(gateway: Gateway, *, max_body_bytes: int = 4 << 20) -> FastAPI:
    app = FastAPI(title="rlonce gateway", version="1",
                  description="OpenAI Chat Completions, Anthropic Messages and OpenAI Responses over exact-token "
                              "sessions. Address a session by path (/sessions/{id}/v1/...) or by API key.")
    app.state.gateway = gateway

    async def serve(protocol: str, request: Request, session_id: str | None):
        proto = PROTOCOLS[protocol]
        try:
            if session_id is None:
                session_id = _key(request)
                if session_id is None:
                    raise ProtocolError("no API key: the key names the session (Authorization: Bearer ID "
                                        "or x-api-key: ID)", status=401, kind="authentication_error")
            size = request.headers.get("content-length")
            if size is not None and size.isdigit() and int(size) > max_body_bytes:
                raise ProtocolError(f"request body over {max_body_bytes} bytes", status=413,
                                    kind="request_too_large")
            raw = await request.body()
            if len(raw) > max_body_bytes:
                raise ProtocolError(f"request body over {max_body_bytes} bytes", status=413,
                                    kind="request_too_large")
            try:
                body = json.loads(raw, parse_constant=_reject_constant)
            except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
                raise ProtocolError(f"request body is not valid JSON: {e}") from None
            out = await gateway.call(protocol, body, session_id)
        except ProtocolError as e:
            return JSONResponse(proto.error(e), status_code=e.status)
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

    def _session(session_id: str):
        s = gateway.sessions.get(session_id)
        if s is None:
            return None, JSONResponse({"error": {"message": f"unknown session {session_id!r}", "type": "not_found",
                                                 "param": None, "code": None}}, status_code=404)
        return s, None

    @app.post("/sessions/{session_id}/reward")
    def reward(session_id: str, body: RewardBody):
        """Submit the episode's reward (an outside grader, or the harness itself)."""
        s, err = _session(session_id)
        if err:
            return err
        if not math.isfinite(body.reward):
            return JSONResponse({"error": {"message": "reward must be a finite number", "type": "invalid_request_error",
                                           "param": "reward", "code": None}}, status_code=400)
        s.reward = body.reward
        return {"session_id": session_id, "reward": s.reward}

    @app.get("/sessions/{session_id}/trajectory")
    def trajectory(session_id: str):
        """The recorded trajectory: contexts, segments with token ids, log-probs, policy versions, flags."""
        s, err = _session(session_id)
        return err or s.export()

    @app.get("/sessions/{session_id}/rerender")
    def rerender(session_id: str):
        """Where re-rendering each context through the chat template would differ from the recorded tokens."""
        s, err = _session(session_id)
        if err:
            return err
        if gateway.tokenizer is None:
            return JSONResponse({"error": {"message": "this gateway has no tokenizer to re-render with",
                                           "type": "invalid_request_error", "param": None, "code": None}},
                                status_code=400)
        from rlonce.gateway.fidelity import rerender_report

        return {"session_id": session_id, "contexts": rerender_report(s, gateway.tokenizer)}

    @app.get("/sessions")
    def sessions():
        return {"sessions": [{"id": s.id, "status": s.status, "turns": len(s.generations), "contexts": len(s.branches)}
                             for s in gateway.sessions.values()]}

    @app.get("/health")
    def health():
        return {"status": "ok", "sessions": len(gateway.sessions), "policy_version": gateway.engine.version}

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        msg = f"invalid request: {'.'.join(str(x) for x in first.get('loc', ()))}: {first.get('msg', 'bad value')}"
        return JSONResponse({"error": {"message": msg, "type": "invalid_request_error", "param": None, "code": None}},
                            status_code=400)

    return app


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


class ServerThread:
    """Serve an app on loopback from a background thread (for synchronous callers: tests,
    benchmarks). ``base_url`` is ``http://127.0.0.1:PORT``; ``stop()`` shuts it down."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0):
        import threading

        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                    access_log=False, lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> ServerThread:
        import time

        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway server did not start")
            time.sleep(0.01)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.base_url = f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class AsyncServer:
    """Serve an app on loopback inside the running event loop (``async with``), for callers
    that drive the engine from the same loop — ``rlonce eval --harness-cmd``."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                    access_log=False, lifespan="off"))

    async def __aenter__(self) -> AsyncServer:
        import asyncio

        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            if self.task.done():
                self.task.result()
                raise RuntimeError("the gateway server did not start")
            await asyncio.sleep(0.01)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.base_url = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.should_exit = True
        await self.task
