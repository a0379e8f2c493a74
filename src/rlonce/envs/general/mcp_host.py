"""The rollout's office services as real MCP servers in a sandbox of their own, and the MCP
clients the environment speaks to them with.

``ServiceHost.start`` seeds a fresh service sandbox's workspace with the task's initial state
(each service's SQLite database; the documents of ``files``), then starts one process in it
(``services/svc_host.py``, the system interpreter with the installed ``mcp`` SDK mounted
read-only) that serves every service the task uses, each on its own pair of pipes with MCP's
stdio framing. The host connects an ``mcp`` SDK ``Client`` to each: ``tools/list`` gives the
tools the agent sees, ``tools/call`` runs them. The agent's own sandbox (bash) never sees this
workspace, so the state changes only through the services' operations; the grader reads the
final databases back out of it (``state_file``) after the episode.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

from rlonce.sandbox.base import SandboxError
from rlonce.sandbox.bwrap import SPAWN_MIN_FD, BwrapSandbox, Limits

SERVICES_DIR = Path(__file__).resolve().parent / "services"
SERVICE_NAMES = ("mail", "calendar", "files", "tickets", "ledger")
FAILURE_KINDS = ("not_found", "permission_denied", "conflict", "bad_arguments")
"""The services' refusals (``services/svc_common.py``)."""
SITE_MOUNT, SERVICES_MOUNT = "/opt/site", "/opt/services"
START_TIMEOUT = 180.0
"""Seconds the service process may take to import the SDK and answer ``initialize`` (about a
second on an idle machine; minutes when it is loaded)."""
CALL_TIMEOUT = 60.0
MAX_STATE_BYTES = 8 << 20
MAX_MESSAGE_BYTES = 16 << 20
"""The longest JSON-RPC line a service may send."""
LIMITS = Limits(cpu_seconds=300, address_space_mb=1024, processes=16, file_size_mb=16, wall_seconds=600,
                workspace_mb=64)


class ServiceError(SandboxError):
    """The service sandbox or an MCP connection failed: infrastructure, never the agent's doing."""


def _site_packages() -> str:
    import mcp

    return str(Path(mcp.__file__).resolve().parents[1])


def _high(fd: int) -> int:
    """``fd`` moved to a number >= ``SPAWN_MIN_FD`` (inheritable), the original closed."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD, SPAWN_MIN_FD)
    os.close(fd)
    os.set_inheritable(new, True)
    return new


@asynccontextmanager
async def pipe_transport(read_fd: int, write_fd: int):
    """An MCP client transport over two pipe ends: one JSON-RPC message per line each way. Asyncio's
    own pipe transports, not worker threads: a rollout holds a reader per service for its whole
    life, and thread-backed files would exhaust the shared thread pool under many rollouts."""
    import anyio
    import mcp_types
    from mcp.shared.message import SessionMessage

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_MESSAGE_BYTES, loop=loop)
    rtrans, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop),
                                             os.fdopen(read_fd, "rb", buffering=0))
    wtrans, wproto = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                   os.fdopen(write_fd, "wb", buffering=0))
    writer = asyncio.StreamWriter(wtrans, wproto, None, loop)
    inbox_w, inbox = anyio.create_memory_object_stream(0)
    outbox, outbox_r = anyio.create_memory_object_stream(0)

    async def read() -> None:
        async with inbox_w:
            while line := await reader.readline():
                if not line.strip():
                    continue
                try:
                    msg = SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
                except ValueError as e:
                    msg = e
                await inbox_w.send(msg)

    async def write() -> None:
        async with outbox_r:
            async for m in outbox_r:
                writer.write((m.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n").encode())
                await writer.drain()

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        tg.start_soon(write)
        try:
            yield inbox, outbox
        finally:
            tg.cancel_scope.cancel()
            wtrans.close()
            rtrans.close()


def _failure(tool: str, message: str) -> tuple[str, str]:
    """A refused call as the agent reads it, and its kind: the service's own (``not_found: ...``),
    ``bad_arguments`` when the SDK rejected the arguments against the tool's schema, else ``error``."""
    message = message.removeprefix(f"Error executing tool {tool}: ")
    kind = message.split(":", 1)[0]
    if "validation error" in message.splitlines()[0]:
        fields = [ln.strip() for ln in message.splitlines()[1::3] if ln.strip()]
        return f"error: bad_arguments: invalid {', '.join(fields) or 'arguments'}", "bad_arguments"
    if kind in FAILURE_KINDS:
        return f"error: {message}", kind
    return f"error: {message}", "error"


class ServiceHost:
    """The services ``names`` of one rollout, seeded with ``state`` (workspace path → bytes)."""

    def __init__(self, names: list[str], state: dict[str, bytes], *, me: str, today: str):
        unknown = sorted(set(names) - set(SERVICE_NAMES))
        if unknown:
            raise ValueError(f"unknown services {unknown}; known: {list(SERVICE_NAMES)}")
        self.names, self.state, self.me, self.today = list(names), state, me, today
        self.sandbox: BwrapSandbox | None = None
        self.clients: dict[str, object] = {}
        self.tools: dict[str, tuple[str, dict]] = {}
        """Agent-facing name (``service__tool``) → (service, the tool's schema as a function tool)."""
        self._stack = AsyncExitStack()

    async def start(self) -> None:
        sbx = self.sandbox = BwrapSandbox(LIMITS, ro_binds={_site_packages(): SITE_MOUNT,
                                                           str(SERVICES_DIR): SERVICES_MOUNT},
                                          env={"PYTHONPATH": f"{SITE_MOUNT}:{SERVICES_MOUNT}",
                                               "PYTHONDONTWRITEBYTECODE": "1"})
        for rel, data in self.state.items():
            sbx.put_file(rel, data)
        ours, theirs, specs = [], [], []
        for name in self.names:
            to_srv_r, to_srv_w = os.pipe()
            from_srv_r, from_srv_w = os.pipe()
            r, w = _high(to_srv_r), _high(from_srv_w)
            theirs += [r, w]
            ours.append((name, from_srv_r, to_srv_w))
            specs.append(f"{name}:{r}:{w}")
        try:
            await sbx.spawn(f"exec python3 {SERVICES_MOUNT}/svc_host.py --state /work --me {self.me} "
                            f"--today {self.today} {' '.join(specs)}", tuple(theirs))
        finally:
            for fd in theirs:
                os.close(fd)
        try:
            await asyncio.wait_for(self._connect(ours), START_TIMEOUT)
        except (asyncio.TimeoutError, OSError, RuntimeError) as e:
            raise ServiceError(f"the services {self.names} did not start: {e!r}") from None

    async def _connect(self, ours: list[tuple[str, int, int]]) -> None:
        from mcp.client.client import Client

        for name, rfd, wfd in ours:
            client = await self._stack.enter_async_context(Client(pipe_transport(rfd, wfd)))
            self.clients[name] = client
            for tool in (await client.list_tools()).tools:
                self.tools[f"{name}__{tool.name}"] = (name, {"name": f"{name}__{tool.name}",
                                                             "description": tool.description or "",
                                                             "parameters": tool.input_schema})

    async def call(self, name: str, arguments: dict) -> tuple[str, str | None]:
        """Run the agent-facing tool ``name``: its output as text, and the failure kind when the
        service refused (``not_found``, ``bad_arguments``, …; ``error`` for anything else)."""
        service, _ = self.tools[name]
        tool = name.split("__", 1)[1]
        try:
            res = await asyncio.wait_for(self.clients[service].call_tool(tool, arguments), CALL_TIMEOUT)
        except (asyncio.TimeoutError, OSError, RuntimeError) as e:
            raise ServiceError(f"{service} failed on {tool}: {e!r}") from None
        texts = [getattr(c, "text", "") for c in res.content]
        if res.is_error:
            return _failure(tool, "\n".join(texts))
        try:  # one JSON text per tool result: shown compact
            return json.dumps(json.loads(texts[0]) if len(texts) == 1 else texts, ensure_ascii=False), None
        except ValueError:
            return "\n".join(texts), None

    def state_file(self, rel: str) -> bytes:
        """A file of the service workspace as it is now (read without following links)."""
        if self.sandbox is None:
            raise ServiceError("the services never started")
        return self.sandbox.get_file(rel, MAX_STATE_BYTES)

    async def close(self) -> None:
        try:
            await self._stack.aclose()
        except Exception:  # noqa: BLE001 - a dead server's pipes: the sandbox is killed below anyway
            pass
        if self.sandbox is not None:
            self.sandbox.close()
