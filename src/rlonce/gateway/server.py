"""Serving the gateway app with uvicorn, with the timeouts uvicorn does not have.

uvicorn bounds the idle time *between* requests (``timeout_keep_alive``) and the size of an
incomplete request head (h11's ``max_incomplete_event_size``), but not the time a client may
take to send a request's headers: a client that opens a connection and sends half a request
line — or one byte every few seconds — holds it forever, and a thousand of them hold a
thousand sockets. ``HeaderDeadline`` is uvicorn's own h11 protocol with one addition: from the
moment a connection opens, and again after each response, the next request's headers must
arrive within ``header_timeout`` seconds or the connection is closed. Once the headers are in,
the application takes over (``make_app`` bounds the body's arrival itself), so long replies
are never cut. Every server ``ServerThread`` and ``AsyncServer`` start uses it.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT = 10.0
"""Seconds a client has to send a request's headers."""
IDLE_TIMEOUT = 5
"""Seconds an idle keep-alive connection stays open (uvicorn's ``timeout_keep_alive``)."""
MAX_HEAD_BYTES = 64 << 10
"""The largest request line plus headers accepted (h11's ``max_incomplete_event_size``)."""


class HeaderDeadline(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers are not complete
    ``header_timeout`` seconds after it opened or after its previous response."""

    def __init__(self, *args, header_timeout: float = HEADER_TIMEOUT, **kwargs):
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self._deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # the headers are in
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm()


def config(app: FastAPI, host: str = "127.0.0.1", port: int = 0, *, header_timeout: float = HEADER_TIMEOUT,
           idle_timeout: int = IDLE_TIMEOUT) -> uvicorn.Config:
    return uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off",
                          http=functools.partial(HeaderDeadline, header_timeout=header_timeout),
                          timeout_keep_alive=idle_timeout, h11_max_incomplete_event_size=MAX_HEAD_BYTES)


class ServerThread:
    """Serve an app on loopback from a background thread (for synchronous callers: tests,
    benchmarks). ``base_url`` is ``http://127.0.0.1:PORT``; ``stop()`` shuts it down."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, **timeouts):
        self.server = uvicorn.Server(config(app, host, port, **timeouts))
        self.admin_key = app.state.admin_key
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> ServerThread:
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

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, **timeouts):
        self.server = uvicorn.Server(config(app, host, port, **timeouts))
        self.admin_key = app.state.admin_key

    async def __aenter__(self) -> AsyncServer:
        self.task = asyncio.create_task(self._serve())
        while not self.server.started:
            if self.task.done():
                self.task.result()
                raise RuntimeError("the gateway server did not start")
            await asyncio.sleep(0.01)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.base_url = f"http://{host}:{port}"
        return self

    async def _serve(self) -> None:
        try:
            await self.server.serve()
        except SystemExit:  # uvicorn exits the process when it cannot bind; here that is an error
            cfg = self.server.config
            raise OSError(f"the gateway could not listen on {cfg.host}:{cfg.port} (address in use or not "
                          "available); choose another --host/--port") from None

    async def __aexit__(self, *exc) -> None:
        self.server.should_exit = True
        await self.task
