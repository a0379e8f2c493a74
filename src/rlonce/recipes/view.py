"""``rlonce view RUN``: a local web page to debug a run — steps, groups, sequences, contexts.

A FastAPI app serves one static page (``view_static/``: HTML, one plain JS file, CSS; nothing
fetched from elsewhere) and a read-only JSON API over what ``rlonce.recipes.view_data`` reads
from the run directory, plus the run's plots as PNG.

Everything in a run was produced by the policy and is treated as hostile. What this protects
against: script in stored text (the page only ever sets ``textContent`` and DOM attributes, and
a strict Content-Security-Policy forbids inline and foreign script, styles, frames and forms, so
an injected ``<script>`` neither lands as markup nor could run); MIME sniffing
(``nosniff``); reading files off the disk (no path from the client reaches the file system:
path parameters are whole numbers matched by the router, files are fixed names); DNS
rebinding and other sites' pages (a Host header must be a loopback name, a cross-site fetch is
refused); writes (GET only; the API changes nothing). The server binds loopback only. What it
does not protect against: other users of this machine, who can reach a loopback port too.
"""

from __future__ import annotations

import ipaddress
import math
import socket
import threading
from pathlib import Path

from rlonce.errors import UsageError
from rlonce.recipes.view_data import RunView

STATIC = Path(__file__).with_name("view_static")
DEFAULT_PORT = 8470
HEADERS = [
    (b"content-security-policy", b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                 b"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
                                 b"frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
"""Sent with every response."""


def is_loopback_name(host: str) -> bool:
    """``localhost`` or a loopback IP address (no name is resolved)."""
    host = host.strip().lower().removesuffix(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_of(header: str) -> str:
    """The host part of a Host header: ``[::1]:8470`` -> ``::1``, ``localhost:8470`` -> ``localhost``."""
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else ""
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    """ASGI middleware: only GET from a loopback Host and not cross-site, and the security
    headers on every response."""

    def __init__(self, app):
        self.app = app
        self.state = app.state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        if not host or not is_loopback_name(_host_of(host)):
            return await _refuse(send, 403, "this page answers only requests to a loopback host (localhost, 127.0.0.1)")
        if headers.get(b"sec-fetch-site", b"") == b"cross-site":
            return await _refuse(send, 403, "cross-site requests are refused")
        if scope["method"] != "GET":
            return await _refuse(send, 405, "only GET is served", [(b"allow", b"GET")])

        async def secured(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *HEADERS]}
            await send(message)

        await self.app(scope, receive, secured)


async def _refuse(send, status: int, text: str, extra=()) -> None:
    body = text.encode() + b"\n"
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()), *extra, *HEADERS]})
    await send({"type": "http.response.body", "body": body})


def _clean(x):
    """JSON-safe: non-finite floats become null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def make_app(view: RunView):
    """The page and its API over ``view``, wrapped in ``Guard``."""
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import JSONResponse, Response

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.state.admin_key = None  # rlonce.gateway.server's servers expect one; the viewer has no admin routes
    files = {name: (STATIC / name).read_bytes() for name in ("index.html", "view.js", "view.css")}

    def found(x):
        if x is None:
            raise HTTPException(404, "no such step, row or plot in this run")
        return JSONResponse(_clean(x))

    @app.get("/")
    def index():
        return Response(files["index.html"], media_type="text/html; charset=utf-8")

    @app.get("/view.js")
    def script():
        return Response(files["view.js"], media_type="text/javascript; charset=utf-8")

    @app.get("/view.css")
    def style():
        return Response(files["view.css"], media_type="text/css; charset=utf-8")

    @app.get("/favicon.ico")
    def favicon():
        return Response(status_code=204)

    @app.get("/api/run")
    def run():
        return found(view.overview())

    @app.get("/api/steps/{step:int}")
    def step(step: int):
        return found(view.step(step))

    @app.get("/api/steps/{step:int}/rows/{row:int}")
    def row(step: int, row: int):
        return found(view.context(step, row))

    @app.get("/api/steps/{step:int}/untrained/{row:int}")
    def untrained_row(step: int, row: int):
        return found(view.context(step, row, untrained=True))

    @app.get("/api/plots/{plot_id:int}.png")
    def plot(plot_id: int):
        png = view.plot(plot_id)
        if png is None:
            raise HTTPException(404, "no such plot")
        return Response(png, media_type="image/png")

    return Guard(app)


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to loopback ``host:port`` (0: a free port), or a one-line error."""
    if not is_loopback_name(host):
        raise UsageError(f"view: --host {host} is not a loopback address; the page shows a run's contents only to "
                         "this machine: use 127.0.0.1, ::1 or localhost")
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        hint = "another process listens there: choose another --port (0 picks a free one)"
        raise UsageError(f"view: cannot listen on {host}:{port}: {e.strerror or e}; {hint}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


def serve(run_dir: Path, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> None:
    """Serve the page for ``run_dir`` on ``host:port`` until interrupted; prints the URL."""
    import uvicorn

    from rlonce.gateway.server import config

    view = RunView(run_dir)
    sock = listen(host, port)
    # the tokenizer takes seconds to load (it imports transformers): load it while the page opens,
    # not when the first context is asked for
    threading.Thread(target=view.tokenizer.get, name="view-tokenizer", daemon=True).start()
    server = uvicorn.Server(config(make_app(view), host, port))
    print(f"rlonce view of {view.run_dir} ({len(view.steps())} stored steps) at {url_of(sock)}\n  Ctrl-C stops",
          flush=True)
    server.run(sockets=[sock])
