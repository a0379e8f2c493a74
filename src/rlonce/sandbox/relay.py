"""A byte relay between TCP and a Unix socket: how a sandbox with no network reaches one service.

An outside harness (an agent CLI) speaks HTTP to ``127.0.0.1:PORT``. Its sandbox has its own,
empty network namespace, so that address is the sandbox's own loopback: this module, run there
by the system interpreter (``python3 relay.py PORT SOCKET``), listens on it and copies bytes to
a Unix socket bound in from the host. On the host, ``unix_to_tcp`` listens on that socket and
copies bytes to the gateway's TCP address. The agent reaches the gateway and nothing else: no
other host loopback service, no other network. The relay reads no request; the gateway's own
checks (session keys, sizes, timeouts) apply unchanged.

Standard library only: inside the sandbox it runs without rlonce or any package.
"""

from __future__ import annotations

import asyncio
import os
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except (ConnectionError, OSError):
            pass


async def _splice(client_r, client_w, upstream) -> None:
    """Connect one accepted client to a fresh ``upstream()`` connection, both ways."""
    try:
        up_r, up_w = await upstream()
    except OSError:
        client_w.close()
        return
    await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))


async def unix_to_tcp(socket_path: str, host: str, port: int) -> asyncio.AbstractServer:
    """Host side: a Unix socket at ``socket_path`` (mode 0666, for the sandbox uid) relayed to
    ``host:port``. Close the returned server to stop."""
    server = await asyncio.start_unix_server(
        lambda r, w: _splice(r, w, lambda: asyncio.open_connection(host, port)), path=socket_path)
    os.chmod(socket_path, 0o666)
    return server


def tcp_to_unix(port: int, socket_path: str) -> None:
    """Sandbox side: listen on 127.0.0.1:``port``, then detach (the caller's shell goes on once
    the port is listening) and relay every connection to ``socket_path``."""
    import socket

    sock = socket.create_server(("127.0.0.1", port))
    if os.fork():
        os._exit(0)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)

    async def serve() -> None:
        server = await asyncio.start_server(
            lambda r, w: _splice(r, w, lambda: asyncio.open_unix_connection(socket_path)), sock=sock)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    tcp_to_unix(int(sys.argv[1]), sys.argv[2])
