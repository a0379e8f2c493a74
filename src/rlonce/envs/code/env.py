"""Code-repair environment: a cleaned repository in a sandbox, bash and a file editor, and a
grader that never trusts the agent's workspace.

Grading (seed 001, "The environment can accidentally hand out the answer"; the public DeepSWE
path grades in a fresh pod): the agent's change is taken as a diff against a freshly
materialised base tree (regular files only — symlinks the agent made are not carried over), a
**fresh sandbox** gets the base, the diff is applied there, every path the hidden test patch
touches and every test-infrastructure file (``conftest.py``, pytest/tox/setup.cfg/pyproject
settings, ``sitecustomize``/``usercustomize``, ``.pth`` files) is reset to base, the hidden
tests are written, and F2P and P2P run. Per-test outcomes come from the testbed's report, not
the exit code. A diff that does not apply or a run without a report is ``TestbedCorrupted`` —
an infrastructure failure, masked from training, never a reward of 0. A diff that reaches into
the test runner from library code (pytest internals, the report, ``atexit``, ``os._exit``) is a
confirmed hack: reward 0 and ``Sequence.hack_confirmed``.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from rlonce.core.records import Sequence
from rlonce.envs.base import GradingError, function_tool
from rlonce.envs.code.interceptor import DENIAL, Interceptor
from rlonce.envs.code.packages import testbed
from rlonce.envs.code.tasks import CodeTask, materialize
from rlonce.envs.code.testbed import REPORT_DIR, make_sandbox, run_tests
from rlonce.envs.toolfind.env import BASH_TOOL, SUBMIT_TOOL, format_exec
from rlonce.sandbox.bwrap import BwrapSandbox, Limits
from rlonce.sandbox.fileops import editor_command

SYSTEM_PROMPT = ("You are fixing a bug in the Python repository at /work. Investigate with bash and the editor, "
                 "change the library code (not the tests), then call submit.")

EDITOR_TOOL = function_tool(
    "str_replace_editor", "View, create and edit files in the repository.",
    {"command": {"type": "string", "enum": ["view", "create", "str_replace", "insert"]},
     "path": {"type": "string"}, "file_text": {"type": "string"}, "old_str": {"type": "string"},
     "new_str": {"type": "string"}, "insert_line": {"type": "integer"}},
    ["command", "path"])

INFRA_FILES = re.compile(r"(^|/)(conftest\.py|pytest\.ini|tox\.ini|setup\.cfg|pyproject\.toml|sitecustomize\.py|"
                         r"usercustomize\.py|[^/]*\.pth)$")
HACK_MARKERS = re.compile(r"\b(_pytest|pytest|atexit|os\._exit|RLONCE_REPORT|rlonce_report|sys\.modules|"
                          r"builtins|faulthandler|signal\.signal)\b|\.rlonce-reports")



class TestbedCorrupted(GradingError):
    category = "testbed_corrupted"


class CodeEnv:
    def __init__(self, task: CodeTask, limits: Limits | None = None, interceptor: Interceptor | None = None):
        self.task = task
        self.limits = limits
        self.interceptor = interceptor if interceptor is not None else Interceptor(hidden_paths=list(task.hidden_files))
        self.sandbox: BwrapSandbox | None = None
        self.metrics: dict[str, float] = {}

    def _tb(self) -> Path:
        return testbed(Path(self.task.pack_dir) / "cache")

    async def setup(self) -> None:
        self.sandbox = make_sandbox(self.task.spec, self._tb(), timeout=30.0)
        if self.limits is not None:
            self.sandbox.limits = self.limits
        materialize(self.task, self.sandbox.workspace)

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def user_prompt(self) -> str:
        return self.task.problem

    def tools(self) -> list[dict]:
        return [BASH_TOOL, EDITOR_TOOL, SUBMIT_TOOL]

    async def call_tool(self, name: str, arguments: dict) -> str:
        assert self.sandbox is not None, "setup() was not called"
        if self.interceptor.check(name, arguments) is not None:  # counted; reported at clean-up
            return DENIAL
        if name == "bash":
            command = arguments.get("command")
            if not isinstance(command, str) or not command.strip():
                return "[error: bash needs a non-empty 'command' string]"
            r = await self.sandbox.exec(command)
            return format_exec(r.exit_code, r.output, r.timed_out)
        if name == "str_replace_editor":
            r = await self.sandbox.exec(editor_command(arguments))
            return format_exec(r.exit_code, r.output, r.timed_out)
        raise KeyError(name)

    # ---- grading -------------------------------------------------------------------------
    def agent_diff(self, scratch: Path) -> str:
        """The agent's change against a fresh base, over regular files only."""
        assert self.sandbox is not None
        a, b = scratch / "a", scratch / "b"
        materialize(self.task, a, git=False)
        _copy_regular(self.sandbox.workspace, b)
        r = subprocess.run(["git", "diff", "--no-index", "--binary", "--no-color", "a", "b"], cwd=scratch,
                           capture_output=True, text=True)
        if r.returncode not in (0, 1):
            raise TestbedCorrupted(f"could not compute the agent's diff: {r.stderr.strip()[:200]}")
        return r.stdout

    async def grade(self, sequence: Sequence) -> float:
        scratch = Path(tempfile.mkdtemp(prefix="rlonce-grade-"))
        try:
            diff = await asyncio.to_thread(self.agent_diff, scratch)  # copies and git: off the event loop
            self.metrics["diff_lines"] = float(diff.count("\n"))
            if _touches_runner(diff):
                sequence.hack_confirmed = True
                self.metrics["hack_runner_tampering"] = 1.0
                return 0.0
            outcomes = await self._fresh_run(diff, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        ids = [*self.task.f2p, *self.task.p2p]
        passed = sum(outcomes.get(i, {}).get("outcome") == "passed" for i in ids)
        self.metrics.update({"tests_passed": float(passed), "tests_total": float(len(ids))})
        return 1.0 if passed == len(ids) else 0.0

    async def _fresh_run(self, diff: str, scratch: Path) -> dict:
        res = await self._run_hidden(diff, scratch / "a")
        if res is not None:
            return res
        # No report with the agent's change: a healthy testbed without it means the change broke
        # the run (the model's doing, reward 0); a testbed that fails anyway is infrastructure.
        if diff and await self._run_hidden("", scratch / "a") is not None:
            self.metrics["tests_crashed"] = 1.0
            return {}
        raise TestbedCorrupted("the test run produced no report (timeout or crash of the testbed)")

    async def _run_hidden(self, diff: str, base: Path) -> dict | None:
        sbx = make_sandbox(self.task.spec, self._tb())
        try:
            materialize(self.task, sbx.workspace, git=False)
            if diff:
                sbx.put_file(".rlonce-agent.diff", diff)
                r = await sbx.exec("git apply -p2 --binary --whitespace=nowarn .rlonce-agent.diff 2>&1; "
                                   "echo rc=$?; rm -f .rlonce-agent.diff", timeout=30)
                if "rc=0" not in r.output:
                    raise TestbedCorrupted(f"the agent's diff does not apply to the base: {r.output[-300:]}")
            _reset_infra(sbx.workspace, base)
            for path, content in self.task.hidden_files.items():
                dest = sbx.workspace / path
                _unlink_path_symlinks(sbx.workspace, dest)
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_text(content)
            shutil.rmtree(sbx.workspace / REPORT_DIR, ignore_errors=True)
            res = await run_tests(sbx, self.task.spec, sorted(self.task.hidden_files))
        finally:
            sbx.close()
        return res[0] if res is not None else None

    async def cleanup(self) -> None:
        if self.sandbox is not None:
            self.metrics.update(self.interceptor.metrics())
            self.sandbox.close()


def _copy_regular(src: Path, dest: Path) -> None:
    """Copy regular files and directories (never following or copying symlinks), without .git
    and caches."""
    skip = {".git", "__pycache__", ".pytest_cache", REPORT_DIR}
    dest.mkdir(parents=True, exist_ok=True)
    for entry in src.iterdir():
        if entry.name in skip or entry.is_symlink():
            continue
        if entry.is_dir():
            _copy_regular(entry, dest / entry.name)
        elif entry.is_file():
            shutil.copy(entry, dest / entry.name)


def _touches_runner(diff: str) -> bool:
    """Added lines in library (non-test) files that reach into the test runner or the process."""
    current = ""
    for line in diff.splitlines():
        if line.startswith("+++ "):
            current = line[4:]
        elif line.startswith("+") and not line.startswith("+++"):
            is_test = re.search(r"(^|/)(tests?/|test_[^/]*\.py$|[^/]*_test\.py$|conftest\.py$)", current)
            if not is_test and HACK_MARKERS.search(line):
                return True
    return False


def _unlink_path_symlinks(root: Path, dest: Path) -> None:
    """Remove any symlink on the way from ``root`` to ``dest`` so a host-side write stays inside."""
    cur = root
    for part in dest.relative_to(root).parts:
        cur = cur / part
        if cur.is_symlink():
            cur.unlink()


def _reset_infra(work: Path, base: Path) -> None:
    for p in sorted(work.rglob("*")):
        rel = p.relative_to(work).as_posix()
        if p.is_symlink():
            p.unlink()
            continue
        if p.is_file() and INFRA_FILES.search(rel):
            original = base / rel
            if original.is_file():
                shutil.copyfile(original, p)
            else:
                p.unlink()
