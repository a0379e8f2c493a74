"""The gateway: sessions addressed by id, one engine behind them, three wire protocols in front.

``Gateway.call`` is the in-process fast path the built-in harnesses use — the same request
and reply bodies as over HTTP, without a socket. ``rlonce.gateway.http`` serves the very same
object over FastAPI for outside agents.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from rlonce.engine.base import Engine, SamplingParams
from rlonce.gateway.messages import ProtocolError
from rlonce.gateway.protocols import PROTOCOLS
from rlonce.gateway.session import Budgets, Session
from rlonce.model.chat import HermesFormat


class Gateway:
    def __init__(self, engine: Engine, encode, decode, fmt: HermesFormat, *, sampling: SamplingParams,
                 budgets: Budgets = Budgets(), model_name: str = "rlonce", auto_open: bool = False,
                 honor_client_sampling: bool = False, render_tools: bool = True, max_sessions: int = 100_000):
        self.engine = engine
        self.encode = encode
        self.decode = decode
        self.fmt = fmt
        self.sampling = sampling
        self.budgets = budgets
        self.model_name = model_name
        self.auto_open = auto_open
        """Open a session on first use of an unknown id (``rlonce serve``); otherwise unknown
        ids are refused with 404 and sessions are opened by whoever runs the rollout."""
        self.honor_client_sampling = honor_client_sampling
        """Use a request's temperature/top_p. Off in training: the trainer recomputes log-probs
        at the run's temperature, so a client must not change the sampling distribution."""
        self.render_tools = render_tools
        self.max_sessions = max_sessions
        self.sessions: dict[str, Session] = {}
        self.tokenizer = None
        """A Hugging Face tokenizer with the model's chat template, for the re-rendering report."""
        self.offload = None
        """An executor for the sessions' rendering and tokenization (a Ray harness pool gives each
        gateway one background thread, so its event loop keeps serving other sequences)."""

    def open(self, session_id: str | None = None, *, seed: int | None = None, budgets: Budgets | None = None,
             metadata: dict | None = None) -> Session:
        sid = session_id or uuid.uuid4().hex
        if sid in self.sessions:
            raise ProtocolError(f"session {sid!r} already exists", status=409)
        if len(self.sessions) >= self.max_sessions:
            raise ProtocolError("too many open sessions; close finished ones", status=429, kind="rate_limit_error")
        s = Session(sid, self.engine, self.encode, self.decode, self.fmt, sampling=self.sampling,
                    budgets=budgets or self.budgets, seed=seed, honor_client_sampling=self.honor_client_sampling)
        s.render_tools = self.render_tools
        s.offload = self.offload
        if metadata:
            s.metadata.update(metadata)
        self.sessions[sid] = s
        return s

    def get(self, session_id: str) -> Session:
        s = self.sessions.get(session_id)
        if s is None:
            if not self.auto_open:
                raise ProtocolError(f"unknown session {session_id!r}", status=404, kind="not_found")
            s = self.open(session_id)
        return s

    async def call(self, protocol: str, body: dict, session_id: str) -> dict | list[str]:
        """One request in protocol ``protocol``: the reply body, or the SSE events when the
        request streams. Raises ``ProtocolError`` for anything the protocol answers with a 4xx."""
        proto = PROTOCOLS[protocol]
        session = self.get(session_id)
        if session.lock.locked():
            raise ProtocolError(f"session {session_id!r} is busy with another request", status=409)
        async with session.lock:
            if protocol == "openai-responses":
                req = proto.parse(body, session.responses)
            else:
                req = proto.parse(body)
            if not req.model:
                req = replace(req, model=self.model_name)
            turn = await session.turn(req)
            if protocol == "openai-responses":
                rid = proto.new_id()
                sampled = turn.completion_tokens and session.current is not None
                session.responses[rid] = list(session.current.messages if sampled else req.messages)
                return proto.stream(turn, req, rid) if req.stream else proto.reply(turn, req, rid)
            return proto.stream(turn, req, body) if req.stream else proto.reply(turn, req)
