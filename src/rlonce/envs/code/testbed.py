"""Running a package's tests in a bubblewrap sandbox and reading per-test outcomes.

Outcomes come from a machine-readable report written by a small pytest plugin that lives in the
read-only testbed (``rlonce_report``): node id → ``passed`` / ``failed`` / ``skipped``, plus the
crash message of each failure. The exit code is never read as a verdict.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

from rlonce.envs.code.packages import PackageSpec
from rlonce.sandbox.bwrap import BwrapSandbox, Limits

TESTBED_MOUNT = "/opt/rlonce-testbed"
REPORT_DIR = ".rlonce-reports"

PLUGIN = '''"""pytest plugin: per-test outcomes as JSON at $RLONCE_REPORT (written by rlonce's testbed)."""
import json
import os

_out = {}


def pytest_runtest_logreport(report):
    cur = _out.get(report.nodeid)
    if report.failed:
        msg = ""
        crash = getattr(report.longrepr, "reprcrash", None)
        if crash is not None:
            msg = crash.message
        elif report.longrepr is not None:
            msg = str(report.longrepr).splitlines()[-1] if str(report.longrepr) else ""
        _out[report.nodeid] = {"outcome": "failed", "message": msg[:2000]}
    elif report.skipped and cur is None:
        _out[report.nodeid] = {"outcome": "skipped", "message": ""}
    elif report.when == "call" and report.passed and cur is None:
        _out[report.nodeid] = {"outcome": "passed", "message": ""}


def pytest_collectreport(report):
    if report.failed:
        _out[report.nodeid or "<collection>"] = {"outcome": "error", "message": str(report.longrepr)[-2000:]}


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("RLONCE_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(_out, f)
'''


def install_plugin(testbed_dir: Path) -> None:
    target = testbed_dir / "rlonce_report.py"
    if not target.is_file() or target.read_text() != PLUGIN:
        target.write_text(PLUGIN)


def make_sandbox(spec: PackageSpec, testbed_dir: Path, *, timeout: float | None = None) -> BwrapSandbox:
    install_plugin(testbed_dir)
    limits = Limits(cpu_seconds=600, address_space_mb=4096, processes=128, file_size_mb=64,
                    wall_seconds=timeout or spec.test_timeout, output_bytes=65536)
    import_root = "/work" if spec.import_root in ("", ".") else f"/work/{spec.import_root}"
    return BwrapSandbox(limits, ro_binds={str(testbed_dir): TESTBED_MOUNT}, hide=list(spec.hide),
                        env={"PYTHONPATH": f"{TESTBED_MOUNT}:{import_root}", "PYTHONDONTWRITEBYTECODE": "1",
                             "PYTHONHASHSEED": "0"})


def pytest_command(spec: PackageSpec, targets: list[str], report: str) -> str:
    args = ["/usr/bin/python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "rlonce_report",
            "--tb=line", *spec.pytest_args, *targets]
    return f"RLONCE_REPORT={shlex.quote(report)} " + " ".join(shlex.quote(a) for a in args)


def copy_tree(src: Path, dest: Path) -> None:
    """Copy a package tree into a workspace, leaving out caches and build products."""
    ignore = shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.egg-info", "*.pyc", ".rlonce-ok", "build",
                                    "dist", ".git", ".tox", ".mypy_cache", "*.log")
    shutil.copytree(src, dest, symlinks=True, ignore=ignore, dirs_exist_ok=True)


async def run_tests(sandbox: BwrapSandbox, spec: PackageSpec, targets: list[str], *, reruns: int = 1,
                    timeout: float | None = None) -> list[dict[str, dict]] | None:
    """Run ``targets`` ``reruns`` times in one sandbox call; per rerun, node id → outcome.
    None when a run produced no report (the testbed failed: timeout, crash, no interpreter)."""
    sandbox.put_file(f"{REPORT_DIR}/.keep", "")
    cmds = [pytest_command(spec, targets, f"/work/{REPORT_DIR}/r{i}.json") + " >/dev/null 2>&1"
            for i in range(reruns)]
    res = await sandbox.exec("; ".join(cmds) + "; true", timeout=(timeout or spec.test_timeout) * reruns)
    out = []
    for i in range(reruns):
        try:
            out.append(json.loads(sandbox.get_file(f"{REPORT_DIR}/r{i}.json")))
        except (OSError, json.JSONDecodeError):
            return None
    shutil.rmtree(sandbox.workspace / REPORT_DIR, ignore_errors=True)
    if res.timed_out:
        return None
    return out
