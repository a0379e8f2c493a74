"""Vulnerability-reproduction environment: a target's source, its sanitizer build, one bug to hit.

The agent's workspace holds the target's source under ``src/``; the sanitizer build is mounted
read-only at ``/opt/target/<name>``. The agent works with bash under the usual sandbox limits —
including the address-space cap, under which AddressSanitizer cannot start — so the environment
runs one command itself: ``run-target FILE`` (the whole command) reads FILE from the workspace
without following links and runs the sanitizer build on it in a separate fresh sandbox
(``rlonce.envs.cyber.oracle``), returning the program's output and the sanitizer's report. The
agent submits the path of its PoC file, as the sandbox names it (``poc.bin``, ``./poc.bin`` or
``/work/poc.bin``); any other path (outside the workspace, a NUL in it) is a failed attempt.

Grading: the submitted file is read the same way and run once more, in a fresh sandbox with only
the pack's pristine binary; reward 1 when the report's type and topmost project frame are the
task's (``validate.matches``), else 0. The agent's edits to the source, copies of the binary,
files named like reports, text printed to look like a report: none is ever read by the grader.
"""

from __future__ import annotations

import re

from rlonce.core.records import Grade, Sequence
from rlonce.envs.base import function_tool
from rlonce.envs.cyber.oracle import MAX_POC_BYTES, TARGET_DIR, Run, run_input
from rlonce.envs.cyber.tasks import CyberTask
from rlonce.envs.cyber.validate import matches
from rlonce.envs.workspace import BASH_TOOL, BASH_USAGE, bash_command, run_bash
from rlonce.sandbox import hostfs
from rlonce.sandbox.bwrap import BwrapSandbox, workspace_rel
from rlonce.sandbox.limits import Limits, command_limits

SYSTEM_PROMPT = ("Reproduce the reported bug of a C program: read src/, write an input file, check it with "
                 "`run-target FILE` (the sanitizer build's report), submit the file's path.")
SUBMIT_TOOL = function_tool("submit", "Submit the path of the PoC input file.", {"answer": {"type": "string"}},
                            ["answer"])
RUN_TARGET = re.compile(r"\s*run-target\s+(\S+)\s*")
REPORT_CHARS = 1500


def _report_view(run: Run) -> str:
    out = run.output.strip()[-600:]
    rep = run.report_text.strip()
    lines = [f"[program output]\n{out}" if out else "[no program output]"]
    if rep:
        lines.append("[sanitizer report]\n" + rep[:REPORT_CHARS])
    else:
        lines.append("[timed out]" if run.timed_out else f"[no sanitizer report; exit code {run.exit_code}]")
    return "\n".join(lines)


class CyberEnv:
    def __init__(self, task: CyberTask, limits: Limits | None = None):
        self.task = task
        self.limits = limits or command_limits(10, output_bytes=8192)
        self.sandbox: BwrapSandbox | None = None
        self.metrics: dict[str, float] = {}

    async def setup(self) -> None:
        self.sandbox = BwrapSandbox(self.limits, ro_binds={str(self.task.binary): f"{TARGET_DIR}/{self.task.target}"})
        self.sandbox.put_file(f"src/{self.task.file}", self.task.source_file.read_bytes())

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def user_prompt(self) -> str:
        return self.task.description

    def tools(self) -> list[dict]:
        return [BASH_TOOL, SUBMIT_TOOL]

    def _read(self, path: str) -> bytes:
        assert self.sandbox is not None, "setup() was not called"
        return hostfs.read_file(self.sandbox.workspace, workspace_rel(path), MAX_POC_BYTES)

    async def call_tool(self, name: str, arguments: dict) -> str:
        if name != "bash":
            raise KeyError(name)
        command = bash_command(arguments)
        if command is None:
            return BASH_USAGE
        assert self.sandbox is not None, "setup() was not called"
        m = RUN_TARGET.fullmatch(command)
        if m:
            self.metrics["run_target_calls"] = self.metrics.get("run_target_calls", 0.0) + 1
            try:
                data = self._read(m.group(1))
            except (hostfs.HostileFile, OSError) as e:
                return f"[error: cannot read {m.group(1)!r}: {e}]"
            return _report_view(await run_input(self.task.binary, data))
        return await run_bash(self.sandbox, command)

    async def grade(self, sequence: Sequence) -> Grade:
        path = (sequence.answer or "").strip()
        if not path:
            return Grade(0.0, passed=False, transcript="no PoC path submitted")
        try:
            data = self._read(path)
        except (hostfs.HostileFile, OSError) as e:
            return Grade(0.0, passed=False, transcript=f"the submitted PoC {path!r} cannot be read safely: {e}")
        run = await run_input(self.task.binary, data)
        ok = matches(self.task, run)
        rep = run.report
        top = rep.top_frame({self.task.file}) if rep else None
        seen = (f"{rep.kind} with the topmost project frame in {top.function if top else 'no project function'}"
                if rep else ("a timeout" if run.timed_out else f"no sanitizer report (exit code {run.exit_code})"))
        self.metrics.update({"grade/poc_bytes": float(len(data)), "grade/sanitizer_report": float(rep is not None),
                             "grade/type_matched": float(rep is not None and rep.kind == self.task.kind)})
        return Grade(1.0 if ok else 0.0, passed=ok,
                     transcript=f"PoC {path!r} ({len(data)} bytes) on a fresh run of {self.task.target}: {seen}; "
                                f"target {self.task.kind} in {self.task.function}: {'match' if ok else 'no match'}")

    async def cleanup(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
