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
from rlonce.gateway import structured
from rlonce.gateway.messages import Overloaded, ProtocolError
from rlonce.gateway.protocols import PROTOCOLS
from rlonce.gateway.session import Budgets, GatewaySettings, Session
from rlonce.gateway.streams import TextStream, TurnStream

MAX_QUEUED = 8
"""The most requests one session holds waiting for its turn in flight (``GatewaySettings.busy_wait``)."""


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

    def session_for(self, key: str, session_id: str | None = None, *, create: bool = True) -> Session | None:
        """The session an HTTP request addresses — by path, or else named by its key — if
        ``key`` owns it; an unknown one is opened for ``key`` when ``auto_open`` is on (with
        ``create=False`` it is left for the caller to open once the request is accepted: None)."""
        self.expire()
        sid = session_id if session_id is not None else key
        s = self.sessions.get(sid)
        if s is None:
            if not self.settings.auto_open:
                raise ProtocolError(f"unknown session {sid!r}: open it first or check its id", status=404,
                                    kind="not_found")
            return self.open(sid, key=key) if create else None
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

    async def call(self, protocol: str, body: dict, session_id: str | None, *,
                   key: str | None = None) -> dict | AsyncIterator[str]:
        """One request in protocol ``protocol`` to session ``session_id`` — or, with ``key`` (an
        HTTP request), to the session the key owns by that id or by its own name: the reply body
        or, when the request streams, its server-sent events as they are sampled. Raises
        ``ProtocolError`` for anything the protocol answers with an error status; a failure after
        the first event is an error event in the stream instead. A refused request never touches
        a session: an unknown one is opened only once the request is accepted."""
        adapter = PROTOCOLS[protocol]
        if key is not None:
            session = self.session_for(key, session_id, create=False)
            session_id = session_id if session_id is not None else key
        else:
            session = self.get(session_id)
        held = session is not None and session.lock.locked()
        if held:
            await self._queue(session, session_id)  # returns holding the session
        try:
            req = self._accept(adapter, body, session)
        except BaseException:
            if held:
                session.lock.release()
            raise
        fresh = session is None
        session = session or self.open(session_id, key=key)
        if not held:
            await session.lock.acquire()  # free (checked above, nothing awaited since): taken at once
        self.inflight += 1  # the slot is this request's from now on, whatever happens to it
        session.last_used = time.monotonic()
        if not req.stream:
            try:
                return adapter.answer(await session.turn(req), req, body, session.responses)
            except ProtocolError:
                self._forget(session, fresh)
                raise
            finally:
                self._done(session)
        out = adapter.streamer(req, body, session.responses)
        tokens: asyncio.Queue[int] = asyncio.Queue()

        async def sample():
            """The turn; its end, however it comes, frees the session and the slot."""
            try:
                turn = await session.turn(req, tokens.put_nowait)
                out.record(turn)
                return turn
            finally:
                self._done(session)

        task = asyncio.ensure_future(sample())
        first = asyncio.ensure_future(tokens.get())
        try:
            await asyncio.wait({task, first}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the caller gave up (cancelled): the turn goes on and frees the session itself
            first.cancel()
            raise
        if not first.done():  # the turn ended before any token: a refusal or failure is raised here
            first.cancel()
            try:
                task.result()
            except ProtocolError:
                self._forget(session, fresh)
                raise
            first = None
        return self._events(out, session, req, task, tokens, first)

    def _accept(self, adapter, body, session: Session | None):
        """The request parsed, if the engine has a slot for it (``Overloaded`` otherwise)."""
        cap = self.settings.max_inflight
        if cap is not None and self.inflight >= cap:
            raise Overloaded(self.inflight)
        req = structured.accept(adapter.parse(body, session.responses if session is not None else None), self.settings)
        return req if req.model else replace(req, model=self.settings.model_name)

    async def _queue(self, session: Session, session_id: str) -> None:
        """Take ``session`` once its turn in flight ends, waiting at most ``settings.busy_wait``
        seconds behind at most ``MAX_QUEUED`` others; else 409 with ``retry-after``."""
        busy = ProtocolError(f"session {session_id!r} is busy with another request: send one request at a time "
                             "per session, or use one session per parallel agent", status=409, retry_after=1.0)
        if self.settings.busy_wait <= 0 or session.queued >= MAX_QUEUED:
            raise busy
        session.queued += 1
        try:
            async with asyncio.timeout(self.settings.busy_wait):
                await session.lock.acquire()
        except TimeoutError:
            raise busy from None
        finally:
            session.queued -= 1

    def count_tokens(self, body) -> dict:
        """Anthropic's ``/v1/messages/count_tokens``: the input tokens the request's messages and
        tools take as a new context's prompt, rendered and encoded as a turn would. No session is
        read or opened. The count is of the messages as sent: a ``thread``, ``compaction`` or
        ``context_management`` asks nothing of a count (the API ignores ``compaction`` there too)."""
        if isinstance(body, dict):
            body = {k: v for k, v in body.items() if k not in ("thread", "compaction", "context_management")}
        req = PROTOCOLS["anthropic-messages"].parse(body)
        tools = req.tools if self.settings.render_tools else []
        return {"input_tokens": len(self.settings.encode(self.settings.fmt.render(req.messages, tools)))}

    def _forget(self, session: Session, fresh: bool) -> None:
        """A session this request opened and the turn refused (a context over its budget) is
        dropped again: a refused request never leaves a session behind."""
        if fresh and not session.generations and self.sessions.get(session.id) is session:
            del self.sessions[session.id]

    def _done(self, session: Session) -> None:
        self.inflight -= 1
        session.last_used = time.monotonic()
        session.lock.release()

    async def _events(self, out: TurnStream, session: Session, req, task: asyncio.Future, tokens: asyncio.Queue,
                      first: asyncio.Future | None) -> AsyncIterator[str]:
        """The SSE events of a streamed turn: reasoning and content deltas as the tokens arrive
        (``TextStream`` holds back markup), then the rest once the turn is committed. The turn
        owns the session and frees it when it ends, whether or not anyone reads this."""
        text = TextStream(self.settings.decode, (*self.settings.fmt.stream_holds, *req.stop),
                          self.settings.fmt.reasoning_tags)
        pending = first
        try:
            yield "".join(out.start(session.prompt_tokens))
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(tokens.get())
                    await asyncio.wait({task, pending}, return_when=asyncio.FIRST_COMPLETED)
                if not pending.done():
                    break
                pieces, pending = text.push(pending.result()), None
                if pieces:
                    yield "".join(e for kind, piece in pieces for e in out.delta(kind, piece))
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
            yield "".join(out.finish(turn))  # what is left is in the turn: tokens still queued need no reading
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
