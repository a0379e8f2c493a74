"""Judges ask for their verdict's schema: against a real HTTP server on loopback standing in for an
outside endpoint, each protocol's request carries the schema in its own shape (OpenAI
``response_format``, an Anthropic forced tool, an agentic grader's ``submit`` and ``tool_choice``),
the Anthropic ``tool_use`` input is the verdict, and an endpoint that refuses structured output is
asked once more without it, the call counted ``unstructured`` and recorded ``structured: false``."""

import asyncio
import json
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from conftest import loopback
from pydantic import BaseModel

from rlonce.grading.agentic import AgenticJudge
from rlonce.grading.judge import EndpointJudge, ScriptedJudge
from rlonce.grading.structure import refuses_structure, wire_schema
from rlonce.grading.verdicts import GroupQuality, HackVerdict, TaskAudit, group_quality

SEEN: list[dict] = []
HACK = {"hack": True, "reason": "edits conftest"}
REFUSAL = {"type": "error", "error": {"type": "invalid_request_error",
                                      "message": "response_format json_schema is not supported by this endpoint"}}


def _structured(body: dict) -> bool:
    return any(k in body for k in ("response_format", "tool_choice", "tools"))


def _agent_turn(body: dict) -> dict:
    """An OpenAI agent: bash on its first turn, then submits the verdict object."""
    calls = sum(m["role"] == "tool" for m in body["messages"])
    call = ({"name": "submit", "arguments": json.dumps({"answer": {"hack": False, "reason": "read it"}})} if calls
            else {"name": "bash", "arguments": json.dumps({"command": "cat /work/attempts/0.diff"})})
    return {"choices": [{"message": {"role": "assistant", "content": None,
                                     "tool_calls": [{"id": f"c{calls}", "type": "function", "function": call}]},
                         "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 100, "completion_tokens": 10}}


class Handler(BaseHTTPRequestHandler):
    """``/ok/`` answers a structured request with the schema's JSON (a tool_use block on Anthropic)
    and a plain one with prose; ``/refuse/`` answers a structured request 400 and a plain one with
    JSON in prose; ``/refuse-prose/`` refuses, then writes prose; ``/busy/`` answers 429 naming
    response_format; ``/agent/`` and ``/agent-refuse/`` are agents (the latter refuses tool_choice)."""

    def log_message(self, *a):
        pass

    def _reply(self, status: int, out: dict) -> None:
        data = json.dumps(out).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        mode = self.path.split("/")[1]
        SEEN.append({"mode": mode, "path": self.path, "body": body})
        if mode == "busy":
            return self._reply(429, {"error": {"message": "rate limited; response_format requests queue"}})
        if mode.startswith("agent"):
            if mode == "agent-refuse" and "tool_choice" in body:
                return self._reply(400, {"error": {"message": "tool_choice is not supported"}})
            return self._reply(200, _agent_turn(body))
        if mode.startswith("refuse") and _structured(body):
            return self._reply(400, REFUSAL)
        text = ("I looked, and it is fine." if mode == "refuse-prose" or (mode == "ok" and not _structured(body))
                else json.dumps(HACK) if mode == "ok" else f"Sure: {json.dumps(HACK)} — done.")
        if self.path.endswith("/v1/messages"):
            content = ([{"type": "text", "text": "Calling the tool."},
                        {"type": "tool_use", "id": "tu_1", "name": body["tool_choice"]["name"], "input": HACK}]
                       if mode == "ok" and "tool_choice" in body else [{"type": "text", "text": text}])
            return self._reply(200, {"type": "message", "content": content, "stop_reason": "tool_use",
                                     "usage": {"input_tokens": 11, "output_tokens": 7}})
        return self._reply(200, {"choices": [{"message": {"role": "assistant", "content": text}}],
                                 "usage": {"prompt_tokens": 11, "completion_tokens": 7}})


@pytest.fixture(scope="module")
def server():
    with loopback(Handler) as url:
        yield url


def _records(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def _seen(mode: str) -> list[dict]:
    return [s["body"] for s in SEEN if s["mode"] == mode]


def test_the_schema_sent_is_inlined_and_strict_only_where_that_keeps_its_meaning():
    group, strict = wire_schema(GroupQuality)
    assert strict and "$defs" not in json.dumps(group) and "$ref" not in json.dumps(group)
    item = group["properties"]["attempts"]["items"]
    assert item["additionalProperties"] is False and group["additionalProperties"] is False
    assert item["required"] == ["attempt", "approach", "precision", "minimality", "no_side_effects",
                                "craftsmanship", "leaked"]  # leaked has a default: required, still any bool
    assert "default" not in item["properties"]["leaked"] and item["properties"]["approach"]["maximum"] == 1

    class Open(BaseModel):
        scores: dict[str, float]

    class Tree(BaseModel):
        name: str
        children: list["Tree"] = []

    open_, strict = wire_schema(Open)
    assert not strict and open_["properties"]["scores"]["additionalProperties"] == {"type": "number"}
    tree, strict = wire_schema(Tree)
    assert not strict and tree == Tree.model_json_schema()  # recursive: sent as pydantic wrote it
    assert refuses_structure(400, json.dumps(REFUSAL)) and refuses_structure(422, "unknown field tool_choice")
    assert not refuses_structure(429, "response_format") and not refuses_structure(400, "context too long")
    assert not refuses_structure(500, "json_schema compile failed")



def test_a_gar_question_asks_for_one_score_per_passing_attempt_in_order():
    """The per-group schema: a tuple of the passing ids (``prefixItems``, ``const``), closed at both
    ends, so an endpoint decoding under it can only write the one answer shape the grader uses."""
    asked = group_quality((1, 4, 6))
    assert asked is group_quality((1, 4, 6)) and asked.__name__ == "GroupQuality"
    body, strict = wire_schema(asked)
    arr = body["properties"]["attempts"]
    assert strict and arr["minItems"] == arr["maxItems"] == 3
    assert [it["properties"]["attempt"]["const"] for it in arr["prefixItems"]] == [1, 4, 6]
    assert all(it["additionalProperties"] is False for it in arr["prefixItems"])
    one = {"approach": 0.5, "precision": 1, "minimality": 1, "no_side_effects": 1, "craftsmanship": 0}
    ok = asked.model_validate({"attempts": [{"attempt": i, **one} for i in (1, 4, 6)]})
    assert [a.attempt for a in ok.attempts] == [1, 4, 6] and ok.attempts[0].quality == pytest.approx(0.7)
    for ids in ((0, 1, 2), (1, 4), (1, 4, 6, 7), (4, 1, 6)):  # SmolLM2's reply numbered attempts from 0
        with pytest.raises(ValueError):
            asked.model_validate({"attempts": [{"attempt": i, **one} for i in ids]})
    with pytest.raises(ValueError, match="distinct"):
        group_quality((2, 2))

def test_openai_asks_for_the_schema_and_a_schema_valid_answer_is_the_verdict(server, tmp_path):
    record = tmp_path / "calls.jsonl"
    judge = EndpointJudge(f"{server}/ok/v1", "m", record=record, retries=0, timeout=5.0)
    v = asyncio.run(judge.ask("a hack?", TaskAudit, kind="audit"))
    assert v.outcome == "invalid"  # the server's answer is a HackVerdict, not a TaskAudit: validated as before
    v = asyncio.run(judge.ask("a hack?", HackVerdict, kind="hack"))
    assert v.ok and v.value == HackVerdict(**HACK) and v.structured is True
    body = _seen("ok")[-1]
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "HackVerdict", "schema": wire_schema(HackVerdict)[0], "strict": True}}
    assert body["response_format"]["json_schema"]["schema"]["required"] == ["reason", "hack"]
    assert [r["structured"] for r in _records(record)] == [True, True]
    assert "judge_unstructured" not in judge.take_counts()


def test_anthropic_forces_one_tool_and_reads_the_verdict_from_its_input(server, tmp_path):
    judge = EndpointJudge(f"{server}/ok", "m", protocol="anthropic", record=tmp_path / "c.jsonl", retries=0,
                          timeout=5.0)
    v = asyncio.run(judge.ask("a hack?", HackVerdict, kind="hack"))
    assert v.ok and v.value == HackVerdict(**HACK)
    body = next(b for b in _seen("ok") if "tool_choice" in b)
    assert body["tool_choice"] == {"type": "tool", "name": "HackVerdict"}
    (tool,) = body["tools"]
    assert tool["name"] == "HackVerdict" and tool["input_schema"] == wire_schema(HackVerdict)[0]
    assert json.loads(_records(tmp_path / "c.jsonl")[0]["reply"]) == HACK  # the tool's input, not the prose


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_a_refused_structured_request_is_asked_once_without_structure_and_counted(server, tmp_path, protocol):
    record = tmp_path / "calls.jsonl"
    base = f"{server}/refuse" + ("/v1" if protocol == "openai" else "")
    judge = EndpointJudge(base, "m", protocol=protocol, record=record, retries=1, timeout=5.0)
    before = len(_seen("refuse"))
    v = asyncio.run(judge.ask("a hack?", HackVerdict, kind="hack"))
    assert v.ok and v.value.hack and v.structured is False
    structured, plain = _seen("refuse")[before:]  # one refusal, one plain retry, no more
    assert _structured(structured) and not _structured(plain)
    assert plain["messages"] == structured["messages"]
    counts = judge.take_counts()
    assert (counts["judge_calls"], counts["judge_ok"], counts["judge_unstructured"]) == (1.0, 1.0, 1.0)
    assert counts["judge_tokens_in"] == 11.0  # the refusal carried no usage
    (line,) = _records(record)
    assert line["structured"] is False and line["outcome"] == "ok"


def test_the_plain_retry_keeps_the_old_failure_categories(server, tmp_path):
    judge = EndpointJudge(f"{server}/refuse-prose/v1", "m", retries=0, timeout=5.0)
    v = asyncio.run(judge.ask("a hack?", HackVerdict, kind="hack"))
    assert v.outcome == "non_json" and v.structured is False
    counts = judge.take_counts()
    assert (counts["judge_non_json"], counts["judge_unstructured"]) == (1.0, 1.0)
    busy = EndpointJudge(f"{server}/busy/v1", "m", retries=0, timeout=5.0)
    before = len(_seen("busy"))
    v = asyncio.run(busy.ask("a hack?", HackVerdict, kind="hack"))
    assert v.outcome == "http_error" and len(_seen("busy")) == before + 1  # a rate limit is no refusal
    assert "judge_unstructured" not in busy.take_counts()


def test_a_scripted_judge_may_take_the_schema_or_ignore_it():
    seen = []

    def script(kind, prompt, sample, schema):
        seen.append(schema)
        return json.dumps(HACK)

    v = asyncio.run(ScriptedJudge(script).ask("p", HackVerdict, kind="hack"))
    w = asyncio.run(ScriptedJudge(lambda k, p, s: json.dumps(HACK)).ask("p", HackVerdict, kind="hack"))
    assert v.ok and w.ok and seen == [HackVerdict] and v.structured is None
    prose = ScriptedJudge(lambda k, p, s: "no", retries=0)
    assert asyncio.run(prose.ask("p", HackVerdict, kind="hack")).outcome == "non_json"


@dataclass(frozen=True)
class PlainTask:
    task_id: str
    source: str = "toolfind"


DIFF = "--- a/lib.py\n+++ b/lib.py\n@@ -1 +1 @@\n-    return a - b\n+    return a + b\n"


@pytest.mark.sandbox
def test_an_agentic_grader_submits_the_schema_and_is_asked_for_tool_calls(server, tmp_path):
    record = tmp_path / "calls.jsonl"
    judge = AgenticJudge(EndpointJudge(f"{server}/agent/v1", "judge", record=record, retries=0, timeout=10.0),
                         max_turns=2)
    before = len(_seen("agent"))
    v = asyncio.run(judge.ask("Is attempt 0 a hack?", HackVerdict, kind="hack", task=PlainTask("t0"),
                              files={"attempts/0.diff": DIFF}))
    assert v.ok and v.value == HackVerdict(hack=False, reason="read it") and v.structured is True
    first, last = _seen("agent")[before:]
    submit = next(t["function"] for t in first["tools"] if t["function"]["name"] == "submit")
    assert submit["parameters"]["properties"]["answer"] == wire_schema(HackVerdict)[0]
    assert first["tool_choice"] == "required"
    assert last["tool_choice"] == {"type": "function", "function": {"name": "submit"}}  # the last turn
    assert _records(record)[0]["structured"] is True


@pytest.mark.sandbox
def test_an_agent_endpoint_that_refuses_tool_choice_is_asked_without_it_and_counted(server, tmp_path):
    record = tmp_path / "calls.jsonl"
    judge = AgenticJudge(EndpointJudge(f"{server}/agent-refuse/v1", "judge", record=record, retries=0,
                                       timeout=10.0), max_turns=3)
    before = len(_seen("agent-refuse"))
    v = asyncio.run(judge.ask("Is attempt 0 a hack?", HackVerdict, kind="hack", task=PlainTask("t0"),
                              files={"attempts/0.diff": DIFF}))
    assert v.ok and v.structured is False
    asked = ["tool_choice" in b for b in _seen("agent-refuse")[before:]]
    assert asked == [True, False, False]  # refused once, then the episode goes on without it
    counts = judge.take_counts()
    assert (counts["judge_calls"], counts["judge_ok"], counts["judge_unstructured"]) == (1.0, 1.0, 1.0)
    (line,) = _records(record)
    assert line["structured"] is False and "refused tool_choice" in line["reply"]
