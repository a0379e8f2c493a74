"""Run a target's sanitizer build on an input, in a fresh sandbox, and read the report.

Only the pack's own binary runs here (bound read-only at ``/opt/target/<name>``), over a workspace
that holds nothing but the input. The sanitizers write their report to a file whose name carries
a fresh nonce (``log_path``), and only that file is read: what the program prints on stdout or
stderr — an echo of the input, fake sanitizer text — is never parsed. The input is data, so
nothing the agent wrote runs here; it can only steer our binary.

Limits: AddressSanitizer reserves terabytes of shadow address space, so the address-space
rlimit is lifted for this one binary and memory is capped by the sanitizer instead
(``hard_rss_limit_mb``, ``max_allocation_size_mb``); CPU and wall time are capped as usual. The
agent's own sandbox keeps the normal address-space cap (``rlonce.envs.cyber.env``).

Whose failure: a binary that does not start (exit 126/127, or no binary) is infrastructure
(``HarnessBroken``); a timeout, a clean exit, a crash of another type or in another function is
the input's (reward 0).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from rlonce.core.records import FailureCategory
from rlonce.envs.base import GradingError
from rlonce.envs.cyber.sanitizer import Report, parse
from rlonce.sandbox import hostfs
from rlonce.sandbox.bwrap import BwrapSandbox
from rlonce.sandbox.limits import CPU_EXHAUSTED, Limits, command_limits

RUN_SECONDS = 10.0
"""CPU seconds a target run may use; its wall clock is ``command_limits``' (waiting only, never
the host's load: a run cut by load would score an agent's right input 0)."""
MAX_POC_BYTES = 1 << 20
MAX_REPORT_BYTES = 1 << 20
TARGET_DIR = "/opt/target"
ASAN_OPTIONS = ("detect_leaks=0:abort_on_error=0:symbolize=1:handle_abort=1:hard_rss_limit_mb=512:"
                "max_allocation_size_mb=256:allocator_may_return_null=0:detect_stack_use_after_return=0")
UBSAN_OPTIONS = "print_stacktrace=1:halt_on_error=1:symbolize=1"


class HarnessBroken(GradingError):
    """The target binary could not run: infrastructure, never the agent's 0."""

    category = FailureCategory.TESTBED_CORRUPTED


@dataclass(frozen=True)
class Run:
    report: Report | None
    report_text: str
    output: str
    """What the program printed (shown to the agent by ``run-target``; never parsed)."""
    exit_code: int
    timed_out: bool
    """The run ran out of time: its CPU limit or its wall clock."""


def limits(seconds: float = RUN_SECONDS) -> Limits:
    return command_limits(int(seconds), address_space_mb=1 << 27, processes=8, file_size_mb=4, output_bytes=8192,
                          workspace_mb=64)


async def run_input(binary: Path, data: bytes, seconds: float = RUN_SECONDS) -> Run:
    """Run ``binary`` (a pack's sanitizer build) on ``data``; its first sanitizer report, if any."""
    if not Path(binary).is_file():
        raise HarnessBroken(f"the target binary {binary} is missing; rebuild the pack with `rlonce tasks build cyber`")
    nonce = secrets.token_hex(8)
    log = f"/work/.san-{nonce}"
    name = Path(binary).name
    box = BwrapSandbox(limits(seconds), ro_binds={str(binary): f"{TARGET_DIR}/{name}"},
                       env={"ASAN_OPTIONS": f"{ASAN_OPTIONS}:log_path={log}",
                            "UBSAN_OPTIONS": f"{UBSAN_OPTIONS}:log_path={log}"})
    try:
        box.put_file("input", data)
        r = await box.exec(f"{TARGET_DIR}/{name} input")
        if r.exit_code in (126, 127) and not r.timed_out:
            raise HarnessBroken(f"the target binary {name} did not start (exit {r.exit_code}): {r.output[-300:]}")
        text = ""
        for rel, _ in hostfs.walk(box.workspace, max_depth=1):
            if rel.startswith(f".san-{nonce}."):
                text += hostfs.read_file(box.workspace, rel, MAX_REPORT_BYTES).decode("utf-8", "replace")
    finally:
        box.close()
    return Run(parse(text), text, r.output, r.exit_code, r.timed_out or r.exit_code == CPU_EXHAUSTED)
