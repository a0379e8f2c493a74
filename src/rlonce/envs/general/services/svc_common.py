"""What every service mock shares: its SQLite database, typed failures, rows as plain data.

The service modules run inside the service sandbox under the system interpreter with only the
``mcp`` SDK and its dependencies on the path — they import nothing from rlonce (``host.py``
loads them as plain modules). A failure the model should read is a ``ToolError`` whose text
starts with its kind (``FAILURE_KINDS``), as a real service's error code would.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

FAILURE_KINDS = ("not_found", "permission_denied", "conflict", "bad_arguments")
EMAIL = re.compile(r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}$")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}$")
MAX_TEXT = 20_000
MAX_ROWS = 50


def server(name: str, instructions: str) -> MCPServer:
    """A service's MCP server (the SDK's ``MCPServer``), logging errors only."""
    return MCPServer(name, instructions=instructions, log_level="ERROR")


def serve(service: object, tools: tuple[str, ...], name: str, instructions: str) -> MCPServer:
    """The MCP server of ``name`` offering the methods ``tools`` of ``service`` as its tools (their
    signatures are the tools' input schemas, their docstrings the descriptions)."""
    srv = server(name, instructions)
    for tool in tools:
        srv.add_tool(getattr(service, tool))
    return srv


def fail(kind: str, message: str) -> ToolError:
    """The error a tool raises: ``kind: message`` (``raise fail("not_found", ...)``)."""
    assert kind in FAILURE_KINDS, kind
    return ToolError(f"{kind}: {message}")


def connect(path: Path, schema: str) -> sqlite3.Connection:
    """The service's database (created with ``schema`` if new); usable from the SDK's worker threads."""
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    db.row_factory = sqlite3.Row
    db.executescript(schema)
    return db


def rows(cur: sqlite3.Cursor) -> list[dict]:
    return [dict(r) for r in cur.fetchall()]


def one(db: sqlite3.Connection, sql: str, args: tuple, what: str) -> dict:
    """The single row ``sql`` selects, or a ``not_found`` failure naming ``what``."""
    r = db.execute(sql, args).fetchone()
    if r is None:
        raise fail("not_found", f"no {what}")
    return dict(r)


def text(value: str, name: str, *, required: bool = True, limit: int = MAX_TEXT) -> str:
    if required and not value.strip():
        raise fail("bad_arguments", f"{name} must not be empty")
    if len(value) > limit:
        raise fail("bad_arguments", f"{name} is longer than {limit} characters")
    return value


def pattern(value: str, regex: re.Pattern, name: str, shape: str) -> str:
    if not regex.match(value):
        raise fail("bad_arguments", f"{name} {value!r} is not {shape}")
    return value


def limit_rows(limit: int) -> int:
    if not 1 <= limit <= MAX_ROWS:
        raise fail("bad_arguments", f"limit must be between 1 and {MAX_ROWS}")
    return limit
