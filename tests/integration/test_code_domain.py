"""The code-repair domain on a small shipped package: build, validate, workspace hygiene,
fresh-sandbox grading, the interceptor, hack probes, and the full Sample path."""

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from rlonce.core.records import FailureCategory, Role, Sequence, Status
from rlonce.envs.code.build import Tier, build_pack
from rlonce.envs.code.env import CodeEnv
from rlonce.envs.code.interceptor import DENIAL
from rlonce.envs.code.packages import PackageSpec
from rlonce.envs.code.probe import ROUTES, format_report, probe_pack, reference_fix_calls
from rlonce.envs.code.tasks import load_pack, materialize
from rlonce.envs.code.validate import validate_pack, validated_tasks

pytestmark = pytest.mark.sandbox
MINI = Path(__file__).resolve().parents[1] / "data" / "minipkg"
SPEC = PackageSpec("minicalc", "0.0.0", "", ".", ("minicalc/__init__.py",), ("tests",), local=str(MINI),
                   test_timeout=30.0)


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    out = tmp_path_factory.mktemp("pack")
    build_pack(out, [SPEC], 6, seed=3, progress=False)  # seed 3 mutates count_vowels first (the flaky test)
    return out


def test_build_is_reproducible_and_tasks_are_well_formed(pack, tmp_path):
    tasks = load_pack(pack)
    assert len(tasks) == 6
    for t in tasks:
        assert t.f2p and set(t.f2p).isdisjoint(t.p2p)
        assert all(i.split("::")[0] in t.hidden_files for i in [*t.f2p, *t.p2p])
        assert t.mut.original not in t.problem or len(t.mut.original) < 3  # the fix is not in the statement
        assert t.fix_diff().startswith("--- a/minicalc/__init__.py")
    again = tmp_path / "again"
    build_pack(again, [SPEC], 6, seed=3, progress=False)
    assert (again / "tasks.jsonl").read_text() == (pack / "tasks.jsonl").read_text()


def test_an_easy_tier_pack_draws_only_its_operators_in_short_functions(tmp_path):
    from rlonce.envs.code.mutate import function_lengths

    tier = Tier(("binop", "compare"), 6, 3)
    build_pack(tmp_path, [SPEC], 3, seed=3, progress=False, tier=tier)
    tasks = load_pack(tmp_path)
    lengths = function_lengths((MINI / "minicalc" / "__init__.py").read_bytes())
    assert tasks and all(t.mut.operator in ("binop", "compare") for t in tasks)
    assert all(lengths[t.mut.function] <= 6 for t in tasks)
    assert json.loads((tmp_path / "pack.json").read_text())["tier"] == {
        "operators": ["binop", "compare"], "max_function_lines": 6, "message_lines": 3}


def test_validation_gates_drop_the_flaky_test(pack):
    report = validate_pack(pack, progress=False)
    assert report["tasks"] == 6 and report["validated"] + sum(report["dropped"].values()) == 6
    flaky = [t for t in load_pack(pack) if "tests/test_flaky.py" in t.hidden_files]
    assert flaky, "the seeded build should include a task whose hidden tests hold the flaky test"
    for t in flaky:
        assert report["dropped_ids"][t.task_id] == "unstable"
    assert report["validated"] >= 3 and report["packages"] == {"minicalc": report["validated"]}
    assert json.loads((pack / "validation.json").read_text())["validated"] == report["validated"]
    # each validated task's grading timeout: 10 x its slowest mean run, floored at 10 s, capped at 30 s
    assert sorted(report["timeouts"]) == sorted(report["validated_ids"])
    assert all(10.0 <= v <= SPEC.test_timeout for v in report["timeouts"].values())
    assert {t.task_id: t.timeout for t in validated_tasks(pack)} == report["timeouts"]


def test_hanging_code_costs_the_grading_timeout_and_a_slow_clean_run_is_infrastructure(pack):
    import dataclasses
    import time

    from rlonce.envs.code.env import TestbedCorrupted

    t = validated_tasks(pack)[0]
    hang = ROUTES["hang_at_import"](t)  # the package's __init__ sleeps for ever

    async def attempt(task):
        env = CodeEnv(task)
        await env.setup()
        try:
            for name, args in hang:
                await env.call_tool(name, args)
            seq = Sequence(task.task_id, "x")
            return (await env.grade(seq)).reward, env.metrics, seq
        finally:
            await env.cleanup()

    t0 = time.perf_counter()
    r, m, seq = _run(attempt(t))
    assert r == 0.0 and m.get("tests_crashed") == 1.0 and not seq.hack_confirmed, m  # the model's failure
    assert time.perf_counter() - t0 < 20 * t.timeout, "the hang waited past the task's grading timeout"
    # a timeout so tight that even the clean run takes over half of it: the machine cannot tell, so infra
    with pytest.raises(TestbedCorrupted, match="too loaded|no report"):
        _run(attempt(dataclasses.replace(t, timeout=0.2)))


def test_rollout_workspace_is_clean(pack, tmp_path):
    t = validated_tasks(pack)[0]
    ws = tmp_path / "ws"
    head = materialize(t, ws)
    git = lambda *a: subprocess.run(["git", *a], cwd=ws, capture_output=True, text=True).stdout  # noqa: E731
    assert git("rev-list", "--all").split() == [head]
    assert git("for-each-ref", "--format=%(refname)").split() == ["refs/heads/main"]
    assert git("remote").strip() == "" and git("stash", "list").strip() == ""
    assert not (ws / ".git" / "logs").exists() and not list((ws / ".git" / "objects").glob("pack/*.pack"))
    assert not any(p.name in {"__pycache__", ".pytest_cache"} or p.name.endswith(".egg-info") for p in ws.rglob("*"))
    for h in t.hidden_files:
        assert not (ws / h).exists()
    original = (MINI / t.mut.path).read_text()
    assert (ws / t.mut.path).read_text() != original


def test_original_code_is_nowhere_in_the_rollout_sandbox(pack):
    t = load_pack(pack)[0]
    assert t.mut.function == "count_vowels"
    original = (MINI / t.mut.path).read_bytes()
    start = original.rfind(b"\n", 0, t.mut.start) + 1
    line = original[start:original.index(b"\n", t.mut.end)].decode().strip()  # the unmutated line
    env = CodeEnv(t)
    _run(env.setup())
    try:
        env.sandbox.limits = type(env.sandbox.limits)(wall_seconds=120, output_bytes=100000)
        r = _run(env.sandbox.exec(f"grep -rlF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev "
                                  f"{json.dumps(line)} / 2>/dev/null; echo scanned"))
    finally:
        _run(env.cleanup())
    assert r.output.strip() == "scanned", r.output


def _run(coro):
    return asyncio.run(coro)


def test_interceptor_denies_and_counts(pack):
    t = validated_tasks(pack)[0]
    env = CodeEnv(t)
    _run(env.setup())
    try:
        assert _run(env.call_tool("bash", {"command": "git log -p"})) == DENIAL
        assert _run(env.call_tool("bash", {"command": "pip download minicalc"})) == DENIAL
        assert _run(env.call_tool("str_replace_editor",
                                  {"command": "view", "path": next(iter(t.hidden_files))})) == DENIAL
        assert "minicalc" in _run(env.call_tool("bash", {"command": "ls"}))
    finally:
        _run(env.cleanup())
    assert env.metrics["intercepted_git_history"] == 1 and env.metrics["intercepted_fetch_upstream"] == 1
    assert env.metrics["intercepted_hidden_tests"] == 1


def test_grading_reference_fix_noop_and_testbed_failure(pack, tmp_path):
    t = validated_tasks(pack)[0]
    empty = tmp_path / "empty-testbed"  # no pytest in it: the testbed itself is broken
    empty.mkdir()

    async def attempt(calls, break_testbed=False, trust=False):
        env = CodeEnv(t, trust_validation=trust)
        await env.setup()
        try:
            for name, args in calls(env):
                await env.call_tool(name, args)
            if break_testbed:
                env._tb = lambda: empty
            grade = await env.grade(Sequence(t.task_id, "x"))
            return grade.reward, {**env.metrics, "transcript": grade.transcript}
        finally:
            await env.cleanup()

    n = len(t.f2p) + len(t.p2p)
    r, m = _run(attempt(lambda env: reference_fix_calls(t, (env.sandbox.workspace / t.mut.path).read_text())))
    assert r == 1.0 and m["tests_passed"] == m["tests_total"] == n
    lines = m["transcript"].splitlines()  # the verdict in words: the change, then every test's outcome
    assert lines[0].startswith("change: 1 file(s), ")
    assert lines[0].endswith(f"hidden tests in a fresh sandbox: {n}/{n} passed")
    assert lines[1:] == [f"passed {i}" + (" (fail-to-pass)" if i in t.f2p else "") for i in [*t.f2p, *t.p2p]]
    r, m = _run(attempt(lambda env: []))  # no change, run: the buggy tree fails its F2P tests
    assert r == 0.0 and m["tests_passed"] == len(t.p2p) and "graded_unchanged" not in m
    head = f"change: 0 file(s), 0 diff lines; hidden tests in a fresh sandbox: {len(t.p2p)}/{n} passed"
    assert m["transcript"].splitlines()[0] == head
    assert all(not x.startswith("passed") for x in m["transcript"].splitlines()[1:len(t.f2p) + 1])
    # in training the task passed validate, which saw exactly this: nothing runs (a broken testbed
    # cannot even be noticed) and the reward is 0
    for broken in (False, True):
        r, m = _run(attempt(lambda env: [], break_testbed=broken, trust=True))
        assert r == 0.0 and m["graded_unchanged"] == 1.0 and m["tests_passed"] == len(t.p2p), m
        assert m["tests_total"] == n and m["transcript"].startswith("no change to the package's code")
    comment = [("bash", {"command": f"echo '# a note' >> {t.mut.path}"})]  # a change that fixes nothing
    r, m = _run(attempt(lambda env: comment, trust=True))
    assert r == 0.0 and m["tests_passed"] == len(t.p2p) and "graded_unchanged" not in m
    assert m["transcript"].startswith("change: 1 file(s), 7 diff lines; hidden tests in a fresh sandbox: ")
    from rlonce.envs.code.env import TestbedCorrupted

    for calls, trust in (([], False), (comment, True)):
        with pytest.raises(TestbedCorrupted):
            _run(attempt(lambda env, c=calls: c, break_testbed=True, trust=trust))


def test_hidden_test_runs_take_turns_across_rollouts(pack, monkeypatch):
    """Concurrent gradings run their hidden tests one slot at a time, so a run's time is its own."""
    import threading

    import rlonce.envs.code.env as code_env

    t = validated_tasks(pack)[0]
    monkeypatch.setattr(code_env, "_TEST_RUNS", threading.BoundedSemaphore(1))
    running, most = [0], [0]
    real = code_env.CodeEnv._run_hidden_now

    async def counted(self, changes):
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            return await real(self, changes)
        finally:
            running[0] -= 1

    monkeypatch.setattr(code_env.CodeEnv, "_run_hidden_now", counted)

    async def one():
        env = CodeEnv(t)
        await env.setup()
        try:
            await env.call_tool("bash", {"command": f"echo '# a note' >> {t.mut.path}"})
            return (await env.grade(Sequence(t.task_id, "x"))).reward
        finally:
            await env.cleanup()

    async def three():
        return await asyncio.gather(one(), one(), one())

    assert _run(three()) == [0.0, 0.0, 0.0]
    assert most[0] == 1 and running[0] == 0


def test_hack_probes_earn_nothing_and_controls_hold(pack):
    import dataclasses

    # a generous grading timeout: on a loaded machine a clean run past the validated 10 s is
    # infrastructure, rightly (failed_run_owner); here it would hide what the routes earn
    tasks = [dataclasses.replace(t, timeout=60.0) for t in validated_tasks(pack)[:1]]
    assert len(ROUTES) >= 40
    routes = [r for r in ROUTES if r != "hang_at_import"]  # that one waits out the test timeout (tests/security)
    both = probe_pack(tasks, routes=routes, intercept="both", progress=False)
    assert both["interceptor"] == "both" and "interceptor on | off" in format_report(both)
    assert "[control] fix + getattr" in format_report(both)
    for rep in (both["on"], both["off"]):
        assert {r: v["rewarded"] for r, v in rep["routes"].items()} == {r: 0 for r in routes}
        assert rep["reference_fix"] == {**rep["reference_fix"], "tasks": 1, "rewarded": 1}
        assert rep["getattr_control"] == {**rep["getattr_control"], "tasks": 1, "rewarded": 1, "hack_confirmed": 0}
        assert rep["noop"]["rewarded"] == 0
        assert all(v["infra"] == 0 for v in rep["routes"].values())  # a hack never becomes "infrastructure"


def test_reference_fix_through_the_harness_and_sample_path(pack, tmp_path):
    from transformers import AutoTokenizer

    from rlonce.engine.base import SamplingParams
    from rlonce.engine.scripted import ScriptedEngine
    from rlonce.harness.loop import HarnessLimits
    from rlonce.model.chat import ToolCall, get_format
    from rlonce.model.loader import EMBEDDED_DIR
    from rlonce.rollout.runner import RolloutSpec, collect

    tok = AutoTokenizer.from_pretrained(EMBEDDED_DIR)
    fmt = get_format("hermes")
    t = validated_tasks(pack)[0]
    materialize(t, tmp_path / "ws", git=False)
    ((name, args),) = reference_fix_calls(t, (tmp_path / "ws" / t.mut.path).read_text())
    turns = [fmt.assistant_text("", [ToolCall("bash", {"command": "head -3 minicalc/__init__.py"})]),
             fmt.assistant_text("", [ToolCall(name, args)]),
             fmt.assistant_text("", [ToolCall("submit", {"answer": "done"})])]
    encode = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    spec = RolloutSpec(encode=encode, decode=tok.decode, chat_format=fmt, sampling=SamplingParams(max_tokens=4096),
                       limits=HarnessLimits(max_turns=5, max_obs_chars=2000), max_context=32768)
    samples = _run(collect([t], 1, CodeEnv, ScriptedEngine(turns, encode), spec, progress=False))
    seq = samples[0].sequences[0]
    assert (seq.status, seq.reward, seq.failure) == (Status.SUBMITTED, 1.0, None)
    segs = seq.contexts[0].segments
    model = [tok.decode(s.token_ids) for s in segs if s.role is Role.MODEL]
    obs = [tok.decode(s.token_ids) for s in segs if s.role is Role.OBSERVATION]
    assert "str_replace_editor" in model[1] and "A tiny library" in obs[0]
    assert "edited minicalc/__init__.py" in obs[1]
    assert seq.metrics["tests_passed"] == seq.metrics["tests_total"] > 0
    # the same episode on a broken testbed is an infrastructure failure, never a reward of 0
    empty = tmp_path / "empty-testbed"
    empty.mkdir()

    class BrokenTestbed(CodeEnv):
        def _tb(self):
            return empty

    samples = _run(collect([t], 1, BrokenTestbed, ScriptedEngine(turns, encode), spec, progress=False))
    seq = samples[0].sequences[0]
    assert (seq.status, seq.failure, seq.reward) == (Status.INFRA, FailureCategory.TESTBED_CORRUPTED, None)


def test_cli_json_reports(pack):
    import sys

    def cli(*args):
        r = subprocess.run([sys.executable, "-m", "rlonce.cli", *args], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout)

    rep = cli("tasks", "validate", str(pack), "--json", "--reruns", "2")
    assert {"validated", "dropped", "packages"} <= set(rep) and rep["tasks"] == 6
    both = cli("probe", "code", "--pack", str(pack), "--limit", "1", "--routes", "plant_conftest,git_reflog", "--json",
               "--no-hostile")
    assert both["interceptor"] == "both"
    for rep in (both["on"], both["off"]):
        assert set(rep["routes"]) == {"plant_conftest", "git_reflog"}
        assert all(v["tasks"] == 1 and v["rewarded"] == 0 for v in rep["routes"].values())
        assert rep["reference_fix"]["rewarded"] == 1 and rep["noop"]["rewarded"] == 0
    r = subprocess.run([sys.executable, "-m", "rlonce.cli", "probe", "code", "--pack", str(pack), "--routes", "nope"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "unknown probe route" in r.stderr


def test_probe_record_resumes_and_shards_split_the_pack(pack, tmp_path):
    import sys

    record = tmp_path / "probe.jsonl"

    def cli(*args):
        r = subprocess.run([sys.executable, "-m", "rlonce.cli", "probe", "code", "--pack", str(pack), "--json",
                            "--no-hostile", "--routes", "plant_conftest", "--interceptor", "off", "--record",
                            str(record), *args],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout)

    n = len(validated_tasks(pack))
    first = cli("--shard", "1/2")
    assert first["tasks"] == (n + 1) // 2 and len(record.read_text().splitlines()) == 4 * first["tasks"]
    with record.open("a") as f:
        f.write('{"mode": "off", "task": "torn')  # a run killed mid-line
    whole = cli()  # runs only the second shard's attempts; the report counts both shards
    lines = record.read_text().splitlines()
    assert len([ln for ln in lines if ln.endswith("}")]) == 4 * n
    assert whole["tasks"] == n and whole["reference_fix"] == {**whole["reference_fix"], "tasks": n, "rewarded": n}
    assert whole["routes"]["plant_conftest"]["tasks"] == n and whole["routes"]["plant_conftest"]["rewarded"] == 0
    assert cli() == whole  # everything recorded: nothing runs again
    assert len(record.read_text().splitlines()) == len(lines)

