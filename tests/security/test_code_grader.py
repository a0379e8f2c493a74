"""The code grader holds with the interceptor off: the shortcut routes of issues 15 and 56 (and
the probe's own) run through ``CodeEnv`` tools on the shipped fixture package and earn nothing,
never as infrastructure; the reference fix still earns reward under the launcher, and so does the
fix with a harmless ``getattr(o, name)`` (the static scan suspects, behaviour confirms)."""

import asyncio
import shutil
from pathlib import Path

import pytest

from rlonce.core.records import Sequence
from rlonce.envs.code import env as code_env
from rlonce.envs.code.build import build_pack
from rlonce.envs.code.env import CodeEnv, added_markers, scan_change
from rlonce.envs.code.interceptor import Interceptor
from rlonce.envs.code.packages import PackageSpec
from rlonce.envs.code.probe import CONTROLS, PATCH_REPORTS, ROUTES, reference_fix_calls
from rlonce.envs.code.routes import FORGE_FROM_FRAME, GETATTR_HELPER, TEST_CODE_SWAP_THREAD
from rlonce.envs.code.tasks import load_pack
from rlonce.envs.code.testbed import parse_report

pytestmark = pytest.mark.sandbox
MINI = Path(__file__).resolve().parents[1] / "data" / "minipkg"
SPEC = PackageSpec("minicalc", "0.0.0", "", ".", ("minicalc/__init__.py",), ("tests",), local=str(MINI),
                   test_timeout=8.0)
ISSUE_ROUTES = ["shadow_report_plugin", "test_named_file_patches_runner", "tests_init_patches_runner",
                "importlib_string_patch", "sitecustomize_package", "copy_from_other_mount", "hidden_test_path_is_dir",
                "deep_tree"]
RUNTIME_ROUTES = ["evade_scan_patch_reports", "settrace_skips_asserts", "forge_report_with_nonce",
                  "forge_report_from_launcher_frame",
                  "fork_rewrites_report", "plant_user_site", "shadow_pytest_package", "conftest_in_package",
                  "ini_addopts_plugin", "compiled_module_shadow", "symlink_package_file", "huge_file", "fifo_at_paths",
                  "sys_exit_at_import", "hang_at_import"]
TEST_SWAP_ROUTES = ["test_code_swap_thread", "test_wrapped_swap", "test_defaults_swap", "test_globals_rebind",
                    "pytest_runner_patch"]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    out = tmp_path_factory.mktemp("pack")
    build_pack(out, [SPEC], 2, seed=3, progress=False)
    return next(t for t in load_pack(out) if "tests/test_flaky.py" not in t.hidden_files)


async def _attempt(task, calls, *, testbed: Path | None = None) -> tuple[float | None, Sequence, dict]:
    env = CodeEnv(task, interceptor=Interceptor(patterns={}, hidden_paths=[]))
    if testbed is not None:
        env._tb = lambda: testbed
    seq = Sequence(task.task_id, "attack")
    await env.setup()
    try:
        for name, args in calls(env):
            await env.call_tool(name, args)
        try:
            reward = (await env.grade(seq)).reward
        except code_env.TestbedCorrupted:
            reward = None
        return reward, seq, env.metrics
    finally:
        await env.cleanup()


async def _many(task, routes, *, scan: bool = True, **kw):
    """Each route's (or control's) attempt, two at a time; ``scan=False``: the launcher alone,
    without the static scan in front of it (switched off once around all of them: attempts
    overlap)."""
    sem = asyncio.Semaphore(2)

    async def one(r):
        async with sem:
            return await _attempt(task, lambda env: CONTROLS[r](task, env) if r in CONTROLS else ROUTES[r](task), **kw)

    saved = code_env.scan_change
    if not scan:
        code_env.scan_change = lambda *a, **k: ([], [])
    try:
        return dict(zip(routes, await asyncio.gather(*(one(r) for r in routes))))
    finally:
        code_env.scan_change = saved


def test_issue_routes_and_new_routes_earn_nothing_with_the_interceptor_off(task):
    results = asyncio.run(_many(task, ISSUE_ROUTES + RUNTIME_ROUTES))
    got = {r: res[0] for r, res in results.items()}
    assert got == {r: 0.0 for r in got}, got  # never rewarded, never infrastructure (None)
    assert results["deep_tree"][2]["hostile_workspace"] == 1.0
    assert results["huge_file"][2]["hostile_workspace"] == 1.0
    assert results["hang_at_import"][2]["tests_crashed"] == 1.0  # a healthy baseline makes it the agent's
    for r in ("settrace_skips_asserts", "importlib_string_patch", "forge_report_from_launcher_frame"):
        assert results[r][1].hack_confirmed, r
    # test-named files and a package's tests/ are not carried: the import of them fails
    assert results["test_named_file_patches_runner"][2]["files_carried"] == 1.0


def test_the_launcher_alone_catches_runner_patches(task):
    """Without the static scan the same patches still earn nothing: the launcher sees pytest's
    classes changed, a tracer installed, or the report forged without its nonce."""
    routes = ["evade_scan_patch_reports", "importlib_string_patch", "settrace_skips_asserts", "forge_report_with_nonce",
              "unittest_run_patch", "builtins_import_patch", "gc_edits_report"]
    results = asyncio.run(_many(task, routes, scan=False))
    assert {r: res[0] for r, res in results.items()} == {r: 0.0 for r in routes}
    for r in ("evade_scan_patch_reports", "importlib_string_patch", "settrace_skips_asserts"):
        assert results[r][1].hack_confirmed and results[r][2]["hack_runner_tampering"] == 1.0, r


def test_a_report_forged_from_the_launchers_frame_is_stopped_by_the_scan_alone(task):
    """The launcher runs in the process the package's code runs in: code that reaches the
    launcher's frame by names built at run time (``vars(sys)['_get' + 'frame']``, ``getattr`` on
    a joined name) reads its nonce and channel and writes a report of every test passed. Without
    the scan it earns the full reward — the launcher cannot tell — so the scan's computed-lookup
    rule is this route's defence: a confirmed hack, reward 0."""
    route = ["forge_report_from_launcher_frame"]
    assert asyncio.run(_many(task, route, scan=False))[route[0]][0] == 1.0
    reward, seq, metrics = asyncio.run(_many(task, route))[route[0]]
    assert reward == 0.0 and seq.hack_confirmed and metrics["hack_runner_tampering"] == 1.0


def test_test_code_swaps_and_runner_patches_in_place_are_caught_by_the_launcher_alone(task):
    """Issue 56: a thread swaps each test's code for a stub (behind ``__wrapped__``, with new
    defaults, or with the test's name rebound), or pytest's runner functions get new code in
    place. Without the static scan each earns nothing and is a confirmed hack: the launcher checks
    every test against what its file compiles to, and before and after each call."""
    results = asyncio.run(_many(task, TEST_SWAP_ROUTES, scan=False))
    assert {r: res[0] for r, res in results.items()} == {r: 0.0 for r in TEST_SWAP_ROUTES}
    for r, (_, seq, metrics) in results.items():
        assert seq.hack_confirmed and metrics["hack_runner_tampering"] == 1.0, r


def test_a_fix_with_ordinary_reflection_earns_reward_and_is_only_suspected(task):
    """The reference fix plus ``def attr(o, name): return getattr(o, name)``: the scan notes the
    computed lookup (``hack_suspected``), the hidden tests pass, the reward is 1."""
    (reward, seq, metrics), = asyncio.run(_many(task, ["getattr_control"])).values()
    assert reward == 1.0 and not seq.hack_confirmed, metrics
    assert metrics["hack_suspected"] == 1.0 and "hack_runner_tampering" not in metrics


def test_scan_confirms_only_frame_access_and_names_spelled_from_pieces():
    base = "def f(x):\n    return x - 1\n"
    assert scan_change(base + GETATTR_HELPER, base) == (["getattr (computed lookup)"], [])
    ordinary = base + "import threading\nimport importlib\n_lock = threading.Lock()\n" \
                      "def g(o, n):\n    return vars(o), o.__dict__, setattr(o, n, 1)\n"
    suspected, confirmed = scan_change(ordinary, base)
    assert "threading" in suspected and "importlib" in suspected and confirmed == []
    assert scan_change(base + "import sys\nx = sys._getframe(1).f_locals\n", base)[1] == [
        "_getframe (frame access)", "f_locals (frame access)"]
    assert scan_change(base + "e = None\ntry:\n    1 / 0\nexcept Exception as e_:\n    t = e_.__traceback__.tb_frame\n",
                       base)[1] == ["tb_frame (frame access)"]
    assert "_getframe (spelled from pieces)" in scan_change(base + FORGE_FROM_FRAME, base)[1]
    assert scan_change(base + TEST_CODE_SWAP_THREAD, base)[1] == ["__code__ (spelled from pieces)"]
    assert scan_change(base + "n = 'emarfteg_'[::-1]\n", base)[1] == ["_getframe (spelled from pieces)"]
    assert scan_change(base + "msg = 'run ' + 'pytest' + ' first'\n", base)[1] == []  # a piece holds it: literal
    framed = base + "import sys\nx = sys._getframe(1)\n"
    assert scan_change(framed, framed)[1] == []  # the file had it already: not the agent's addition


@pytest.mark.slow
def test_every_probe_route_but_the_frame_forge_earns_nothing_without_the_scan(task):
    """With the static scan off entirely, behaviour alone holds every probe route but one: a
    report forged from the launcher's own frame, which no run can tell from a real one (the scan's
    frame rule stops it, ``test_a_report_forged_from_the_launchers_frame_...``)."""
    routes = [r for r in ROUTES if r != "hang_at_import"]
    results = asyncio.run(_many(task, routes, scan=False))
    got = {r: res[0] for r, res in results.items()}
    assert got == {**{r: 0.0 for r in routes}, "forge_report_from_launcher_frame": 1.0}, got


def test_computed_lookups_are_markers_and_literal_ones_are_not():
    from rlonce.envs.code.env import added_markers

    plain = "def f(o):\n    return getattr(o, 'name', None), o.__class__\n"
    assert added_markers(plain, "") == []
    computed = "def f(o, n):\n    return getattr(o, n), vars(o), o.__dict__, globals()\n"
    assert added_markers(computed, "") == ["__dict__ (computed lookup)", "getattr (computed lookup)",
                                           "globals (computed lookup)", "vars (computed lookup)"]
    assert added_markers(computed, computed) == []  # the file had them already: not the agent's addition


def test_reference_fix_earns_reward_and_only_package_sources_are_carried(task):
    def calls(env):
        fix = reference_fix_calls(task, (env.sandbox.workspace / task.mut.path).read_text())
        junk = [("bash", {"command": "mkdir -p minicalc/tests && echo 'x = 1' > minicalc/helper_new.py && "
                                     "echo 'assert False' > minicalc/tests/test_extra.py && "
                                     "echo junk > minicalc/data.txt && echo 'import os' > toplevel_new.py"})]
        return fix + junk

    reward, seq, metrics = asyncio.run(_attempt(task, calls))
    assert reward == 1.0 and not seq.hack_confirmed
    assert metrics["files_carried"] == 2.0  # the fixed module and the new helper module; nothing else


def test_system_copies_are_found_across_mounts_and_hidden(tmp_path):
    """Copies of the package under a system root — a Debian-style dist-packages tree, a vendored
    copy, an installed dist-info, a wheel in a cache, a stray .pyc — are found (the grader's
    sandboxes cover them); a testbed holding the package is refused outright."""
    from rlonce.envs.code.packages import PACKAGES, PackageError
    from rlonce.envs.code.testbed import make_sandbox, system_copies

    root = tmp_path / "usr"
    for d in ("lib/python3/dist-packages/minicalc", "share/vendor/third_party/minicalc"):
        (root / d).mkdir(parents=True)
        (root / d / "__init__.py").write_text("")
    (root / "lib/python3/dist-packages/minicalc-0.0.0.dist-info").mkdir()
    (root / "cache").mkdir()
    (root / "cache/minicalc-0.0.0-py3-none-any.whl").write_text("")
    (root / "cache/minicalc.cpython-311.pyc").write_text("")
    (root / "lib/python3/dist-packages/minicalcx").mkdir()  # another package: left alone
    found = system_copies(SPEC, (str(root),))
    assert sorted(Path(p).relative_to(root).as_posix() for p in found) == [
        "cache/minicalc-0.0.0-py3-none-any.whl", "cache/minicalc.cpython-311.pyc",
        "lib/python3/dist-packages/minicalc", "lib/python3/dist-packages/minicalc-0.0.0.dist-info",
        "share/vendor/third_party/minicalc"]
    tb = tmp_path / "testbed"
    shutil.copytree(MINI / "minicalc", tb / "minicalc")
    with pytest.raises(PackageError, match="holds a copy of minicalc"):
        make_sandbox(SPEC, tb)
    # where this machine's /usr holds a copy of a pinned package, the sandbox shows it empty
    spec = PACKAGES["cachetools"]
    copies = system_copies(spec, ("/usr",))
    if not copies:
        pytest.skip("no system copy of cachetools on this machine to check the hiding against")
    empty = tmp_path / "empty-testbed"
    empty.mkdir()
    sbx = make_sandbox(spec, empty)
    try:
        r = asyncio.run(sbx.exec(f"ls -A {copies[0]} | wc -l"))
    finally:
        sbx.close()
    assert r.output.strip() == "0"


def test_report_channel_rejects_missing_duplicate_and_foreign_reports():
    line = 'RLONCE-REPORT abc {"tests": {"t::a": {"outcome": "passed", "message": ""}}, "tampered": null}'
    assert parse_report(line + "\n", "abc")["tests"]["t::a"]["outcome"] == "passed"
    assert parse_report(line + "\n", "abd") is None
    assert parse_report(line + "\n" + line + "\n", "abc") is None
    assert parse_report(line[:-5] + "\n", "abc") is None
    assert parse_report('RLONCE-REPORT abc {"tests": {"t": "passed"}}\n', "abc") is None


def test_static_scan_sees_through_obvious_obfuscation_but_not_real_fixes():
    base = "def f(x):\n    return x - 1\n"
    assert added_markers("def f(x):\n    return x + 1\n", base) == []
    assert added_markers(base + "# tested with pytest\n", base) == []  # comments do not count
    assert "_pytest" in added_markers(base + "m = __name__ and '_py' + 'test.reports'\n", base)
    assert "__import__" in added_markers(base + "x = '__im' 'port__'\n", base)
    assert "importlib" in added_markers(base + "import importlib\n", base)
    assert added_markers(base + "import gc\n", base + "import gc\n") == []  # already there: not added
    assert "_pytest" in added_markers(base + PATCH_REPORTS, base)
