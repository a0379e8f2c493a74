"""Judges against a real HTTP server on loopback: verdicts parsed and validated, every failure
counted by category and never raised, the cache, the record (without the key), retries."""

import asyncio
import json
import socket
import time
from http.server import BaseHTTPRequestHandler

import pytest
from conftest import loopback

from rlonce.grading.graders import kappa
from rlonce.grading.judge import EndpointJudge, JudgeFailed, ScriptedJudge, parse_verdict
from rlonce.grading.verdicts import GroupQuality, HackVerdict

SEEN: list[dict] = []


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        SEEN.append({"path": self.path, "headers": dict(self.headers), "body": body})
        mode = self.path.split("/")[1]
        if mode == "slow":
            time.sleep(1.5)
        if mode == "err":
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"upstream exploded")
            return
        text = {"ok": '{"hack": true, "reason": "edits conftest"}', "prose": "I think it is fine.",
                "wrong": '{"verdict": "yes"}', "slow": '{"hack": false}',
                "fenced": 'Sure!\n```json\n{"hack": false, "reason": "clean"}\n```'}.get(mode, "")
        if self.path.endswith("/v1/messages"):
            out = {"type": "message", "content": [{"type": "text", "text": text}],
                   "usage": {"input_tokens": 11, "output_tokens": 7}}
        else:
            out = {"choices": [{"message": {"role": "assistant", "content": text}}],
                   "usage": {"prompt_tokens": 11, "completion_tokens": 7}}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def server():
    with loopback(Handler) as url:
        yield url


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_parse_verdict_finds_the_json_object_and_names_what_is_wrong():
    assert parse_verdict('text {"hack": true} more', HackVerdict).hack is True
    assert parse_verdict('{"a": {"b": 1}} then {"hack": false}', HackVerdict).hack is False
    with pytest.raises(JudgeFailed) as e:
        parse_verdict("no braces here", HackVerdict)
    assert e.value.category == "non_json"
    with pytest.raises(JudgeFailed) as e:
        parse_verdict('{"attempts": [{"attempt": 0, "approach": 2}]}', GroupQuality)
    assert e.value.category == "invalid"


def test_cohens_kappa_by_hand():
    # 20 pairs: 7 both yes, 2 yes/no, 3 no/yes, 8 both no → po 0.75, pe 0.45·0.5 + 0.55·0.5 = 0.5, κ 0.5
    assert kappa({"tt": 7, "tf": 2, "ft": 3, "ff": 8}) == pytest.approx(0.5)
    assert kappa({"tt": 5}) != kappa({"tt": 5})  # one verdict throughout: chance agreement 1, κ undefined
    assert kappa({"tf": 3, "ft": 3}) == pytest.approx(-1.0)
    assert kappa({}) != kappa({})  # NaN without pairs


def test_endpoint_judge_verdicts_and_every_failure_category(server, tmp_path, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "sk-secret-123")
    record = tmp_path / "calls.jsonl"

    def judge(mode, **kw):
        return EndpointJudge(f"{server}/{mode}/v1", "m", api_key_env="JUDGE_KEY", record=record, retries=0,
                             timeout=kw.pop("timeout", 5.0), **kw)

    async def go():
        out = {}
        for mode in ("ok", "fenced", "prose", "wrong", "err"):
            out[mode] = await judge(mode).ask(f"is {mode} a hack?", HackVerdict, kind="hack")
        out["slow"] = await judge("slow", timeout=0.3).ask("slow?", HackVerdict, kind="hack")
        out["down"] = await EndpointJudge(f"http://127.0.0.1:{_closed_port()}/v1", "m", record=record,
                                          retries=0).ask("down?", HackVerdict, kind="hack")
        out["anthropic"] = await EndpointJudge(f"{server}/ok", "m", protocol="anthropic", api_key_env="JUDGE_KEY",
                                               record=record, retries=0).ask("a?", HackVerdict, kind="hack")
        return out

    out = asyncio.run(go())
    assert out["ok"].ok and out["ok"].value.hack and (out["ok"].tokens_in, out["ok"].tokens_out) == (11, 7)
    assert out["fenced"].ok and out["fenced"].value.reason == "clean"
    assert out["anthropic"].ok and out["anthropic"].value.hack
    assert {k: v.outcome for k, v in out.items() if not v.ok} == {
        "prose": "non_json", "wrong": "invalid", "err": "http_error", "slow": "timeout", "down": "down"}
    lines = [json.loads(x) for x in record.read_text().splitlines()]
    assert len(lines) == 8 and {x["kind"] for x in lines} == {"hack"}
    assert "sk-secret-123" not in record.read_text()  # the key never reaches the record
    chat = next(s for s in SEEN if s["path"] == "/ok/v1/chat/completions")
    assert chat["headers"]["authorization"] == "Bearer sk-secret-123" and chat["body"]["model"] == "m"
    msgs = next(s for s in SEEN if s["path"] == "/ok/v1/messages")
    assert msgs["headers"]["x-api-key"] == "sk-secret-123" and msgs["body"]["system"]


def test_cache_retries_counts_and_call_ids(server, tmp_path):
    calls = []

    def script(kind, prompt, sample):
        calls.append(sample)
        return "nonsense" if len(calls) == 1 else '{"hack": false}'

    j = ScriptedJudge(script, retries=1, record=tmp_path / "r.jsonl")

    async def go():
        a = await j.ask("p", HackVerdict, kind="hack")
        b = await j.ask("p", HackVerdict, kind="hack")  # cached
        c = await j.ask("p", HackVerdict, kind="hack", sample=1)  # a second, independent draw
        return a, b, c

    a, b, c = asyncio.run(go())
    assert a.ok and not a.cached and b.cached and c.ok and not c.cached
    assert calls == [0, 1, 1000]  # the retry drew again; sample 1 is its own seed
    counts = j.take_counts()
    assert counts["judge_calls"] == 2 and counts["judge_cached"] == 1 and counts["judge_ok"] == 2
    assert j.take_counts() == {}
    # {call} gives each request its own path (rlonce serve: one session per concurrent call)
    e = EndpointJudge(f"{server}/ok/sessions/{{call}}/v1", "m", retries=0)
    asyncio.run(e.ask("q1", HackVerdict, kind="hack"))
    asyncio.run(e.ask("q2", HackVerdict, kind="hack"))
    paths = [s["path"] for s in SEEN if "/sessions/" in s["path"]]
    assert len(paths) == 2 and paths[0] != paths[1]
