"""Running a package's tests in a bubblewrap sandbox and reading per-test outcomes.

Nothing in the workspace may load before or instead of the test runner. Tests run through a
launcher (``rlonce_run.py``) that lives in the read-only testbed, under ``python3 -s -P -B``
with no ``PYTHONPATH``: the workspace is not on ``sys.path`` when the interpreter starts, and
the launcher puts the testbed first, the system's paths next and the package's import root
last, then imports pytest, pluggy and every ``_pytest`` module before any workspace code can
load. It snapshots their functions and classes and checks them (and the registered hooks, and
that no trace function is set) at every test report; it replaces ``sys.settrace``,
``sys.setprofile`` and the heap-walking ``gc`` calls with guards. Outcomes come from its own
hooks.

The report travels on the sandbox's stdout pipe, which the launcher keeps as a private fd while
fds 1 and 2 point at /dev/null, as one line tagged with a per-run random nonce. The nonce is a
workspace file the launcher reads and deletes before anything of the workspace loads (not an
argument, not an environment variable). A missing, malformed, duplicated or tampered report is
no report: the grader decides whose failure that is. What this cannot stop: code that the tests
import runs in the same process, so a determined library can still reach the runner's objects
(``rlonce.envs.code.env`` scans what the agent adds for that, one more layer).

The sandbox also hides every copy of the package under test that the visible system
directories hold (``system_copies``), so the original code is not reachable inside.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import secrets
import shlex
import shutil
from pathlib import Path

from rlonce.envs.code.packages import PackageError, PackageSpec
from rlonce.sandbox.bwrap import BwrapSandbox, Limits

TESTBED_MOUNT = "/opt/rlonce-testbed"
LAUNCHER_NAME = "rlonce_run.py"
REPORT_TAG = "RLONCE-REPORT"
REPORT_CAP = 16 << 20
"""Bytes of sandbox output kept: room for the report of the largest hidden test file."""
SYSTEM_ROOTS = ("/usr",)
"""System directories every sandbox sees (``rlonce.sandbox.bwrap``), searched for package copies."""

LAUNCHER = r'''"""rlonce's test launcher, written into the read-only testbed by rlonce (do not edit).

Run as ``python3 -s -P -B rlonce_run.py NONCE_FILE IMPORT_ROOT GUARDS PYTEST_ARGS...`` in /work. Before
anything of the workspace can load it reads and deletes the nonce file, keeps the write end of
stdout as the report channel and points fds 1 and 2 at /dev/null, sets ``sys.path`` to testbed
first, system next, the package's import root last, imports pytest, pluggy and every ``_pytest``
module, takes a snapshot of their functions and classes, and puts guards in front of tracing
and heap-walking calls. Outcomes come from this file's own hooks; the report is one line,
``RLONCE-REPORT <nonce> <json>``, on the saved fd; then the process ends with ``os._exit``.
"""
import os
import sys


def _main():
    nonce_file, import_root, guards, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    with open(nonce_file) as f:
        nonce = f.read().strip()
    os.unlink(nonce_file)
    sys.argv[:] = [sys.argv[0]]
    channel = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    write, exit_now = os.write, os._exit
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path[:] = [here] + [p for p in sys.path if p and p != here and not p.startswith("/work")] + [import_root]
        os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        report = _prepare(here, import_root, [g for g in guards.split(",") if g])
        dumps = __import__("json").dumps
        pytest = sys.modules["pytest"]
        pytest.main(args, plugins=[report])
        if report.snap is None:
            report.tampered = report.tampered or "pytest never reached its conftests"
        line = "RLONCE-REPORT " + nonce + " " + dumps({"tests": report.out, "tampered": report.tampered}) + "\n"
    except BaseException as e:  # noqa: BLE001 - reported, never a verdict
        line = "RLONCE-ERROR " + type(e).__name__ + ": " + str(e)[:500].replace("\n", " ") + "\n"
    data = line.encode()
    while data:
        data = data[write(channel, data):]
    exit_now(0)


CRITICAL = ("_pytest", "pytest", "pluggy", "py", "iniconfig", "__main__")
AT_END = ("unittest", "json", "builtins", "os", "posix", "io", "threading", "importlib", "gc", "traceback",
          "inspect", "functools", "types", "copy", "sys")


def _prepare(here, import_root, guards):
    import gc  # noqa: F401 - guarded below
    import importlib
    import inspect
    import pkgutil
    import threading  # noqa: F401
    import doctest  # noqa: F401 - pytest imports these late; loaded here, before any workspace code
    import unittest  # noqa: F401
    import json  # noqa: F401
    import pluggy
    import pytest
    import _pytest

    for m in pkgutil.walk_packages(_pytest.__path__, "_pytest."):
        try:
            importlib.import_module(m.name)
        except Exception:  # noqa: BLE001 - optional parts (e.g. needing pexpect)
            pass
    for m in pkgutil.walk_packages(pluggy.__path__, "pluggy."):
        importlib.import_module(m.name)
    _Report.pytest_sessionfinish = pytest.hookimpl(trylast=True)(_Report.pytest_sessionfinish)
    work = os.path.join(import_root.rstrip("/"), "") if import_root != "/work" else "/work/"
    return _Report(here, work, inspect.unwrap, guards)


HOOKS_PYTEST_SETS = ("excepthook", "unraisablehook", "displayhook", "breakpointhook")


def _callables(roots):
    """(live namespace, name, object, label) for every function, class and descriptor of the
    named module families, plus (class namespace, None, its names, label) per class: a later
    check finds any replacement, and any attribute added to or removed from a class."""
    snap = []
    for name, mod in list(sys.modules.items()):
        if mod is None or name.split(".")[0] not in roots:
            continue
        ns = vars(mod)
        for k, v in list(ns.items()):
            if k in HOOKS_PYTEST_SETS:
                continue
            if isinstance(v, type) or callable(v):
                snap.append((ns, k, v, name))
            if isinstance(v, type) and getattr(v, "__module__", None) == name:
                cls_ns = vars(v)
                snap.append((cls_ns, None, frozenset(a for a in cls_ns if not a.startswith("_pytest_")), name + "." + k))
                for a, b in list(cls_ns.items()):
                    if callable(b) or isinstance(b, (property, classmethod, staticmethod)):
                        snap.append((cls_ns, a, b, name + "." + k))
    return snap


def _changed(snap):
    for ns, key, obj, label in snap:
        if key is None:
            if ns.keys() != obj and {a for a in ns if not a.startswith("_pytest_")} != obj:
                return label + " gained or lost attributes"  # (pytest marks classes with _pytest_* flags)
        elif ns.get(key) is not obj:
            return label + "." + key + " was replaced"
    return None


class _Report:
    def __init__(self, here, work, unwrap, guards):
        self.out = {}
        self.tampered = None
        self._here, self._work, self._unwrap = here, work, unwrap
        self._gettrace, self._getprofile = sys.gettrace, sys.getprofile
        for g in guards:  # e.g. "sys.settrace", "gc.get_objects": calls the package itself never makes
            mod, name = g.rsplit(".", 1)
            mod = sys.modules.get(mod)
            if mod is not None and hasattr(mod, name):
                setattr(mod, name, self._denied(g, getattr(mod, name)))
        self.snap = None
        self._hookimpls = None

    def _denied(self, what, original):
        def denied(*a, **k):
            if a == (None,) and not k:  # removing a tracer (doctest does) is harmless
                return original(None)
            self.tampered = self.tampered or what + " was called"
            raise PermissionError(what + " is not available under rlonce's test launcher")
        return denied

    def check(self, when, full=False):
        if self.tampered:
            return
        if self.snap is None:
            self.tampered = "a test ran before pytest loaded its conftests (seen at " + when + ")"
            return
        critical, end = self.snap
        why = _changed(critical) or (_changed(end) if full else None)
        if why is None and (self._gettrace() is not None or self._getprofile() is not None):
            why = "a trace or profile function is set"
        if why is None and self._hookimpls is not None and self._hook_owners() != self._hookimpls:
            why = "the set of registered hook implementations changed"
        if why:
            self.tampered = why + " (seen at " + when + ")"

    def _hook_owners(self):
        return {(n, id(i.function)) for n, hc in vars(self._pm.hook).items()
                for i in (hc.get_hookimpls() if hasattr(hc, "get_hookimpls") else ())}

    def pytest_load_initial_conftests(self, early_config):
        # after pytest's own early patching (legacypath, tryfirst), before any conftest loads (trylast)
        self._pm = early_config.pluginmanager
        self.snap = (_callables(CRITICAL), _callables(AT_END))

    def pytest_sessionfinish(self, session):
        self.check("the end of the session", full=True)

    def pytest_collection_finish(self, session):
        self.check("the end of collection")
        self._hookimpls = self._hook_owners()
        for item in session.items:  # test functions must be the test files' own code
            fn = getattr(item, "obj", None)
            try:
                code = getattr(self._unwrap(getattr(fn, "__func__", fn)), "__code__", None)
            except Exception:  # noqa: BLE001
                code = None
            path = getattr(code, "co_filename", "") or ""
            if path.startswith(self._work) and not _is_test_path(path[len(self._work):]):
                self.tampered = self.tampered or (item.nodeid + " runs code from " + path)

    def pytest_runtest_logreport(self, report):
        self.check(report.nodeid + " (" + report.when + ")", full=report.when == "teardown")
        cur = self.out.get(report.nodeid)
        if report.failed:
            msg = ""
            crash = getattr(report.longrepr, "reprcrash", None)
            if crash is not None:
                msg = str(crash.message)
            elif report.longrepr is not None:
                text = str(report.longrepr)
                msg = text.splitlines()[-1] if text else ""
            self.out[report.nodeid] = {"outcome": "failed", "message": msg[:2000]}
        elif report.skipped and cur is None:
            self.out[report.nodeid] = {"outcome": "skipped", "message": ""}
        elif report.when == "call" and report.passed and cur is None:
            self.out[report.nodeid] = {"outcome": "passed", "message": ""}

    def pytest_collectreport(self, report):
        if report.failed:
            self.out[report.nodeid or "<collection>"] = {"outcome": "error", "message": str(report.longrepr)[-2000:]}


def _is_test_path(rel):
    parts = rel.split("/")
    name = parts[-1]
    return (any(p in ("test", "tests", "testing") for p in parts[:-1]) or name.startswith("test_")
            or name.endswith("_test.py") or name == "conftest.py")


if __name__ == "__main__":
    _main()
'''


def install_launcher(testbed_dir: Path) -> None:
    target = testbed_dir / LAUNCHER_NAME
    if not target.is_file() or target.read_text() != LAUNCHER:
        tmp = testbed_dir / f".{LAUNCHER_NAME}.{secrets.token_hex(4)}"
        tmp.write_text(LAUNCHER)
        os.chmod(tmp, 0o644)
        tmp.replace(target)


def make_sandbox(spec: PackageSpec, testbed_dir: Path, *, timeout: float | None = None,
                 for_agent: bool = False) -> BwrapSandbox:
    """A sandbox with the testbed mounted and every system copy of the package hidden.
    ``for_agent`` (the rollout sandbox) adds ``PYTHONPATH`` so the agent can run pytest itself;
    sandboxes that produce verdicts never get it (``sitecustomize`` would load from it)."""
    install_launcher(testbed_dir)
    limits = Limits(cpu_seconds=600, address_space_mb=4096, processes=128, file_size_mb=64,
                    wall_seconds=timeout or spec.test_timeout, output_bytes=65536)
    if system_copies(spec, (str(testbed_dir),)):
        raise PackageError(f"the testbed {testbed_dir} holds a copy of {spec.name}: it must hold the test runner only")
    hide = sorted({*spec.hide, *system_copies(spec, SYSTEM_ROOTS)})
    env = {"PYTHONHASHSEED": "0"}
    if for_agent:
        env |= {"PYTHONPATH": f"{TESTBED_MOUNT}:{import_root(spec)}", "PYTHONDONTWRITEBYTECODE": "1"}
    return BwrapSandbox(limits, ro_binds={str(testbed_dir): TESTBED_MOUNT}, hide=hide, env=env)


def import_root(spec: PackageSpec) -> str:
    return "/work" if spec.import_root in ("", ".") else f"/work/{spec.import_root}"


def package_dirs(spec: PackageSpec) -> list[str]:
    """The package's own source trees (relative to the sdist root): where the agent's change may
    be carried from. A single-module package is its module file."""
    root = Path(spec.import_root) if spec.import_root not in ("", ".") else Path()
    depth = len(root.parts)
    return sorted({Path(*Path(m).parts[:depth + 1]).as_posix() for m in spec.modules})


def top_level_names(spec: PackageSpec) -> list[str]:
    return sorted({Path(p).name.removesuffix(".py") for p in package_dirs(spec)})


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


@functools.lru_cache(maxsize=64)
def system_copies(spec: PackageSpec, roots: tuple[str, ...]) -> tuple[str, ...]:
    """Every path under ``roots`` that holds a copy of the package: a directory named like a
    top-level package holding ``__init__.py``, a ``<module>.py``, a cached ``<module>.*.pyc``,
    an installed ``*.dist-info``/``*.egg-info`` of the distribution, or an archive of it
    (``.tar.gz``, ``.zip``, ``.whl``). Mount points are crossed (``find -xdev`` misses e.g. a
    separately mounted ``/usr``); links are not followed. Searched once per process."""
    names = {_norm(n) for n in top_level_names(spec)}
    dist = _norm(spec.name)
    found = []
    for root in roots:
        stack = [root]
        while stack:
            d = stack.pop()
            try:
                with os.scandir(d) as it:
                    entries = list(it)
            except OSError:
                continue
            for e in entries:
                n = e.name
                try:
                    is_dir = e.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                low = _norm(n)
                hit = False
                if is_dir:
                    hit = (low in names and os.path.isfile(os.path.join(e.path, "__init__.py"))) or (
                        (low.endswith("_dist_info") or low.endswith("_egg_info")) and low.startswith(dist + "_"))
                    if not hit:
                        stack.append(e.path)
                else:
                    stem = n.split(".")[0].lower()
                    hit = (n.endswith(".py") and _norm(n[:-3]) in names) or (
                        n.endswith(".pyc") and _norm(stem) in names) or (
                        n.endswith((".tar.gz", ".zip", ".whl", ".tgz", ".tar.bz2")) and low.startswith(dist + "_"))
                if hit:
                    found.append(e.path)
    return tuple(sorted(found))


def nonce_file(i: int) -> str:
    return f".rlonce-nonce-{i}"


GUARDS = ("sys.settrace", "sys.setprofile", "sys._current_frames", "threading.settrace", "threading.setprofile",
          "threading.settrace_all_threads", "threading.setprofile_all_threads", "gc.get_objects", "gc.get_referrers",
          "gc.get_referents")
"""Calls the launcher refuses (and reports as tampering) unless the package's own sources make them."""


@functools.lru_cache(maxsize=64)
def guards_for(tree: Path, spec: PackageSpec) -> tuple[str, ...]:
    """``GUARDS`` minus the calls the pristine package ``tree`` itself names (boltons' gcutils
    walks the heap; its own tests must still run)."""
    text = "".join((tree / p).read_text(errors="replace") if (tree / p).is_file() else
                   "".join(f.read_text(errors="replace") for f in sorted((tree / p).rglob("*.py")))
                   for p in package_dirs(spec))
    return tuple(g for g in GUARDS if g.rsplit(".", 1)[1] not in text)


def launcher_command(spec: PackageSpec, targets: list[str], nonce_path: str, guards: tuple[str, ...] = GUARDS) -> str:
    args = ["/usr/bin/python3", "-s", "-P", "-B", f"{TESTBED_MOUNT}/{LAUNCHER_NAME}", nonce_path, import_root(spec),
            ",".join(guards), "-q", "-p", "no:cacheprovider", "--tb=line", *spec.pytest_args, "--", *targets]
    return " ".join(shlex.quote(a) for a in args)


def parse_report(output: str, nonce: str) -> dict | None:
    """The launcher's report for ``nonce`` in ``output``: ``{"tests": {...}, "tampered": ...}``;
    None when it is missing, malformed or present more than once."""
    tag = f"{REPORT_TAG} {nonce} "
    lines = [ln for ln in output.splitlines() if tag in ln]
    if len(lines) != 1:
        return None
    try:
        rep = json.loads(lines[0].split(tag, 1)[1])
    except ValueError:
        return None
    if not isinstance(rep, dict) or not isinstance(rep.get("tests"), dict):
        return None
    if not all(isinstance(v, dict) and isinstance(v.get("outcome"), str) for v in rep["tests"].values()):
        return None
    return rep


def copy_tree(src: Path, dest: Path) -> None:
    """Copy a package tree into a workspace, leaving out caches and build products."""
    ignore = shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.egg-info", "*.pyc", ".rlonce-ok", "build",
                                    "dist", ".git", ".tox", ".mypy_cache", "*.log")
    shutil.copytree(src, dest, symlinks=True, ignore=ignore, dirs_exist_ok=True)


async def run_reports(sandbox: BwrapSandbox, spec: PackageSpec, targets: list[str], *, reruns: int = 1,
                      timeout: float | None = None, guards: tuple[str, ...] = GUARDS) -> list[dict | None]:
    """Run ``targets`` ``reruns`` times in one sandbox call; per rerun its report (see
    ``parse_report``, plus ``seconds``: the mean wall time of a run) or None. Every rerun's nonce is in the workspace from the start, so
    ``reruns`` > 1 is for trees without agent code (building, validation)."""
    sandbox.limits = dataclasses.replace(sandbox.limits, output_bytes=max(sandbox.limits.output_bytes, REPORT_CAP))
    nonces = [secrets.token_hex(16) for _ in range(reruns)]
    for i, n in enumerate(nonces):
        sandbox.put_file(nonce_file(i), n)
    cmds = [launcher_command(spec, targets, f"/work/{nonce_file(i)}", guards) for i in range(reruns)]
    res = await sandbox.exec("; ".join(cmds) + "; true", timeout=(timeout or spec.test_timeout) * reruns)
    reports = [parse_report(res.output, n) for n in nonces]
    for r in reports:
        if r is not None:  # the mean wall time of one run, for sizing and checking timeouts
            r["seconds"] = res.seconds / reruns
    return [None if res.timed_out else r for r in reports]


async def run_tests(sandbox: BwrapSandbox, spec: PackageSpec, targets: list[str], *, reruns: int = 1,
                    timeout: float | None = None, guards: tuple[str, ...] = GUARDS) -> list[dict[str, dict]] | None:
    """Run ``targets`` ``reruns`` times in one sandbox call; per rerun, node id → outcome.
    None when a run produced no usable report (the testbed failed: timeout, crash, no
    interpreter) or saw tampering."""
    reports = await run_reports(sandbox, spec, targets, reruns=reruns, timeout=timeout, guards=guards)
    if any(r is None or r.get("tampered") for r in reports):
        return None
    return [r["tests"] for r in reports]
