"""rlonce's test launcher, written into the read-only testbed by rlonce (do not edit).

Run as ``python3 -s -P -B rlonce_run.py NONCE_FILE IMPORT_ROOT GUARDS PYTEST_ARGS... -- TARGETS`` in
/work. Before anything of the workspace can load it reads and deletes the nonce file, keeps the
write end of stdout as the report channel and points fds 1 and 2 at /dev/null, sets ``sys.path``
to testbed first, system next, the package's import root last, imports pytest, pluggy and every
``_pytest`` module, takes a snapshot of their functions and classes (each function's code,
defaults and closure too), puts guards in front of tracing and heap-walking calls, and compiles
the test files it was given (and the conftests above them) the two ways pytest may: plain and
with pytest's assertion rewriting. Outcomes come from this file's own hooks; the report is one
line, ``RLONCE-REPORT <nonce> <json>``, on the saved fd; then the process ends with ``os._exit``.

The tests that run are the test files' own: at the end of collection every collected test must
be a function whose code (under any ``__wrapped__`` layers, which must call what they wrap) is
one the pristine test files compile to, and every function the test modules define must be
too; just before and just after each call, the test's function, its code, defaults, keyword
defaults, closure and ``__wrapped__``, its name in its module or class, and every function of
the test modules and of pytest's and pluggy's modules must be what collection saw. A library
that swaps a test's code (from a thread, at any moment), rebinds a test's name, rewrites a test
file on disk or patches pytest's runner functions in place makes the run tampered.

What it cannot stop: code that the tests import runs in this process and can still reach the
runner's objects by routes these checks do not know (``rlonce.envs.code.testbed``) — a thread
that swaps a test's code and swaps it back inside one call, or a report forged from the
launcher's own frame. Standard library and the testbed's pytest only, never rlonce; importing
this file runs nothing, so rlonce's unit tests check its parts directly.
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
        targets = args[args.index("--") + 1:] if "--" in args else []
        report = prepare(here, import_root, [g for g in guards.split(",") if g], targets)
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
AT_END = ("unittest", "json", "ast", "builtins", "os", "posix", "io", "threading", "importlib", "gc", "traceback",
          "inspect", "functools", "types", "copy", "sys")


def prepare(here, import_root, guards, targets=()):
    """Import pytest, pluggy, every ``_pytest`` module and the modules pytest imports late (doctest,
    unittest, json) before any workspace code, compile the test files ``targets`` name, and build
    the plugin that reports."""
    import ast
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
    Report.pytest_runtest_call = pytest.hookimpl(wrapper=True, tryfirst=True)(Report.pytest_runtest_call)
    Report.pytest_pyfunc_call = pytest.hookimpl(wrapper=True, tryfirst=True)(Report.pytest_pyfunc_call)
    sources = test_sources(targets, os.getcwd())
    rewrite = sys.modules["_pytest.assertion.rewrite"].rewrite_asserts
    report = Report(here, work_prefix(import_root), inspect.unwrap, guards, sources,
                    sys.modules["_pytest.python"].Function)
    hook = sys.modules["_pytest.assertion.rewrite"].AssertionRewritingHook
    report.compilers = (compile, ast.PyCF_ONLY_AST, rewrite, hook)
    return report


def test_sources(targets, cwd):
    """path → bytes of the test files: every ``.py`` test path (``is_test_path``) in the tree of
    each target's top directory (only the top level for a target in ``cwd`` itself), and every
    ``conftest.py`` between ``cwd`` and a target. Read before any workspace code runs; the
    package's own modules are never among them."""
    out = {}
    root = cwd.rstrip("/") + "/"

    def add(path):
        if path not in out and path.startswith(root) and is_test_path(path[len(root):]) and path.endswith(".py") \
                and os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as f:
                out[path] = f.read()

    for t in targets:
        path = os.path.normpath(os.path.join(cwd, t.split("::")[0]))
        if not path.startswith(root):
            continue
        top = path[len(root):].split("/")[0]
        if os.path.isdir(root + top) and not os.path.islink(root + top):
            for d, dirs, files in os.walk(root + top):
                dirs[:] = sorted(x for x in dirs if x not in ("__pycache__", ".git"))
                for name in sorted(files):
                    add(os.path.join(d, name))
        for name in sorted(os.listdir(cwd)) if os.path.isdir(cwd) else ():
            add(root + name)
        add(path)
        d = os.path.dirname(path)
        while d.startswith(root):
            add(os.path.join(d, "conftest.py"))
            d = os.path.dirname(d)
    return out


def pristine_code(source, path, compilers, plain=True, rewritten=True):
    """Qualified name → the code objects the test file ``source`` compiles to, plain and/or with
    pytest's assertion rewriting, nested functions and classes included. ``compilers``: the
    builtin ``compile``, ``ast.PyCF_ONLY_AST``, ``rewrite_asserts`` and pytest's rewriting
    loader class, taken before any workspace code ran. Code objects compare by what they run
    (bytecode, constants, names, first line), not by file name."""
    compile_, only_ast, rewrite = compilers[:3]
    tops = []
    try:
        if plain:
            tops.append(compile_(source, path, "exec", dont_inherit=True))
        if rewritten:
            tree = compile_(source, path, "exec", only_ast, dont_inherit=True)
            rewrite(tree, source, path, None)
            tops.append(compile_(tree, path, "exec", dont_inherit=True))
    except (SyntaxError, ValueError):  # pytest reports the file; nothing of it can run
        pass
    index = {}
    stack = list(tops)
    while stack:
        co = stack.pop()
        index.setdefault(co.co_qualname, set()).add(co)
        stack += [c for c in co.co_consts if type(c) is type(co)]
    return index


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


def states(snap):
    """(object, label, state) for every function, method descriptor and property in ``snap``
    (see ``state``): what ``altered`` compares, so that a function patched in place — its
    ``__code__`` swapped, its defaults or closure changed — counts as replaced."""
    return [(obj, label + "." + key, st) for ns, key, obj, label in snap
            if key is not None and (st := state(obj)) is not None]


def altered(snapped):
    for obj, label, st in snapped:
        if state(obj) != st:
            return label + "'s code, defaults, closure or __wrapped__ changed"
    return None


def codes(snap):
    """(function, its code, label) for every function in ``snap``, those inside method descriptors
    and properties too: ``recoded`` checks them faster than ``altered`` (code only)."""
    out = []
    for _ns, key, obj, label in snap:
        if key is None:
            continue
        inner = obj.__func__ if isinstance(obj, (classmethod, staticmethod)) else obj
        fns = (inner.fget, inner.fset, inner.fdel) if isinstance(inner, property) else (inner,)
        out += [(f, f.__code__, label + "." + key) for f in fns if type(f) is type(state)]
    return out


def recoded(pairs):
    for f, code, label in pairs:
        if f.__code__ is not code:
            return label + "'s code changed"
    return None


_EMPTY = object()


def state(obj):
    """What a call of the function ``obj`` (or the functions a method descriptor or property
    holds) runs with: code, defaults, keyword defaults, closure contents and ``__wrapped__``.
    None for anything else."""
    if isinstance(obj, (classmethod, staticmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        return (state(obj.fget), state(obj.fset), state(obj.fdel))
    if type(obj) is not type(state):
        return None
    cells = []
    for c in obj.__closure__ or ():
        try:
            cells.append(id(c.cell_contents))
        except ValueError:  # an empty cell
            cells.append(None)
    kw = obj.__kwdefaults__
    return (obj.__code__, obj.__defaults__, None if kw is None else tuple((k, id(v)) for k, v in kw.items()),
            tuple(cells), obj.__dict__.get("__wrapped__", _EMPTY))


class Report:
    def __init__(self, here, work, unwrap, guards, sources=None, item_type=None):
        self.out = {}
        self.tampered = None
        self._here, self._work, self._unwrap = here, work, unwrap
        self.sources, self.test_files, self.item_type = sources or {}, frozenset(sources or ()), item_type or ()
        self.compilers, self._compiled, self._loaders = None, {}, {}
        self.function_type, self.method_type = type(state), type(self.check)
        self._defined, self._items, self._states, self._codes = [], None, ([], []), ([], [])
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
        """pytest's and pluggy's functions not replaced; with ``full`` (each teardown) none of the
        snapshot's replaced or given new code; with ``"all"`` (the ends of collection and of the
        session) nor their defaults, closures or ``__wrapped__`` changed."""
        if self.tampered:
            return
        if self.snap is None:
            self.tampered = "a test ran before pytest loaded its conftests (seen at " + when + ")"
            return
        critical, end = self.snap
        why = changed(critical) or (
            (recoded(self._codes[0]) or changed(end) or recoded(self._codes[1])) if full else None)
        if why is None and full == "all":
            why = altered(self._states[0]) or altered(self._states[1])
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
        self._states = (states(self.snap[0]), states(self.snap[1]))
        self._codes = (codes(self.snap[0]), codes(self.snap[1]))

    def pytest_sessionfinish(self, session):
        self.check("the end of the session", full="all")

    def pytest_collection_finish(self, session):
        self.check("the end of collection", full="all")
        self._hookimpls = self._hook_owners()
        for item in session.items:  # no test runs the package's own code as its body
            fn = getattr(item, "obj", None)
            try:
                code = getattr(self._unwrap(getattr(fn, "__func__", fn)), "__code__", None)
            except Exception:  # noqa: BLE001
                code = None
            path = getattr(code, "co_filename", "") or ""
            if path.startswith(self._work) and not is_test_path(path[len(self._work):]):
                self.tampered = self.tampered or (item.nodeid + " runs code from " + path)
        try:
            self._watch_tests(session)
        except Exception as e:  # noqa: BLE001 - a test object that cannot even be inspected
            self.tampered = self.tampered or ("a collected test could not be inspected: " + type(e).__name__)

    def _watch_tests(self, session):
        """Check every collected test, and every function the test files define, against the
        pristine test files, and remember what each call must find: ``self._defined`` (every such
        function, with its state, and where it is bound), ``self._items`` (per test: its
        function's layers, and its name in its module or class)."""
        files = self.test_files
        self._defined = []
        if self.compilers is None:  # built without the test files (rlonce's unit tests)
            return
        for name, mod in list(sys.modules.items()):
            if mod is not None and getattr(mod, "__file__", None) in files:
                self._loaders[mod.__file__] = isinstance(getattr(mod, "__loader__", None), self.compilers[3])
                self._defined += self._test_functions(vars(mod), name, name)
        for item in session.items:
            info = getattr(item, "_fixtureinfo", None)
            for defs in (getattr(info, "name2fixturedefs", None) or {}).values():
                for d in defs:
                    f = getattr(d, "func", None)
                    if type(f) is self.function_type and f.__code__.co_filename in files:
                        self._defined.append(({"": f}, "", f, "fixture " + d.argname, state(f)))
        for _ns, key, obj, label, _st in self._defined:
            why = self._pristine(state(obj)[0], None)
            if why:
                return self._tamper(label + "." + key + " " + why)
        self._items = {}
        for item in session.items:
            if not isinstance(item, self.item_type):
                continue
            layers = self._layers(item.obj)
            if not layers:
                return self._tamper(item.nodeid + " is not a function")
            why = self._pristine(layers[-1].__code__, self._qualname(item))
            for outer, inner in zip(layers, layers[1:]):
                path = outer.__code__.co_filename
                if why is None and self._pristine(outer.__code__, None) is not None:
                    if path.startswith(self._work) or path in files:
                        why = "runs a wrapper whose code is not the test file's (" + path + ")"
                    elif id(inner) not in state(outer)[3]:
                        why = "runs a wrapper that does not hold the function it wraps (" + path + ")"
            if why:
                return self._tamper(item.nodeid + " " + why)
            ns = vars(item.cls if item.cls is not None else item.module)
            self._items[item.nodeid] = (layers[0], [(f, state(f)) for f in layers], ns, item.originalname,
                                        ns.get(item.originalname, _EMPTY))

    def _test_functions(self, ns, label, module, prefix=""):
        """(namespace, name, function, label, state) for every function of the test files bound in
        ``ns`` (a test module's namespace, then those of the classes it defines)."""
        out = []
        for k, v in list(ns.items()):
            f = v.__func__ if isinstance(v, (classmethod, staticmethod)) else v
            if type(f) is self.function_type and f.__code__.co_filename in self.test_files:
                out.append((ns, k, v, label, state(v)))
            elif isinstance(v, type) and v.__module__ == module and v.__qualname__ == prefix + k:
                out += self._test_functions(vars(v), label + "." + k, module, prefix + k + ".")
        return out

    def _tamper(self, why):
        self.tampered = self.tampered or why

    def _layers(self, fn):
        """The functions a call of ``fn`` runs through: ``fn`` (a bound method's function), then
        each ``__wrapped__`` in turn; empty when ``fn`` is not a function."""
        out = []
        while len(out) < 64:
            if type(fn) is self.method_type:
                fn = fn.__func__
            if type(fn) is not self.function_type or fn in out:
                break
            out.append(fn)
            fn = fn.__dict__.get("__wrapped__")
        return out

    def _qualname(self, item):
        names = [item.originalname]
        node = item.parent
        while node is not None and getattr(node, "cls", None) is not None and node.obj is node.cls:
            names.append(node.name)
            node = node.parent
        return ".".join(reversed(names))

    def _pristine(self, code, qualname):
        """None when ``code`` is one the test file it names compiles to (and, when that file
        defines a function named ``qualname``, one of those); else why not. Each file is compiled
        once, when first needed: the way its module was loaded, both ways if it was not."""
        path = code.co_filename
        if path not in self.sources:
            return "runs code that is not in a test file (" + path + ")"
        index = self._compiled.get(path)
        if index is None:
            rewritten = self._loaders.get(path)
            index = self._compiled[path] = pristine_code(self.sources[path], path, self.compilers,
                                                         plain=rewritten is not True, rewritten=rewritten is not False)
        same = index.get(qualname) if qualname else None
        if same:
            return None if code in same else "runs code that is not its definition in " + path
        if any(code in group for group in index.values()):
            return None
        return "runs code that " + path + " does not compile to"

    def check_item(self, item, when, full=False):
        """The test about to run (or just run) is the one collection saw: same function, code,
        defaults, closure and layers, bound to its name; with ``full``, every function of the test
        modules unchanged too."""
        if self.tampered or self._items is None:
            return
        try:
            why = None
            for ns, key, obj, label, st in self._defined if full else ():
                if ns.get(key, _EMPTY) is not obj:
                    why = label + "." + key + " was rebound"
                elif state(obj) != st:
                    why = label + "." + key + "'s code, defaults, closure or __wrapped__ changed"
                if why:
                    break
            watch = self._items.get(item.nodeid)
            if why is None and watch is not None:
                outer, layers, ns, name, bound = watch
                fn = item.obj
                if type(fn) is self.method_type:
                    fn = fn.__func__
                if fn is not outer:
                    why = item.nodeid + " is not the function collection saw"
                elif any(state(f) != st for f, st in layers):
                    why = item.nodeid + "'s code, defaults, closure or __wrapped__ changed"
                elif ns.get(name, _EMPTY) is not bound:
                    why = item.nodeid + "'s name was rebound"
        except Exception as e:  # noqa: BLE001
            why = item.nodeid + " could not be inspected: " + type(e).__name__
        if why:
            self._tamper(why + " (seen " + when + ")")

    def pytest_runtest_call(self, item):
        self.check_item(item, "before its call", full=True)
        try:
            return (yield)
        finally:
            self.check_item(item, "after its call", full=True)

    def pytest_pyfunc_call(self, pyfuncitem):
        self.check_item(pyfuncitem, "before its call")
        try:
            return (yield)
        finally:
            self.check_item(pyfuncitem, "after its call")

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
