"""rlonce's test launcher, written into the read-only testbed by rlonce (do not edit).

Run as ``python3 -s -P -B rlonce_run.py NONCE_FILE IMPORT_ROOT GUARDS PYTEST_ARGS...`` in /work. Before
anything of the workspace can load it reads and deletes the nonce file, keeps the write end of
stdout as the report channel and points fds 1 and 2 at /dev/null, sets ``sys.path`` to testbed
first, system next, the package's import root last, imports pytest, pluggy and every ``_pytest``
module, takes a snapshot of their functions and classes, and puts guards in front of tracing
and heap-walking calls. Outcomes come from this file's own hooks; the report is one line,
``RLONCE-REPORT <nonce> <json>``, on the saved fd; then the process ends with ``os._exit``.

What it cannot stop: code that the tests import runs in this process and can still reach the
runner's objects by routes these checks do not know (``rlonce.envs.code.testbed``). Standard
library and the testbed's pytest only, never rlonce; importing this file runs nothing, so
rlonce's unit tests check its parts directly.
"""
import os
import sys


def main(argv):
    """``argv``: this file, NONCE_FILE, IMPORT_ROOT, GUARDS (comma-separated), pytest's arguments.
    Sends one line on the saved stdout and ends the process; never returns."""
    nonce_file, import_root, guards, args = argv[1], argv[2], argv[3], argv[4:]
    with open(nonce_file) as f:
        nonce = f.read().strip()
    os.unlink(nonce_file)
    sys.argv[:] = [sys.argv[0]]
    channel = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    # taken before any workspace code loads; nothing later looks them up by name
    write, exit_now, format_report, format_error = os.write, os._exit, report_line, error_line
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path[:] = search_path(here, sys.path, import_root)
        os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        report = prepare(here, import_root, [g for g in guards.split(",") if g])
        dumps = __import__("json").dumps
        pytest = sys.modules["pytest"]
        pytest.main(args, plugins=[report])
        if report.snap is None:
            report.tampered = report.tampered or "pytest never reached its conftests"
        line = format_report(nonce, report.out, report.tampered, dumps)
    except BaseException as e:  # noqa: BLE001 - reported, never a verdict
        line = format_error(e)
    data = line.encode()
    while data:
        data = data[write(channel, data):]
    exit_now(0)


def search_path(here, path, import_root):
    """``sys.path`` for the run: the testbed first, then ``path``'s entries (none empty, none under
    /work), the package's import root last."""
    return [here] + [p for p in path if p and p != here and not p.startswith("/work")] + [import_root]


def work_prefix(import_root):
    """The prefix of the package's own files: a test function whose code lives under it must be
    in a test file."""
    return os.path.join(import_root.rstrip("/"), "") if import_root != "/work" else "/work/"


def report_line(nonce, tests, tampered, dumps):
    """The report: ``RLONCE-REPORT <nonce> <json>`` on one line (``rlonce.envs.code.testbed.parse_report``
    reads it). ``dumps`` is ``json.dumps`` as it was before pytest ran."""
    return "RLONCE-REPORT " + nonce + " " + dumps({"tests": tests, "tampered": tampered}) + "\n"


def error_line(e):
    """The line sent instead of a report when the launcher itself failed: never a verdict."""
    return "RLONCE-ERROR " + type(e).__name__ + ": " + str(e)[:500].replace("\n", " ") + "\n"


CRITICAL = ("_pytest", "pytest", "pluggy", "py", "iniconfig", "__main__")
AT_END = ("unittest", "json", "builtins", "os", "posix", "io", "threading", "importlib", "gc", "traceback",
          "inspect", "functools", "types", "copy", "sys")


def prepare(here, import_root, guards):
    """Import pytest, pluggy, every ``_pytest`` module and the modules pytest imports late (doctest,
    unittest, json) before any workspace code, and build the plugin that reports."""
    import doctest  # noqa: F401
    import gc  # noqa: F401 - guarded below
    import importlib
    import inspect
    import json  # noqa: F401
    import pkgutil
    import threading  # noqa: F401
    import unittest  # noqa: F401

    import _pytest
    import pluggy
    import pytest

    for m in pkgutil.walk_packages(_pytest.__path__, "_pytest."):
        try:
            importlib.import_module(m.name)
        except Exception:  # noqa: BLE001, S110 - optional parts (e.g. needing pexpect)
            pass
    for m in pkgutil.walk_packages(pluggy.__path__, "pluggy."):
        importlib.import_module(m.name)
    Report.pytest_sessionfinish = pytest.hookimpl(trylast=True)(Report.pytest_sessionfinish)
    return Report(here, work_prefix(import_root), inspect.unwrap, guards)


HOOKS_PYTEST_SETS = ("excepthook", "unraisablehook", "displayhook", "breakpointhook")


def callables(roots):
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
                names = frozenset(a for a in cls_ns if not a.startswith("_pytest_"))
                snap.append((cls_ns, None, names, name + "." + k))
                for a, b in list(cls_ns.items()):
                    if callable(b) or isinstance(b, (property, classmethod, staticmethod)):
                        snap.append((cls_ns, a, b, name + "." + k))
    return snap


def changed(snap):
    for ns, key, obj, label in snap:
        if key is None:
            if ns.keys() != obj and {a for a in ns if not a.startswith("_pytest_")} != obj:
                return label + " gained or lost attributes"  # (pytest marks classes with _pytest_* flags)
        elif ns.get(key) is not obj:
            return label + "." + key + " was replaced"
    return None


class Report:
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
        why = changed(critical) or (changed(end) if full else None)
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
        self.snap = (callables(CRITICAL), callables(AT_END))

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
            if path.startswith(self._work) and not is_test_path(path[len(self._work):]):
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


def is_test_path(rel):
    parts = rel.split("/")
    name = parts[-1]
    return (any(p in ("test", "tests", "testing") for p in parts[:-1]) or name.startswith("test_")
            or name.endswith("_test.py") or name == "conftest.py")


if __name__ == "__main__":
    main(sys.argv)
