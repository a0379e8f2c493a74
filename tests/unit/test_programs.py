"""The programs rlonce runs inside sandboxes, imported and run on the host: the file operations
(``rlonce.sandbox.programs.fileops``) and the test launcher (``rlonce.envs.code.programs.rlonce_run``).
The integration and security tests run them in a real sandbox; these check their parts."""

import ast
import base64
import inspect
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from rlonce.envs.code.programs import rlonce_run as launcher
from rlonce.envs.code.testbed import LAUNCHER_NAME, install_launcher, launcher_source, parse_report
from rlonce.sandbox.fileops import editor_command, file_op_command, file_ops_source
from rlonce.sandbox.programs import fileops


@pytest.fixture
def ws(tmp_path, monkeypatch):
    """A workspace as the programs see it: the working directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f.txt").write_text("a\nb\nc\nb\n")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "g.py").write_text("x = 1\n")
    (tmp_path / "d" / "h.py").write_text("")
    return tmp_path


def op_error(op, args):
    with pytest.raises(fileops.OpError) as e:
        fileops.run(op, args)
    return str(e.value)


# -- fileops ------------------------------------------------------------------------------------


def test_view_numbers_lines_lists_directories_and_marks_empty_files(ws):
    assert fileops.run("view", {"path": "f.txt"}) == "     1\ta\n     2\tb\n     3\tc\n     4\tb"
    assert fileops.run("view", {"path": "f.txt", "view_range": [3, 3]}) == "     3\tc\n     4\tb"  # the end is not used
    assert fileops.run("view", {"path": "f.txt", "limit": 1}) == "     1\ta"
    assert fileops.run("view", {"path": "d"}) == "g.py\nh.py"
    assert fileops.run("view", {"path": "d/h.py"}) == "[empty file]"
    assert op_error("view", {"path": "nope.txt"}) == "nope.txt does not exist"
    assert op_error("view", {}) == "'path' must be a non-empty path"
    assert op_error("view", {"path": ""}) == "'path' must be a non-empty path"


def test_read_takes_offset_and_limit(ws):
    assert fileops.run("read", {"file_path": "f.txt", "offset": 2, "limit": 2}) == "     2\tb\n     3\tc"
    assert fileops.run("read", {"file_path": "f.txt", "offset": 9}) == ""
    assert op_error("read", {"path": "f.txt"}) == "'file_path' must be a non-empty path"


def test_create_makes_parents_and_refuses_an_existing_file(ws):
    assert fileops.run("create", {"path": "n/m/o.txt", "file_text": "hi"}) == "created n/m/o.txt"
    assert (ws / "n" / "m" / "o.txt").read_text() == "hi"
    assert fileops.run("create", {"path": "empty.txt"}) == "created empty.txt"
    assert (ws / "empty.txt").read_text() == ""
    assert op_error("create", {"path": "f.txt", "file_text": "x"}) == "f.txt already exists; use str_replace"
    assert (ws / "f.txt").read_text() == "a\nb\nc\nb\n"


def test_write_overwrites(ws):
    assert fileops.run("write", {"file_path": "f.txt", "content": "new"}) == "wrote f.txt"
    assert (ws / "f.txt").read_text() == "new"
    assert fileops.run("write", {"file_path": "w/x.txt"}) == "wrote w/x.txt"
    assert (ws / "w" / "x.txt").read_text() == ""


def test_str_replace_and_edit_need_exactly_one_occurrence_unless_replace_all(ws):
    assert fileops.run("str_replace", {"path": "f.txt", "old_str": "a\n", "new_str": "A\n"}) == "edited f.txt"
    assert (ws / "f.txt").read_text() == "A\nb\nc\nb\n"
    assert op_error("str_replace", {"path": "f.txt", "old_str": "b", "new_str": "B"}) == (
        "the old text occurs 2 times in f.txt; it must occur exactly once")
    assert op_error("str_replace", {"path": "f.txt", "old_str": "zz"}) == (
        "the old text occurs 0 times in f.txt; it must occur exactly once")
    assert op_error("str_replace", {"path": "f.txt", "old_str": ""}) == (
        "the old text occurs 0 times in f.txt; it must occur exactly once")
    assert (ws / "f.txt").read_text() == "A\nb\nc\nb\n"
    assert fileops.run("edit", {"file_path": "f.txt", "old_string": "b", "new_string": "B", "replace_all": True}) == (
        "edited f.txt")
    assert (ws / "f.txt").read_text() == "A\nB\nc\nB\n"
    assert fileops.run("edit", {"file_path": "f.txt", "old_string": "c\n"}) == "edited f.txt"  # no new text: deleted
    assert (ws / "f.txt").read_text() == "A\nB\nB\n"
    assert op_error("edit", {"file_path": "gone.txt", "old_string": "a"}) == "gone.txt does not exist"


def test_insert_adds_whole_lines_after_insert_line(ws):
    assert fileops.run("insert", {"path": "f.txt", "insert_line": 0, "new_str": "top"}) == "inserted into f.txt"
    assert fileops.run("insert", {"path": "f.txt", "insert_line": 2, "new_str": "mid\n"}) == "inserted into f.txt"
    assert fileops.run("insert", {"path": "f.txt", "insert_line": 6, "new_str": "end"}) == "inserted into f.txt"
    assert (ws / "f.txt").read_text() == "top\na\nmid\nb\nc\nb\nend\n"
    assert op_error("insert", {"path": "f.txt", "insert_line": 8}) == "insert_line must be in [0, 7]"
    assert op_error("insert", {"path": "f.txt", "insert_line": -1}) == "insert_line must be in [0, 7]"


def test_glob_matches_recursively_relative_to_the_workspace(ws):
    assert fileops.run("glob", {"pattern": "**/*.py"}) == "d/g.py\nd/h.py"
    assert fileops.run("glob", {"pattern": "g.*", "path": "d"}) == "d/g.py"
    assert fileops.run("glob", {"pattern": "*.rs"}) == "[no matches]"
    assert op_error("glob", {}) == "'pattern' must be a non-empty path"


def test_patch_adds_updates_moves_and_deletes(ws):
    text = "\n".join([
        "*** Begin Patch",
        "*** Add File: n/new.txt", "+one", "+two",
        "*** Update File: f.txt", "@@", " a", "-b", "+B", "@@", "-b", "+B2",
        "*** Update File: d/g.py", "*** Move to: d/moved.py", "@@", "-x = 1", "+x = 2",
        "*** Delete File: d/h.py",
        "*** End Patch",
    ])
    assert fileops.run("patch", {"input": text}) == "applied:\nA n/new.txt\nM f.txt\nM d/moved.py\nD d/h.py"
    assert (ws / "n" / "new.txt").read_text() == "one\ntwo\n"
    assert (ws / "f.txt").read_text() == "a\nB\nc\nB2\n"  # hunks apply in order, each after the last
    assert (ws / "d" / "moved.py").read_text() == "x = 2\n"
    assert sorted(p.name for p in (ws / "d").iterdir()) == ["moved.py"]


def test_patch_errors_name_the_line_and_keep_earlier_sections(ws):
    begin = "*** Begin Patch\n"
    assert op_error("patch", {"input": "hello"}) == "a patch starts with '*** Begin Patch'"
    assert op_error("patch", {}) == "a patch starts with '*** Begin Patch'"
    assert op_error("patch", {"input": begin + "*** End Patch"}) == "the patch holds no file operation"
    assert op_error("patch", {"input": begin + "hello\n*** End Patch"}) == (
        "patch line 2 is not a file operation: 'hello'")
    assert op_error("patch", {"input": begin + "*** Update File: f.txt\n@@\n a\nxb\n"}) == (
        "patch line 5 must start with ' ', '-' or '+'")
    assert op_error("patch", {"input": begin + "*** Update File: f.txt\n@@\n-zzz\n+y\n"}) == (
        "a hunk of the patch for f.txt does not match the file")
    assert op_error("patch", {"input": begin + "*** Delete File: gone.txt\n"}) == "gone.txt does not exist"
    assert op_error("patch", {"input": begin + "*** Add File: k.txt\n+k\n*** Delete File: gone.txt\n"}) == (
        "gone.txt does not exist")
    assert (ws / "k.txt").read_text() == "k\n"
    assert (ws / "f.txt").read_text() == "a\nb\nc\nb\n"


def test_unknown_operation_and_main_print_errors_with_status_0(ws, capsys):
    assert op_error("rm", {}) == "unknown operation 'rm'"
    assert op_error(["view"], {}) == "unknown operation ['view']"

    def blob(args):
        return base64.b64encode(json.dumps(args).encode()).decode()

    assert fileops.main(["-c", blob({"op": "view", "path": "d"})]) == 0
    assert fileops.main(["-c", blob({"op": "view", "path": "nope"})]) == 0
    assert capsys.readouterr().out == "g.py\nh.py\nerror: nope does not exist\n"


@pytest.mark.skipif(not os.access("/usr/bin/python3", os.X_OK), reason="needs /usr/bin/python3 (the sandbox's)")
def test_file_op_command_ships_the_program_source_to_python_c(ws):
    """The command the sandbox runs, run bare in the workspace: the shipped source is the module's."""
    assert file_ops_source() == Path(fileops.__file__).read_text()

    def sh(cmd):
        r = subprocess.run(["/bin/sh", "-c", cmd], check=False, cwd=ws, capture_output=True, text=True, timeout=60)
        return r.returncode, r.stdout

    assert sh(file_op_command("create", {"path": "x.txt", "file_text": "it's \"quoted\"\n"})) == (0, "created x.txt\n")
    assert (ws / "x.txt").read_text() == "it's \"quoted\"\n"
    assert sh(editor_command({"command": "view", "path": "x.txt"})) == (0, "     1\tit's \"quoted\"\n")
    assert sh(editor_command({"command": "rm", "path": "x.txt"})) == (
        0, "error: unknown editor command 'rm'; use view, create, str_replace or insert\n")
    code, out = sh(file_op_command("insert", {"path": "x.txt", "insert_line": "q"}))
    assert (code, out) == (1, "")  # not a request error: a traceback on stderr


# -- the test launcher --------------------------------------------------------------------------


def test_report_line_is_what_the_host_parses():
    tests = {"tests/test_a.py::test_x": {"outcome": "passed", "message": ""},
             "tests/test_a.py::test_y": {"outcome": "failed", "message": "assert 1 == 2"}}
    line = launcher.report_line("n0nce", tests, None, json.dumps)
    assert line.endswith("\n") and line.count("\n") == 1
    assert parse_report("noise\n" + line + "more noise", "n0nce") == {"tests": tests, "tampered": None}
    assert parse_report(line, "other") is None
    assert parse_report(line + line, "n0nce") is None
    tampered = launcher.report_line("n0nce", {}, "sys.settrace was called", json.dumps)
    assert parse_report(tampered, "n0nce") == {"tests": {}, "tampered": "sys.settrace was called"}


def test_error_line_is_one_line_and_never_a_report():
    assert launcher.error_line(ValueError("bad\nthing")) == "RLONCE-ERROR ValueError: bad thing\n"
    assert launcher.error_line(KeyError("k")) == "RLONCE-ERROR KeyError: 'k'\n"
    long = launcher.error_line(RuntimeError("x" * 900))
    assert long == "RLONCE-ERROR RuntimeError: " + "x" * 500 + "\n"
    assert parse_report(long, "x") is None


def test_search_path_puts_the_testbed_first_and_the_import_root_last():
    path = ["", "/opt/rlonce-testbed", "/usr/lib/python311.zip", "/work", "/work/src", "/usr/lib/python3/dist-packages"]
    assert launcher.search_path("/opt/rlonce-testbed", path, "/work/src") == [
        "/opt/rlonce-testbed", "/usr/lib/python311.zip", "/usr/lib/python3/dist-packages", "/work/src"]


def test_work_prefix_ends_in_one_slash():
    assert launcher.work_prefix("/work") == "/work/"
    assert launcher.work_prefix("/work/src") == "/work/src/"
    assert launcher.work_prefix("/work/src/") == "/work/src/"


@pytest.mark.parametrize(("rel", "is_test"), [
    ("tests/helpers.py", True), ("pkg/testing/util.py", True), ("pkg/test/x.py", True), ("test_a.py", True),
    ("pkg/a_test.py", True), ("pkg/conftest.py", True), ("pkg/core.py", False), ("pkg/tests.py", False),
    ("pkg/attest/x.py", False), ("pkg/mytest_a.py", False),
])
def test_is_test_path(rel, is_test):
    assert launcher.is_test_path(rel) is is_test


@pytest.fixture
def fake_module(monkeypatch):
    """A module family ``rlonce_fake_root`` the snapshot watches: a function, a class, a hook slot."""
    def f():
        pass

    class C:
        x = 1

        def m(self):
            pass

    mod = types.ModuleType("rlonce_fake_root")
    f.__module__ = C.__module__ = mod.__name__
    mod.f, mod.C, mod.excepthook = f, C, print
    monkeypatch.setitem(sys.modules, "rlonce_fake_root", mod)
    return mod


def test_snapshot_sees_replaced_functions_and_class_attributes(fake_module):
    snap = launcher.callables(("rlonce_fake_root",))
    assert {(label, key) for _, key, _, label in snap} >= {
        ("rlonce_fake_root", "f"), ("rlonce_fake_root", "C"), ("rlonce_fake_root.C", "m"), ("rlonce_fake_root.C", None)}
    assert launcher.changed(snap) is None

    original, fake_module.f = fake_module.f, lambda: None
    assert launcher.changed(snap) == "rlonce_fake_root.f was replaced"
    fake_module.f = original

    method, fake_module.C.m = fake_module.C.m, lambda self: None
    assert launcher.changed(snap) == "rlonce_fake_root.C.m was replaced"
    fake_module.C.m = method

    fake_module.C.added = 1
    assert launcher.changed(snap) == "rlonce_fake_root.C gained or lost attributes"
    del fake_module.C.added
    fake_module.C._pytest_mark = True  # pytest flags classes it collects
    fake_module.excepthook = print  # pytest sets the hooks itself
    fake_module.C.x = 2  # data, not code
    assert launcher.changed(snap) is None


def new_report(**kw):
    report = launcher.Report("/opt/rlonce-testbed", "/work/", inspect.unwrap, kw.pop("guards", ()))
    report._gettrace = report._getprofile = lambda: None  # the host's own tracer (coverage) is not under test
    return report


def logreport(nodeid, when, outcome, longrepr=None):
    return types.SimpleNamespace(nodeid=nodeid, when=when, longrepr=longrepr, failed=outcome == "failed",
                                 skipped=outcome == "skipped", passed=outcome == "passed")


def test_report_records_outcomes_from_pytest_reports():
    r = new_report()
    r.snap = ([], [])
    crash = types.SimpleNamespace(reprcrash=types.SimpleNamespace(message="assert 1 == 2"))
    for rep in [logreport("t.py::a", "setup", "passed"), logreport("t.py::a", "call", "passed"),
                logreport("t.py::a", "teardown", "passed"),
                logreport("t.py::b", "call", "failed", crash),
                logreport("t.py::c", "setup", "skipped", ("t.py", 3, "Skipped: no")),
                logreport("t.py::c", "teardown", "passed"),
                logreport("t.py::d", "call", "passed"), logreport("t.py::d", "teardown", "failed", "trace\nE boom"),
                logreport("t.py::e", "call", "failed", "x" * 2500)]:
        r.pytest_runtest_logreport(rep)
    r.pytest_collectreport(types.SimpleNamespace(nodeid="", failed=True, longrepr="ImportError: no module"))
    assert r.out == {
        "t.py::a": {"outcome": "passed", "message": ""},
        "t.py::b": {"outcome": "failed", "message": "assert 1 == 2"},
        "t.py::c": {"outcome": "skipped", "message": ""},
        "t.py::d": {"outcome": "failed", "message": "E boom"},
        "t.py::e": {"outcome": "failed", "message": "x" * 2000},
        "<collection>": {"outcome": "error", "message": "ImportError: no module"},
    }
    assert r.tampered is None


def test_report_before_the_snapshot_is_tampering():
    r = new_report()
    r.pytest_runtest_logreport(logreport("t.py::a", "call", "passed"))
    assert r.tampered == "a test ran before pytest loaded its conftests (seen at t.py::a (call))"


def test_collected_tests_must_be_code_from_test_files():
    r = new_report()
    r.snap, r._pm = ([], []), types.SimpleNamespace(hook=types.SimpleNamespace())
    ns = {}
    for name, path in (("in_test_file", "/work/tests/test_a.py"), ("in_library", "/work/pkg/core.py")):
        exec(compile(f"def {name}():\n    pass\n", path, "exec"), ns)  # noqa: S102 - code that lives at `path`

    def collect(nodeid, fn):
        r.pytest_collection_finish(types.SimpleNamespace(items=[types.SimpleNamespace(nodeid=nodeid, obj=fn)]))

    collect("tests/test_a.py::t1", ns["in_test_file"])
    assert r.tampered is None
    collect("tests/test_a.py::t2", ns["in_library"])
    assert r.tampered == "tests/test_a.py::t2 runs code from /work/pkg/core.py"


def test_guards_refuse_calls_and_report_them(monkeypatch):
    mod = types.ModuleType("rlonce_fake_guarded")
    calls = []
    mod.settrace = calls.append
    monkeypatch.setitem(sys.modules, "rlonce_fake_guarded", mod)
    r = new_report(guards=("rlonce_fake_guarded.settrace", "rlonce_fake_missing.x"))
    mod.settrace(None)  # removing a tracer is allowed
    assert calls == [None] and r.tampered is None
    with pytest.raises(PermissionError, match="^rlonce_fake_guarded.settrace is not available under rlonce's"):
        mod.settrace(print)
    assert calls == [None]
    assert r.tampered == "rlonce_fake_guarded.settrace was called"


def test_install_launcher_writes_the_program_once_and_atomically(tmp_path):
    assert launcher_source() == Path(launcher.__file__).read_bytes()
    install_launcher(tmp_path)
    target = tmp_path / LAUNCHER_NAME
    assert target.read_bytes() == launcher_source()
    assert target.stat().st_mode & 0o777 == 0o644
    inode = target.stat().st_ino
    install_launcher(tmp_path)
    assert target.stat().st_ino == inode  # up to date: not rewritten
    target.write_text("print('forged')\n")
    install_launcher(tmp_path)
    assert target.read_bytes() == launcher_source()
    assert sorted(p.name for p in tmp_path.iterdir()) == [LAUNCHER_NAME]  # no temporary file left


def test_programs_import_only_the_standard_library():
    """They run where rlonce is not installed: the standard library (and the testbed's pytest)."""
    for mod, extra in ((fileops, set()), (launcher, {"_pytest", "pluggy", "pytest"})):
        tree = ast.parse(Path(mod.__file__).read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert names and not names - set(sys.stdlib_module_names) - extra
