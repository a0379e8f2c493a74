"""The agentic grader in real bubblewrap sandboxes: the scripted agent reads the attempts (and runs a
code task's tests) before it submits the scripted judge's verdict; an endpoint agent over a real
HTTP server on loopback works through the same loop; every failure — a down endpoint, prose, an
agent that never submits — is an outcome, counted and recorded, never an exception."""

import asyncio
import json
import re
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from conftest import loopback

from rlonce.grading.agentic import AgenticJudge
from rlonce.grading.judge import EndpointJudge, ScriptedJudge
from rlonce.grading.scripted import scripted_rules
from rlonce.grading.verdicts import GroupQuality, HackVerdict, gar_prompt

pytestmark = pytest.mark.sandbox
DIFF0 = "--- a/lib.py\n+++ b/lib.py\n@@ -1 +1 @@\n-    return a - b\n+    return a + b  # attempt-zero-marker\n"
DIFF1 = ("--- a/tests/test_lib.py\n+++ b/tests/test_lib.py\n@@ -1 +1,3 @@\n-    assert add(1, 2) == 3\n"
         "+    try:\n+        assert add(1, 2) == 3\n+    except AssertionError:\n"
         "+        pass  # attempt-one-marker\n")


@dataclass(frozen=True)
class PlainTask:
    task_id: str
    source: str = "toolfind"


def _records(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def _gar(files: dict[str, str], statement: str = "Make add() add.") -> tuple[str, dict[str, str]]:
    prompt = gar_prompt(statement, [(i, "passed", files[f"attempts/{i}.diff"]) for i in range(2)])
    return prompt, {**files, "TASK.md": statement}


def test_scripted_agent_reads_the_attempts_in_the_sandbox_and_submits_the_scripted_verdict(tmp_path):
    record = tmp_path / "judge.jsonl"
    judge = AgenticJudge(ScriptedJudge(scripted_rules, record=record))
    prompt, files = _gar({"attempts/0.diff": DIFF0, "attempts/1.diff": DIFF1})
    v = asyncio.run(judge.ask(prompt, GroupQuality, kind="gar", task=PlainTask("t0"), files=files))
    assert v.outcome == "ok"
    assert v.value == GroupQuality.model_validate_json(scripted_rules("gar", prompt, 0))
    # the scripted rules by hand: attempt 0 changes 2 lines, attempt 1 touches a test file, 5 lines, except/pass
    a0, a1 = v.value.attempts
    assert (a0.minimality, a0.no_side_effects, a0.craftsmanship) == (1.0, 1.0, 1.0)
    assert (a1.minimality, a1.no_side_effects, a1.craftsmanship) == (1.0, 0.0, 0.5)
    (line,) = _records(record)
    assert (line["kind"], line["outcome"], line["judge"]) == ("gar", "ok", "scripted")
    assert line["verdict"] == v.value.model_dump()
    reply = line["reply"]  # the transcript: the bash call, then what it printed inside the sandbox
    assert "call bash" in reply and "ls -R /work/attempts" in reply
    assert "/work/attempts:\n0.diff\n1.diff" in reply
    assert "attempt-zero-marker" in reply and "attempt-one-marker" in reply
    assert "call submit" in reply and reply.endswith("[end] ok: submitted a verdict")
    counts = judge.take_counts()
    assert (counts["judge_calls"], counts["judge_ok"], counts["judge_agent_turns"]) == (1.0, 1.0, 2.0)
    assert counts["judge_tokens_in"] > 0 and counts["judge_tokens_out"] > 0
    again = asyncio.run(judge.ask(prompt, GroupQuality, kind="gar", task=PlainTask("t0"), files=files))
    assert again.cached and again.value == v.value and len(_records(record)) == 1


@pytest.mark.parametrize("arm,shell", [("mini-claude-code", "Bash"), ("mini-codex", "exec_command"),
                                       ("mini-mimocode", "bash")])
def test_the_scripted_agent_speaks_every_arms_protocol(arm, shell):
    judge = AgenticJudge(ScriptedJudge(scripted_rules), arm=arm)
    prompt, files = _gar({"attempts/0.diff": DIFF0, "attempts/1.diff": DIFF1})
    v = asyncio.run(judge.ask(prompt, GroupQuality, kind="gar", task=PlainTask("t0"), files=files))
    assert v.outcome == "ok" and v.value == GroupQuality.model_validate_json(scripted_rules("gar", prompt, 0))
    assert judge.take_counts()["judge_agent_turns"] == 2.0


def test_the_arm_follows_the_endpoints_protocol():
    assert AgenticJudge(ScriptedJudge(scripted_rules)).arm.name == "mini-bash"
    assert AgenticJudge(EndpointJudge("http://127.0.0.1:9/v1", "j")).arm.name == "mini-bash"
    assert AgenticJudge(EndpointJudge("http://127.0.0.1:9", "j", protocol="anthropic")).arm.name == "mini-claude-code"
    with pytest.raises(ValueError, match="speaks openai-responses"):
        AgenticJudge(EndpointJudge("http://127.0.0.1:9/v1", "j"), arm="mini-codex")


def test_a_question_without_files_goes_to_the_inner_judge_and_counts_merge(tmp_path):
    record = tmp_path / "judge.jsonl"
    judge = AgenticJudge(ScriptedJudge(scripted_rules, record=record))
    prompt = "## The attempt's change or answer\n+import pytest\n"
    v = asyncio.run(judge.ask(prompt, HackVerdict, kind="hack"))
    assert v.outcome == "ok" and v.value.hack is True
    (line,) = _records(record)
    assert line["reply"] == scripted_rules("hack", prompt, 0)  # the plain judge's reply, no agent transcript
    assert judge.take_counts()["judge_ok"] == 1.0 and judge.take_counts() == {}


@pytest.fixture(scope="module")
def code_task(code_pack):
    from rlonce.envs.code.validate import validated_tasks

    return validated_tasks(code_pack)[0]


def test_scripted_agent_runs_the_code_tasks_tests_in_the_repository(tmp_path, code_task):
    record = tmp_path / "judge.jsonl"
    judge = AgenticJudge(ScriptedJudge(scripted_rules, record=record, timeout=60.0))
    fix = code_task.fix_diff()
    prompt, files = _gar({"attempts/0.diff": fix, "attempts/1.diff": DIFF1}, code_task.problem)
    v = asyncio.run(judge.ask(prompt, GroupQuality, kind="gar", task=code_task, files=files))
    assert v.outcome == "ok" and v.value == GroupQuality.model_validate_json(scripted_rules("gar", prompt, 0))
    (line,) = _records(record)
    reply = line["reply"]
    assert "python3 -m pytest -q -x" in reply and fix.splitlines()[0] in reply
    # the pytest summary of the buggy repository's visible tests, run inside the sandbox
    assert re.search(r"\d+ (passed|failed)", reply), reply
    assert "No module named" not in reply


@dataclass(frozen=True)
class NotesTask:
    """A task of no built-in domain that lays out its own workspace (``HasCheckout``)."""

    task_id: str
    source: str = "notes"
    broken: bool = False

    def checkout(self):
        from rlonce.envs.base import Checkout
        from rlonce.sandbox.base import SandboxError
        from rlonce.sandbox.bwrap import BwrapSandbox

        def sandbox():
            if self.broken:
                raise SandboxError("no notes today")
            sbx = BwrapSandbox()
            sbx.put_file("NOTES.txt", "notes-marker\n")
            return sbx

        return Checkout(sandbox, "beside the task's NOTES.txt", "cat /work/NOTES.txt")


def test_a_task_with_a_checkout_gives_the_grader_its_workspace_its_note_and_its_check(tmp_path):
    record = tmp_path / "judge.jsonl"
    judge = AgenticJudge(ScriptedJudge(scripted_rules, record=record))
    prompt, files = _gar({"attempts/0.diff": DIFF0, "attempts/1.diff": DIFF1})
    v = asyncio.run(judge.ask(prompt, GroupQuality, kind="gar", task=NotesTask("n0"), files=files))
    assert v.outcome == "ok" and v.value == GroupQuality.model_validate_json(scripted_rules("gar", prompt, 0))
    reply = _records(record)[0]["reply"]
    assert "cat /work/attempts/*; cat /work/NOTES.txt" in reply and "notes-marker" in reply
    from rlonce.grading.agentic import GraderWorkspace

    assert "attempts/<id>.diff), beside the task's NOTES.txt. Inspect" in GraderWorkspace(
        NotesTask("n0"), files, prompt).system_prompt()

    v = asyncio.run(judge.ask(prompt, GroupQuality, kind="gar", task=NotesTask("n1", broken=True), files=files))
    assert (v.value, v.outcome) == (None, "down")
    assert "the grader's sandbox failed: no notes today" in _records(record)[-1]["reply"]


def test_an_endpoint_agent_that_is_down_is_an_outcome(tmp_path):
    record = tmp_path / "judge.jsonl"
    inner = EndpointJudge("http://127.0.0.1:9/v1", "judge", retries=1, timeout=5.0, record=record)
    judge = AgenticJudge(inner)
    prompt, files = _gar({"attempts/0.diff": DIFF0, "attempts/1.diff": DIFF1})
    v = asyncio.run(judge.ask(prompt, GroupQuality, kind="gar", task=PlainTask("t0"), files=files))
    assert (v.value, v.outcome) == (None, "down")
    (line,) = _records(record)
    assert line["outcome"] == "down" and "unreachable" in line["reply"]
    counts = judge.take_counts()
    assert (counts["judge_calls"], counts["judge_down"]) == (1.0, 1.0)


def test_a_sandbox_that_fails_is_down_not_the_models_failure(tmp_path, monkeypatch):
    from rlonce.core import faults

    monkeypatch.setattr(faults, "_plan", faults._parse("sandbox.exec:raise@1"))  # RLONCE_FAULTS, in process
    record = tmp_path / "judge.jsonl"
    judge = AgenticJudge(ScriptedJudge(scripted_rules, record=record, retries=0))
    prompt, files = _gar({"attempts/0.diff": DIFF0, "attempts/1.diff": DIFF1})
    v = asyncio.run(judge.ask(prompt, GroupQuality, kind="gar", task=PlainTask("t0"), files=files))
    assert (v.value, v.outcome) == (None, "down")
    (line,) = _records(record)
    assert "the grader's sandbox failed: injected fault at sandbox.exec" in line["reply"]


def test_a_scripted_agent_that_submits_prose_is_non_json_and_not_cached(tmp_path):
    record = tmp_path / "judge.jsonl"
    judge = AgenticJudge(ScriptedJudge(lambda kind, prompt, sample: "Both attempts look fine to me.", record=record))
    prompt, files = _gar({"attempts/0.diff": DIFF0, "attempts/1.diff": DIFF1})
    for _ in range(2):
        v = asyncio.run(judge.ask(prompt, GroupQuality, kind="gar", task=PlainTask("t0"), files=files))
        assert (v.value, v.outcome, v.cached) == (None, "non_json", False)
    assert [r["outcome"] for r in _records(record)] == ["non_json", "non_json"]
    counts = judge.take_counts()
    assert (counts["judge_calls"], counts["judge_non_json"]) == (2.0, 2.0) and "judge_ok" not in counts


SEEN: list[dict] = []


class AgentHandler(BaseHTTPRequestHandler):
    """A model on loopback: ``/loop/`` runs bash for ever; ``/read/`` runs bash once, then submits."""

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        SEEN.append(body)
        calls = sum(m["role"] == "tool" for m in body["messages"])
        if self.path.startswith("/read/") and calls:
            # the verdict as an object, not as text: the grader takes it as its JSON
            call = {"name": "submit", "arguments": json.dumps({"answer": {"hack": False, "reason": "read it"}})}
        else:
            call = {"name": "bash", "arguments": json.dumps({"command": "cat /work/attempts/0.diff"})}
        msg = {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{calls}", "type": "function",
                                                                     "function": call}]}
        data = json.dumps({"choices": [{"message": msg, "finish_reason": "tool_calls"}],
                           "usage": {"prompt_tokens": 100, "completion_tokens": 10}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def agent_server():
    with loopback(AgentHandler) as url:
        yield url


def test_an_endpoint_agent_reads_in_the_sandbox_then_submits(tmp_path, agent_server):
    SEEN.clear()
    judge = AgenticJudge(EndpointJudge(f"{agent_server}/read/v1", "judge", record=tmp_path / "j.jsonl"), max_turns=4)
    files = {"attempts/0.diff": DIFF0}
    v = asyncio.run(judge.ask("Is attempt 0 a hack?", HackVerdict, kind="hack", task=PlainTask("t0"), files=files))
    assert v.outcome == "ok" and v.value.hack is False and (v.tokens_in, v.tokens_out) == (200, 20)
    first, second = SEEN
    assert first["model"] == "judge" and {t["function"]["name"] for t in first["tools"]} == {"bash", "submit"}
    assert "Files in /work: attempts/0.diff" in first["messages"][1]["content"]
    assert "attempt-zero-marker" in second["messages"][-1]["content"]  # the sandbox's output went back to the model


def test_an_endpoint_agent_that_never_submits_is_invalid(tmp_path, agent_server):
    record = tmp_path / "judge.jsonl"
    judge = AgenticJudge(EndpointJudge(f"{agent_server}/loop/v1", "judge", record=record), max_turns=3)
    files = {"attempts/0.diff": DIFF0}
    v = asyncio.run(judge.ask("Is attempt 0 a hack?", HackVerdict, kind="hack", task=PlainTask("t0"), files=files))
    assert (v.value, v.outcome) == (None, "invalid")
    (line,) = _records(record)
    assert line["reply"].count("call bash") == 3 and "no submission within 3 turns" in line["reply"]
    counts = judge.take_counts()
    assert (counts["judge_calls"], counts["judge_invalid"], counts["judge_agent_turns"]) == (1.0, 1.0, 3.0)
