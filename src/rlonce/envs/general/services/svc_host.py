"""The service sandbox's one process: each requested service as a real MCP server (the ``mcp``
SDK's ``MCPServer``) over its own database, each speaking MCP's stdio framing on its own pair of
pipes (fds given on the command line), all on one event loop.

    python3 svc_host.py --state DIR --me ADDRESS --today YYYY-MM-DD mail:3:4 ledger:5:6

One process rather than one per service: the SDK takes about a second to import, and a rollout
would pay it once per service.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
from pathlib import Path

import anyio
from mcp.server.stdio import stdio_server

MODULES = {
    "mail": "mail_svc",
    "calendar": "calendar_svc",
    "files": "files_svc",
    "tickets": "tickets_svc",
    "ledger": "ledger_svc",
}


async def serve(name: str, rfd: int, wfd: int, state: Path, me: str, today: str) -> None:
    server = importlib.import_module(MODULES[name]).build(state, me, today)
    stdin = anyio.wrap_file(io.TextIOWrapper(os.fdopen(rfd, "rb", buffering=0), encoding="utf-8", errors="replace"))
    stdout = anyio.wrap_file(io.TextIOWrapper(os.fdopen(wfd, "wb", buffering=0), encoding="utf-8", write_through=True))
    low = server._lowlevel_server
    async with stdio_server(stdin=stdin, stdout=stdout) as (read, write):
        await low.run(read, write, low.create_initialization_options())


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--state", required=True)
    p.add_argument("--me", required=True)
    p.add_argument("--today", required=True)
    p.add_argument("services", nargs="+", help="name:read_fd:write_fd")
    args = p.parse_args()
    async with anyio.create_task_group() as tg:
        for spec in args.services:
            name, rfd, wfd = spec.split(":")
            tg.start_soon(serve, name, int(rfd), int(wfd), Path(args.state), args.me, args.today)


if __name__ == "__main__":
    anyio.run(main)
