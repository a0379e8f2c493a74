"""A hostile or broken teacher endpoint: whatever it answers — not JSON, no entry for a prompt token,
a positive or non-finite log-prob, too few entries, a body too large, HTTP 500, nothing in time, no
server at all, and with ``distill.topk`` a token id past the student's vocabulary or fewer entries
than asked — the endpoint teacher raises a one-line ``EngineError`` naming it, and the group it was
scoring is an infrastructure failure (engine_error) in the ledger: never trained, never the
student's failure. A loopback server started here plays the endpoint."""

import asyncio
import json
import re
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlonce.algo.signal import SignalSettings
from rlonce.core.records import Context, FailureCategory, Role, Segment, Sequence
from rlonce.distill.endpoint import EndpointTeacher
from rlonce.distill.executor import DistillExecutor
from rlonce.engine.base import EngineError, SamplingParams
from rlonce.rollout.mixer import MixerSettings, SampleMixer, SourceStats
from rlonce.rollout.orchestrator import Orchestrator, OrchestratorSettings


def _entries(prompt: list[int], mode: str) -> list:
    lp = {"positive": 0.5, "nan": float("nan"), "inf": float("-inf"), "string": "-1.0"}.get(mode, -1.0)
    out = [None] + [{str(t + 1 if mode == "missing" else t): {"logprob": lp, "rank": 1, "decoded_token": "x"}}
                    for t in prompt[1:]]
    if mode in ("oov", "topk"):  # a second entry per position: token 9 (top-k honest) or past the vocabulary
        for e in out[1:]:
            e["99999" if mode == "oov" else "9"] = {"logprob": -2.0, "rank": 2, "decoded_token": "y"}
    return out[:-1] if mode == "short" else out


class Endpoint(BaseHTTPRequestHandler):
    """``POST /<mode>/v1/completions``: a scoring reply, honest ('ok') or broken as ``mode`` says."""

    def do_POST(self):
        mode = self.path.split("/")[1]
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if mode == "slow":
            time.sleep(3)
        if mode == "500":
            raw, status = b"Internal Server Error\nTraceback (most recent call last): ...", 500
        elif mode == "401":
            raw, status = b'{"error": {"message": "Invalid API key"}}', 401
        elif mode == "notjson":
            raw, status = b'{"choices": [{"prompt_logprobs": [null, {"4": ', 200
        elif mode == "huge":
            raw, status = b'{"choices": [' + b" " * (3 << 20) + b"]}", 200
        elif mode == "nochoices":
            raw, status = b'{"choices": []}', 200
        else:
            raw, status = json.dumps({"choices": [{"index": 0, "text": "",
                                                   "prompt_logprobs": _entries(body["prompt"], mode)}]}).encode(), 200
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        try:
            self.wfile.write(raw)
        except (BrokenPipeError, ConnectionResetError):  # the teacher stopped reading: what it should do
            pass

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def endpoint():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group(n: int = 4) -> list[Sequence]:
    """A group of ``n`` with contrast (rewards 1, 0, 1, 0), sampled at temperature 1."""
    def seq(k):
        ctx = Context([Segment(Role.PROMPT, [1, 2, 3]), Segment(Role.MODEL, [4, 5], [-0.5, -0.5], [0, 0], "stop"),
                       Segment(Role.OBSERVATION, [6]), Segment(Role.MODEL, [7], [-0.25], [0], "stop")])
        return Sequence("t", "single-turn", [ctx], reward=float(k % 2 == 0))
    return [seq(k) for k in range(n)]


BROKEN = {"notjson": "not JSON", "missing": "no log-prob for prompt token 4 at position 3",
          "positive": "log-prob 0.5 for prompt token", "nan": "log-prob nan", "inf": "log-prob -inf",
          "string": "log-prob '-1.0'", "short": "6 entries for a prompt of 7 tokens",
          "nochoices": "no choices[0].prompt_logprobs", "huge": "a reply over", "500": "answered HTTP 500: Internal",
          "slow": "did not score a row of 7 tokens within 0.5 s"}


@pytest.mark.parametrize("mode", list(BROKEN))
def test_a_broken_endpoint_is_an_engine_error_naming_it(endpoint, mode):
    url = f"{endpoint}/{mode}/v1"
    teacher = EndpointTeacher(url, "teacher", timeout=0.5, concurrency=2)
    seqs = _group()
    with pytest.raises(EngineError, match=re.escape(url)) as e:
        asyncio.run(teacher.score(seqs))
    assert BROKEN[mode] in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert all(s.teacher_logprobs is None for q in seqs for s in q.contexts[0].segments)  # nothing half-set


TOPK_BROKEN = {"oov": "entry key '99999' at position 3 is not a token id of the student's vocabulary",
               "ok": "1 entries at position 3 where prompt_logprobs 2 asked for 2"}


@pytest.mark.parametrize("mode", list(TOPK_BROKEN))
def test_a_top_k_reply_past_the_vocabulary_or_short_of_k_is_an_engine_error(endpoint, mode):
    """With ``distill.topk``: a token id the student's vocabulary lacks would index past the trainer's
    logits; fewer entries than asked is no top-k. Both fail the group, naming the endpoint."""
    url = f"{endpoint}/{mode}/v1"
    seqs = _group()
    with pytest.raises(EngineError, match=re.escape(url)) as e:
        asyncio.run(EndpointTeacher(url, "teacher", timeout=5, concurrency=1, topk=2, vocab=10).score(seqs))
    assert TOPK_BROKEN[mode] in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert all(s.teacher_topk is None for q in seqs for s in q.contexts[0].segments)
    seqs = _group()  # an honest top-2
    asyncio.run(EndpointTeacher(f"{endpoint}/topk/v1", "teacher", timeout=5, concurrency=1, topk=2,
                                vocab=10).score(seqs))
    assert seqs[0].contexts[0].segments[1].teacher_topk == [[(4, -1.0), (9, -2.0)], [(5, -1.0), (9, -2.0)]]


def test_no_server_at_all_is_an_engine_error_naming_the_endpoint():
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    with pytest.raises(EngineError, match=re.escape(url) + " is unreachable: ConnectError") as e:
        asyncio.run(EndpointTeacher(url, "teacher", timeout=5, concurrency=1).score(_group()))
    assert "\n" not in str(e.value)


def test_an_honest_endpoints_log_probs_land_on_the_trained_tokens_only(endpoint):
    seqs = _group()
    asyncio.run(EndpointTeacher(f"{endpoint}/ok/v1", "teacher", timeout=5, concurrency=1).score(seqs))
    assert [s.teacher_logprobs for s in seqs[0].contexts[0].segments] == [None, [-1.0, -1.0], None, [-1.0]]


SUBMIT = '<tool_call>\n{{"name": "submit", "arguments": {{"answer": "{}"}}}}\n</tool_call><|im_end|>'


def _one_step(url: str, lm):
    """One sync step of one toolfind group of 4, run in real sandboxes by a local executor (a scripted
    student that submits the answer), distilled from the teacher at ``url``."""
    from rlonce.engine.scripted import ScriptedEngine
    from rlonce.envs.toolfind.env import ToolfindEnv
    from rlonce.envs.toolfind.tasks import make_task
    from rlonce.harness.loop import HarnessLimits
    from rlonce.model.chat import get_format
    from rlonce.rollout.runner import LocalExecutor, RolloutSpec

    task = make_task("train", 2)
    spec = RolloutSpec(encode=lm.encode, decode=lm.decode, chat_format=get_format("hermes"),
                       sampling=SamplingParams(max_tokens=64), limits=HarnessLimits(max_turns=3))

    async def go():
        mixer = SampleMixer({"s": SourceStats(target=1, acceptance=1.0, duration=0.01, seen=1, share=1.0)},
                            MixerSettings(budget=1.0))
        student = ScriptedEngine([SUBMIT.format(task.answer)] * 4, lm.encode)
        teacher = EndpointTeacher(url, "teacher", timeout=0.5, concurrency=2)
        executor = DistillExecutor(LocalExecutor(ToolfindEnv, student, spec), teacher, Counter())
        o = Orchestrator(executor, lambda src, i: task, mixer, SignalSettings(distill={"s": (1.0, 1.0)}),
                         OrchestratorSettings(mode="sync", group_size=4, staleness=1, batch=1, dispatch_cap=1.0,
                                              max_sessions=64))
        res = await o.collect(1)
        await o.close()
        return res

    return asyncio.run(go())


@pytest.mark.sandbox
@pytest.mark.parametrize("mode", ["missing", "500", "closed"])
def test_a_group_whose_teacher_fails_is_an_infrastructure_failure_never_trained(endpoint, mode, lm):
    url = f"http://127.0.0.1:{_closed_port()}/v1" if mode == "closed" else f"{endpoint}/{mode}/v1"
    res = _one_step(url, lm)
    e = res.ledger["s"]
    assert e.dispatched == 4 and e.infra_failed == 4 and e.infra_by_category == {"engine_error": 4}
    assert e.retained == 0 and e.no_contrast_filtered == 0 and res.rows == [] and res.samples == []
    assert all(s.infra_failed and s.failure is FailureCategory.ENGINE_ERROR and s.reward is None for s in res.finished)
    e.check()
    ok = _one_step(f"{endpoint}/ok/v1", lm)  # the same group, the endpoint answering: it trains
    assert ok.ledger["s"].retained == 4 and ok.ledger["s"].infra_failed == 0 and len(ok.rows) == 4
    for r in ok.rows:  # the honest endpoint's -1.0 on every trained token, 0.0 elsewhere
        assert r.teacher_logprobs == [-1.0 if m else 0.0 for m in r.loss_mask] and sum(r.loss_mask) > 0


@pytest.mark.parametrize("mode", [m for m in BROKEN if m != "slow"])
def test_the_preflight_refuses_a_broken_endpoint_in_one_line_before_the_run(endpoint, mode):
    """``EndpointTeacher.preflight`` (what ``Distillation.build`` asks of each endpoint teacher): an
    endpoint whose reply is broken is a one-line ConfigError naming it before any group runs."""
    from rlonce.config import ConfigError

    url = f"{endpoint}/{mode}/v1"
    with pytest.raises(ConfigError, match=re.escape(url)) as e:
        EndpointTeacher(url, "teacher", timeout=5, concurrency=1).preflight([1, 2, 3])
    msg = str(e.value)
    assert "\n" not in msg and ("HTTP 500" if mode == "500" else "malformed reply") in msg, msg


def test_the_preflight_says_a_refused_key_is_the_keys_fault_and_a_short_top_k_is_the_servers_limit(endpoint):
    from rlonce.config import ConfigError

    with pytest.raises(ConfigError, match="HTTP 401 .*Invalid API key.*set distill.teacher_api_key_env") as e:
        EndpointTeacher(f"{endpoint}/401/v1", "teacher", timeout=5, concurrency=1, topk=4).preflight([1, 2, 3])
    assert "max-logprobs" not in str(e.value)
    with pytest.raises(ConfigError, match="malformed reply: 1 entries .* start vLLM with --max-logprobs 2"):
        EndpointTeacher(f"{endpoint}/ok/v1", "teacher", timeout=5, concurrency=1, topk=2).preflight([1, 2, 3])


def test_the_preflight_passes_an_honest_endpoint_and_only_says_a_silent_one(endpoint):
    """An honest endpoint passes; one that does not answer (no server, or past the timeout) is not
    refused — it may still be starting; its groups are infrastructure failures until it answers."""
    from rlonce.config import ConfigError

    assert EndpointTeacher(f"{endpoint}/ok/v1", "teacher", timeout=5, concurrency=1).preflight([1, 2, 3]) is None
    assert EndpointTeacher(f"{endpoint}/topk/v1", "teacher", timeout=5, concurrency=1, topk=2,
                           vocab=10).preflight([1, 2, 3]) is None
    with pytest.raises(ConfigError, match="1 entries at position 1 where prompt_logprobs 2 asked for 2"):
        EndpointTeacher(f"{endpoint}/ok/v1", "teacher", timeout=5, concurrency=1, topk=2).preflight([1, 2, 3])
    for url, timeout in [(f"http://127.0.0.1:{_closed_port()}/v1", 5), (f"{endpoint}/slow/v1", 0.5)]:
        line = EndpointTeacher(url, "teacher", timeout=timeout, concurrency=1).preflight([1, 2, 3])
        assert line.startswith(f"teacher endpoint {url} did not answer a scoring request before the run"), line
