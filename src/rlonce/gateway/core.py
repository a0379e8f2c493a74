"""The gateway: sessions addressed by id, one engine behind them, three wire protocols in front.

``Gateway.call`` is the in-process fast path the built-in harnesses use — the same request
and reply bodies as over HTTP, without a socket. ``rlonce.gateway.http`` serves the very same
object over FastAPI for outside agents. A gateway is built from one ``GatewaySettings`` and
hands it to every session it opens; each protocol is an ``Adapter`` in ``PROTOCOLS``, so a
request reads the same whatever protocol it speaks: parse, sample a turn, answer.

Every session has an owner key: the key that opened it over HTTP, or a random secret when the
trainer opens it (``Session.key``, handed to an outside harness). ``session_for`` is how the
HTTP layer reaches a session, and it refuses any other key — a client holding a session's
*id* cannot continue it. Sessions also expire, so a long-running ``rlonce serve`` cannot fill
up: one unused for ``idle_ttl`` seconds, or ended (truncated, closed) and unused for
``ended_ttl``, is dropped at the next sweep; opening a session past ``max_sessions`` sweeps
first. The trainer's own gateways keep both TTLs off and drop their sessions themselves.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

from rlonce.core.timeouts import Expired
from rlonce.gateway.messages import Overloaded, ProtocolError
from rlonce.gateway.protocols import PROTOCOLS
from rlonce.gateway.session import Budgets, GatewaySettings, Session
from rlonce.gateway.streams import TextStream, TurnStream


class Gateway:
    __slots__ = ("settings", "sessions", "_swept", "inflight")  # built whole from its settings

    def __init__(self, settings: GatewaySettings):
        self.settings = settings
        self.sessions: dict[str, Session] = {}
        self._swept = 0.0
        self.inflight = 0
        """Turns being sampled now (``settings.max_inflight`` bounds them)."""

    def open(self, session_id: str | None = None, *, key: str | None = None, seed: int | None = None,
             budgets: Budgets | None = None, metadata: dict | None = None) -> Session:
        """A new session owned by ``key`` (default: a fresh random secret, ``Session.key``)."""
        sid = session_id or uuid.uuid4().hex
        if sid in self.sessions:
            raise ProtocolError(f"session {sid!r} already exists", status=409)
        cap, idle_ttl = self.settings.max_sessions, self.settings.idle_ttl
        if len(self.sessions) >= cap and not self.expire(force=True):
            ttl = f"; idle sessions expire after {idle_ttl:g} s" if idle_ttl is not None else ""
            raise ProtocolError(f"too many open sessions ({cap}): close finished ones or retry later{ttl}",
                                status=429, kind="rate_limit_error")
        s = Session(sid, self.settings, key=key or secrets.token_urlsafe(24), budgets=budgets, seed=seed,
                    metadata=metadata)
        self.sessions[sid] = s
        return s

    def get(self, session_id: str) -> Session:
        s = self.sessions.get(session_id)
        if s is None:
            if not self.settings.auto_open:
                raise ProtocolError(f"unknown session {session_id!r}", status=404, kind="not_found")
            s = self.open(session_id)
        return s

    def session_for(self, key: str, session_id: str | None = None) -> Session:
        """The session an HTTP request addresses — by path, or else named by its key — if
        ``key`` owns it; an unknown one is opened for ``key`` when ``auto_open`` is on."""
        self.expire()
        sid = session_id if session_id is not None else key
        s = self.sessions.get(sid)
        if s is None:
            if not self.settings.auto_open:
                raise ProtocolError(f"unknown session {sid!r}: open it first or check its id", status=404,
                                    kind="not_found")
            return self.open(sid, key=key)
        if not hmac.compare_digest(s.key.encode(), key.encode()):
            raise ProtocolError(f"session {sid!r} belongs to another key: send the key that opened it, or use "
                                "a new session id", status=403, kind="permission_error")
        return s

    def expire(self, *, force: bool = False) -> int:
        """Drop expired sessions (at most one sweep a second unless ``force``); how many went."""
        if self.settings.idle_ttl is None and self.settings.ended_ttl is None:
            return 0
        now = time.monotonic()
        if not force and now - self._swept < 1.0:
            return 0
        self._swept = now
        gone = [sid for sid, s in self.sessions.items() if not s.lock.locked() and self._expired(s, now - s.last_used)]
        for sid in gone:
            del self.sessions[sid]
        return len(gone)

    def _expired(self, s: Session, idle: float) -> bool:
        idle_ttl, ended_ttl = self.settings.idle_ttl, self.settings.ended_ttl
        if idle_ttl is not None and idle > idle_ttl:
            return True
        return ended_ttl is not None and s.status != "active" and idle > ended_ttl

    async def call(self, protocol: str, body: dict, session_id: str) -> dict | AsyncIterator[str]:
        """One request in protocol ``protocol``: the reply body or, when the request streams, its
        server-sent events as they are sampled (an async iterator holding the session until it
        ends). Raises ``ProtocolError`` for anything the protocol answers with an error status;
        a failure after the first event is an error event in the stream instead."""
        adapter = PROTOCOLS[protocol]
        session = self.get(session_id)
        if session.lock.locked():
            raise ProtocolError(f"session {session_id!r} is busy with another request", status=409)
        cap = self.settings.max_inflight
        if cap is not None and self.inflight >= cap:
            raise Overloaded(self.inflight)
        await session.lock.acquire()
        handed = False
        try:
            session.last_used = time.monotonic()
            req = adapter.parse(body, session.responses)
            if not req.model:
                req = replace(req, model=self.settings.model_name)
            if not req.stream:
                return adapter.answer(await self._turn(session, req), req, body, session.responses)
            tokens: asyncio.Queue[int] = asyncio.Queue()
            task = asyncio.ensure_future(self._turn(session, req, tokens.put_nowait))
            first = asyncio.ensure_future(tokens.get())
            await asyncio.wait({task, first}, return_when=asyncio.FIRST_COMPLETED)
            if not first.done():  # the turn ended before any token: a refusal or failure is raised here
                first.cancel()
                task.result()
                first = None
            handed = True
            return self._events(adapter.streamer(req, body, session.responses), session, req, task, tokens, first)
        finally:
            if not handed:
                session.lock.release()

    async def _turn(self, session: Session, req, on_token=None):
        self.inflight += 1
        try:
            return await session.turn(req, on_token)
        finally:
            self.inflight -= 1
            session.last_used = time.monotonic()

    async def _events(self, out: TurnStream, session: Session, req, task: asyncio.Future, tokens: asyncio.Queue,
                      first: asyncio.Future | None) -> AsyncIterator[str]:
        """The SSE events of a streamed turn: content deltas as the tokens arrive (``TextStream``
        holds back markup), then the rest once the turn is committed. Releases the session when
        the turn is done, also when the client goes away mid-stream."""
        text = TextStream(self.settings.decode, (*self.settings.fmt.stream_holds, *req.stop))
        got, pending = 0, first
        try:
            yield "".join(out.start(session.prompt_tokens))
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(tokens.get())
                    await asyncio.wait({task, pending}, return_when=asyncio.FIRST_COMPLETED)
                if not pending.done():
                    break
                got, piece, pending = got + 1, text.push(pending.result()), None
                if piece:
                    yield "".join(out.text(piece))
            try:
                turn = task.result()
            except ProtocolError as e:
                yield "".join(out.error(e, out.adapter.error(e)))
                return
            except Expired as e:
                err = ProtocolError(f"the model did not answer in time ({e})", status=504, kind="timeout_error")
                yield "".join(out.error(err, out.adapter.error(err)))
                return
            except Exception as e:  # noqa: BLE001 - the engine failed mid-stream: the system's fault, retryable
                err = ProtocolError(f"engine unavailable: {type(e).__name__}: {e}", status=503, kind="api_error")
                yield "".join(out.error(err, out.adapter.error(err)))
                return
            while got < turn.completion_tokens:  # tokens handed over after the turn ended
                got += 1
                text.push(await asyncio.wait_for(tokens.get(), 10))
            yield "".join(out.finish(turn))
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
            if task.done():
                session.lock.release()
            else:  # the client left: the turn still commits, then the session is free
                task.add_done_callback(lambda t: (t.cancelled() or t.exception(), session.lock.release()))
