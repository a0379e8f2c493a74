"""Rollout auditing for task quality and GRS rubric synthesis on a small code pack, through the CLI:
real attempts in a bubblewrap sandbox, graded in a fresh one, read by the scripted judge or by an
endpoint that is down."""

import json
import logging
import shutil
from pathlib import Path

import pytest

from rlonce.cli import main
from rlonce.config.domains import load_domain
from rlonce.envs.code.validate import validated_tasks
from rlonce.envs.packs import PackOptions
from rlonce.grading.rubrics import load_rubrics
from rlonce.grading.scripted import RUBRICS
from rlonce.grading.verdicts import Rubrics

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def built(code_pack, tmp_path_factory):
    """The session's validated pack, copied; then, as a pack can drift after validation, the first
    task loses its fail-to-pass test (too weak: doing nothing passes) and the second gains one
    that does not exist (too strict: the reference fix fails)."""
    out = Path(shutil.copytree(code_pack, tmp_path_factory.mktemp("audit") / "pack"))
    first, second = json.loads((out / "validation.json").read_text())["validated_ids"][:2]
    tasks = [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]
    for t in tasks:
        if t["task_id"] == first:
            t["f2p"] = []
        if t["task_id"] == second:
            t["f2p"] = [*t["f2p"], "tests/test_minicalc.py::test_not_there"]
    (out / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return out


@pytest.fixture
def pack(built, tmp_path):
    return Path(shutil.copytree(built, tmp_path / "pack"))


def _train_ids(pack: Path) -> tuple[set[str], int]:
    dom = load_domain("code").build(PackOptions.model_construct(pack=str(pack), heldout_fraction=0.0))  # no held-out
    return {dom.task("train", i).task_id for i in range(8)}, dom.audit_excluded


@pytest.fixture(scope="module")
def audited(built, tmp_path_factory):
    """The first three tasks audited with the scripted judge, through the CLI: the pack and what it printed."""
    pack = Path(shutil.copytree(built, tmp_path_factory.mktemp("audited") / "pack"))
    out = tmp_path_factory.mktemp("out") / "stdout"
    from contextlib import redirect_stdout

    with out.open("w") as f, redirect_stdout(f):
        assert main(["tasks", "audit", str(pack), "--tasks", "3", "--quiet"]) == 0
    return pack, out.read_text()


def test_audit_flags_wrong_tests_and_training_skips_flagged_tasks_until_cleared(audited, caplog):
    pack, out = audited
    ids = [t.task_id for t in validated_tasks(pack)]
    weak, wrong, sound = ids[0], ids[1], ids[2]
    audit = json.loads((pack / "audit.json").read_text())
    assert list(audit) == ids[:3] and all(e["outcome"] == "ok" for e in audit.values())
    assert audit[wrong]["flags"] == ["false_negative"] and audit[sound]["flags"] == []
    flagged = {i for i, e in audit.items() if e["flags"]}
    fp = sum("false_positive" in audit[i]["flags"] for i in flagged)
    assert f"audited 3; flagged false positive {fp}, false negative 1; no verdict: none" in out
    # the sound task: both expert attempts pass with a real diff; doing nothing and deleting the tests fail
    assert [a["passed"] for a in audit[sound]["attempts"]] == [True, True, False, False]
    assert [a["diff_lines"] > 0 for a in audit[sound]["attempts"]] == [True, True, False, False]
    # the weak task passes even with no change; the wrong one fails even with the reference fix
    assert [a["passed"] for a in audit[weak]["attempts"]] == [True] * 4
    assert [a["passed"] for a in audit[wrong]["attempts"]] == [False] * 4
    assert audit[sound]["requires"].startswith("a change that adds:")

    report = json.loads((pack / "validation.json").read_text())
    assert report["validated"] == len(ids) == len(report["validated_ids"])  # what readers use is intact
    assert report["audit"]["flagged"] == {i: audit[i]["flags"] for i in sorted(flagged)}
    assert report["audit"]["audited"] == 3 and report["audit"]["false_negative"] == 1
    calls = [json.loads(line) for line in (pack / "audit" / "calls.jsonl").read_text().splitlines()]
    assert [c["kind"] for c in calls] == ["audit"] * 3 and all(c["outcome"] == "ok" for c in calls)

    with caplog.at_level(logging.WARNING, logger="rlonce.envs.domains"):
        train, excluded = _train_ids(pack)
    assert train == set(ids) - flagged and excluded == len(flagged)
    assert f"{len(flagged)} task(s) excluded by the audit; clear them in {pack / 'cleared.txt'}" in caplog.text

    (pack / "cleared.txt").write_text(f"# reviewed by hand\n{wrong}  # test_not_there is being written\n\n")
    train, excluded = _train_ids(pack)
    assert train == set(ids) - (flagged - {wrong}) and excluded == len(flagged) - 1


def test_the_scripted_auditor_flags_a_task_that_passes_with_no_change(audited):
    pack, _ = audited
    weak = validated_tasks(pack)[0].task_id
    assert json.loads((pack / "audit.json").read_text())[weak]["flags"] == ["false_positive"]


def test_an_audit_with_the_judge_down_finishes_counts_the_failures_and_flags_nothing(pack, capsys):
    assert main(["tasks", "audit", str(pack), "--tasks", "2", "--json", "--judge", "http://127.0.0.1:9/v1",
                 "--judge-timeout", "5"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["audited"] == 2 and report["failures"] == {"down": 2}
    assert report["flagged"] == [] and report["false_positive"] == report["false_negative"] == 0
    audit = json.loads((pack / "audit.json").read_text())
    assert [e["outcome"] for e in audit.values()] == ["down", "down"] and all(e["flags"] == [] for e in audit.values())
    assert json.loads((pack / "validation.json").read_text())["audit"]["flagged"] == {}
    calls = [json.loads(line) for line in (pack / "audit" / "calls.jsonl").read_text().splitlines()]
    assert len(calls) == 2 and {c["outcome"] for c in calls} == {"down"}
    assert _train_ids(pack) == ({t.task_id for t in validated_tasks(pack)}, 0)


def test_synthesize_rubrics_writes_rubrics_for_tasks_that_pass_often_enough(pack, capsys):
    ids = [t.task_id for t in validated_tasks(pack)]
    assert load_rubrics(pack) == {}
    assert main(["grade", "synthesize-rubrics", "--pack", str(pack), "--tasks", "3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # three expert rollouts pass and the early exit does not: 3/4; the task with a missing test: 0/4. A
    # rollout the grader could not grade on a loaded machine (its tests' time limit) is left out of the rate
    want = {ids[0]: 0.75, ids[1]: 0.0, ids[2]: 0.75}
    assert set(report["pass_rates"]) == set(want)
    for i, rate in want.items():
        if report["graded"][i] == 4:
            assert report["pass_rates"][i] == rate, (i, report)
    assert report["eligible"] == 2 and report["written"] == 2 and report["failures"] == {}
    rubrics = load_rubrics(pack)
    assert set(rubrics) == {ids[0], ids[2]}
    assert all(isinstance(r, Rubrics) and r.solution == RUBRICS["solution"] for r in rubrics.values())

    (pack / "rubrics.json").write_text(json.dumps({"kept": RUBRICS, **json.loads((pack / "rubrics.json").read_text())}))
    assert main(["grade", "synthesize-rubrics", "--pack", str(pack), "--tasks", "1", "--rollouts", "1",
                 "--min-pass-rate", "1"]) == 0
    assert "1 eligible (pass rate >= 1); 1 written" in capsys.readouterr().out
    assert set(load_rubrics(pack)) == {"kept", ids[0], ids[2]}  # merged with what was there


def test_a_missing_or_unvalidated_pack_is_one_line(pack, tmp_path, capsys):
    assert main(["tasks", "audit", str(tmp_path / "nowhere")]) == 2
    assert main(["grade", "synthesize-rubrics", "--pack", str(tmp_path)]) == 2
    raw = tmp_path / "raw"
    raw.mkdir()
    for f in ("pack.json", "tasks.jsonl"):
        shutil.copy(pack / f, raw / f)
    assert main(["tasks", "audit", str(raw)]) == 2
    assert main(["tasks", "audit", str(pack), "--judge", "localhost:9"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all(line.startswith("rlonce: error: ") for line in err)
    assert "does not exist" in err[0] and "is not a task pack" in err[1]
    assert "rlonce tasks validate" in err[2] and "not an http(s) URL" in err[3]


class _AgentModel:
    """A scripted model behind a real HTTP server on loopback, speaking Chat Completions: it
    looks at the package with bash, then submits without changing anything."""

    def __init__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                seen.append(body)
                turn = sum(m["role"] == "assistant" for m in body["messages"])
                call = ({"name": "bash", "arguments": json.dumps({"command": "ls minicalc"})} if turn == 0 else
                        {"name": "submit", "arguments": json.dumps({"answer": "looked, changed nothing"})})
                msg = {"role": "assistant", "content": None,
                       "tool_calls": [{"id": f"c{turn}", "type": "function", "function": call}]}
                data = json.dumps({"choices": [{"message": msg, "finish_reason": "tool_calls"}],
                                   "usage": {"prompt_tokens": 50, "completion_tokens": 5}}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


def test_a_model_at_an_endpoint_makes_the_four_attempts_through_the_harness(pack, capsys):
    model = _AgentModel()
    try:
        assert main(["tasks", "audit", str(pack), "--tasks", "1", "--agent", model.url, "--agent-model", "m",
                     "--quiet", "--json"]) == 0
    finally:
        model.server.shutdown()
    report = json.loads(capsys.readouterr().out)
    (entry,) = report["tasks"].values()
    assert report["agent"] == f"m at {model.url}" and entry["outcome"] == "ok"
    # the first task lost its fail-to-pass test: looking and changing nothing passes, and the auditor says so
    assert [a["passed"] for a in entry["attempts"]] == [True] * 4 and entry["flags"] == ["false_positive"]
    assert len(model.seen) == 8 and {b["model"] for b in model.seen} == {"m"}  # two turns per attempt
    # the observation of its bash call went back to it: the tool ran in the attempt's sandbox
    second = [b for b in model.seen if any(m["role"] == "assistant" for m in b["messages"])]
    assert len(second) == 4 and all("__init__.py" in json.dumps(b["messages"][-1]) for b in second)


def test_an_agent_endpoint_that_is_down_is_infrastructure_not_a_failed_attempt(pack, capsys):
    assert main(["tasks", "audit", str(pack), "--tasks", "1", "--agent", "http://127.0.0.1:9/v1", "--quiet",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (entry,) = report["tasks"].values()
    assert entry["outcome"] == "attempt_infra" and not entry["flags"] and report["failures"] == {"attempt_infra": 1}
    assert main(["tasks", "audit", str(pack), "--agent", "ftp://x", "--quiet"]) == 2


def test_an_agentic_auditor_works_in_a_sandbox_holding_the_attempts_and_flags_the_same(pack, capsys):
    assert main(["tasks", "audit", str(pack), "--tasks", "1", "--agentic", "--quiet", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["tasks"].values()
    assert entry["outcome"] == "ok" and entry["flags"] == ["false_positive"]  # as the plain scripted auditor
    (call,) = [json.loads(x) for x in (pack / "audit" / "calls.jsonl").read_text().splitlines()]
    reply = call["reply"]  # the agent's transcript: it listed and read the attempts, ran the tests, submitted
    assert "/work/attempts:\n0.txt" in reply and "Tool calls (" in reply
    assert "passed" in reply and "call submit" in reply
