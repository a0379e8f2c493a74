"""A small logging reverse proxy for recording what agent clients send.

    python tests/compat/proxy.py --upstream http://127.0.0.1:8001 --port 8002 \
        --client claude-code --out tests/compat/corpus/claude-code.jsonl

Every request (any method, any path, query string kept) is forwarded to the upstream base URL;
the upstream's reply, streaming or not, is passed back as it arrives. One JSON line per request
is appended to the output file:

    {"client", "method", "path", "query", "headers", "body", "status", "response_excerpt"}

``headers`` has the values of ``authorization``, ``x-api-key``, ``cookie`` (and a few other
credential headers) replaced by ``"REDACTED"``; ``body`` is the parsed JSON body or null (a
non-JSON body is kept as ``body_text``, cut to 2 KB); ``response_excerpt`` is the first 2 KB of
the upstream's reply text.

Only loopback addresses are accepted, for both the listening address and the upstream.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

REDACT = {"authorization", "x-api-key", "cookie", "set-cookie", "proxy-authorization",
          "api-key", "x-goog-api-key", "openai-api-key", "anthropic-api-key"}
HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
       "transfer-encoding", "upgrade", "host", "content-length"}
EXCERPT = 2048


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def redact(headers) -> dict:
    return {k: ("REDACTED" if k.lower() in REDACT else v) for k, v in headers.items()}


def parse_body(raw: bytes) -> dict:
    if not raw:
        return {"body": None}
    try:
        return {"body": json.loads(raw)}
    except (ValueError, UnicodeDecodeError):
        return {"body": None, "body_text": raw[:EXCERPT].decode("utf-8", "replace")}


def make_app(upstream: str, client_name: str, out: Path) -> Starlette:
    upstream = upstream.rstrip("/")
    lock = asyncio.Lock()
    http = httpx.AsyncClient(base_url=upstream, timeout=httpx.Timeout(600.0, connect=10.0))

    async def write(record: dict) -> None:
        line = json.dumps(record, ensure_ascii=False)
        async with lock:
            with out.open("a", encoding="utf-8") as f:
                f.write(line + "\n")

    async def proxy(request: Request) -> Response:
        raw = await request.body()
        record = {"client": client_name, "method": request.method, "path": request.url.path,
                  "query": request.url.query, "headers": redact(request.headers), **parse_body(raw)}
        fwd_headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP]
        req = http.build_request(request.method, request.url.path, params=request.url.query or None,
                                 headers=fwd_headers, content=raw)
        try:
            resp = await http.send(req, stream=True)
        except httpx.HTTPError as e:
            record.update(status=None, response_excerpt=f"proxy: upstream error: {e!r}")
            await write(record)
            return Response(f"proxy: upstream error: {e!r}", status_code=502)
        record["status"] = resp.status_code
        excerpt = bytearray()

        async def body():
            try:
                async for chunk in resp.aiter_raw():
                    if len(excerpt) < EXCERPT:
                        excerpt.extend(chunk[:EXCERPT - len(excerpt)])
                    yield chunk
            finally:
                await resp.aclose()

        async def done():
            record["response_excerpt"] = bytes(excerpt).decode("utf-8", "replace")
            await write(record)

        headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP}
        return StreamingResponse(body(), status_code=resp.status_code, headers=headers,
                                 background=BackgroundTask(done))

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
    routes = [Route("/{path:path}", proxy, methods=methods)]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await http.aclose()

    return Starlette(routes=routes, lifespan=lifespan)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--upstream", required=True, help="upstream base URL (loopback only)")
    p.add_argument("--port", type=int, default=8002)
    p.add_argument("--host", default="127.0.0.1", help="listen address (loopback only)")
    p.add_argument("--client", required=True, help="client name written on every line")
    p.add_argument("--out", required=True, help="JSONL file to append to")
    a = p.parse_args(argv)
    up = urlsplit(a.upstream)
    if up.scheme not in ("http", "https") or not is_loopback(up.hostname or ""):
        sys.exit(f"--upstream must be a loopback http(s) URL, not {a.upstream!r}")
    if not is_loopback(a.host):
        sys.exit(f"--host must be a loopback address, not {a.host!r}")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    uvicorn.run(make_app(a.upstream, a.client, out), host=a.host, port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
