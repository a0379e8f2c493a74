"""The Sandbox contract: run commands in an isolated workspace, move files, snapshot it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rlonce.errors import RlonceError


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    output: str
    """stdout and stderr interleaved as the process wrote them, cut at the output cap."""
    timed_out: bool = False
    truncated: bool = False
    seconds: float = 0.0


class SandboxError(RlonceError, RuntimeError):
    """The sandbox itself failed (not the command run in it): an infrastructure failure."""


class Sandbox(Protocol):
    workspace: Path
    """The host folder the sandbox sees as its working directory."""

    async def exec(self, cmd: str, timeout: float | None = None) -> ExecResult: ...

    def put_file(self, path: str, data: bytes | str) -> None: ...

    def get_file(self, path: str) -> bytes: ...

    def snapshot(self) -> str: ...

    def restore(self, snapshot_id: str) -> None: ...

    def close(self) -> None: ...
