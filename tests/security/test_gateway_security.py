"""Attacks on the gateway's HTTP server, each against a real uvicorn server on loopback.

The client is the adversary (a policy under training, or anyone who can reach ``rlonce serve``):
it tries to reach other clients' sessions and the trainer's routes, to crash the server with
bodies no parser expects, to poison sampling with absurd values, to exhaust memory, the event
loop and sockets, and to fill the session table. Each test is one attack and the defence that
holds against it; the engine behind the gateway is the scripted model (or the embedded one,
where the engine's own arithmetic is what the attack aims at).
"""

import json
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from conftest import slack

from rlonce.engine.base import SamplingParams
from rlonce.engine.scripted import ScriptedEngine
from rlonce.gateway.core import Gateway
from rlonce.gateway.http import ServerThread, load_admin_key, make_app
from rlonce.gateway.session import Budgets, GatewaySettings
from rlonce.model.chat import get_format

FMT = get_format("hermes")
ADMIN_KEY = "admin-secret"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
HELLO = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]}


class Cycling(ScriptedEngine):
    """A scripted model that never runs out of turns."""

    async def generate(self, prompt_ids, sampling, watch=None):
        self._turns.append(self._turns[0])
        return await super().generate(prompt_ids, sampling, watch)


@pytest.fixture()
def serve(lm):
    """Start a served gateway: ``serve(engine=None, app={...}, server={...}, **gateway_kwargs)``."""
    started = []

    def start(engine=None, app=None, server=None, **kw):
        engine = engine or Cycling([FMT.assistant_text("ok", [])], lm.encode)
        kw = {"auto_open": True, "honor_client_sampling": True, **kw}
        gw = Gateway(GatewaySettings(engine=engine, encode=lm.encode, decode=lm.decode, fmt=FMT,
                                     sampling=SamplingParams(max_tokens=8), tokenizer=lm.tokenizer,
                                     offload=ThreadPoolExecutor(4), **kw))
        srv = ServerThread(make_app(gw, admin_key=ADMIN_KEY, **(app or {})), **(server or {})).start()
        started.append(srv)
        return gw, srv.base_url

    yield start
    for s in started:
        s.stop()


def _chat(base, key, body=HELLO, sid=None, raw=None, timeout=30):
    url = f"{base}/sessions/{sid}/v1/chat/completions" if sid else f"{base}/v1/chat/completions"
    h = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    return httpx.post(url, content=raw, headers=h, timeout=timeout) if raw is not None else \
        httpx.post(url, json=body, headers=h, timeout=timeout)


def _openai_error(r, status, *words):
    assert r.status_code == status, (r.status_code, r.text[:300])
    msg = r.json()["error"]["message"]
    assert all(w in msg for w in words), msg
    return msg


# ---- ownership and the trainer's routes ------------------------------------------------------

def test_a_session_answers_only_the_key_that_opened_it(serve):
    gw, base = serve()
    assert _chat(base, "alice-key", sid="s1").status_code == 200
    before = gw.sessions["s1"].export()
    # another key, by path; and the session's id sent as the key (the old "key names the session")
    _openai_error(_chat(base, "mallory-key", sid="s1"), 403, "belongs to another key")
    _openai_error(_chat(base, "s1"), 403, "belongs to another key")
    r = httpx.post(f"{base}/sessions/s1/v1/messages", headers={"x-api-key": "mallory-key"},
                   json={"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    assert gw.sessions["s1"].export() == before
    assert _chat(base, "alice-key", sid="s1").status_code in (200, 409)  # the owner still reaches it


def test_a_trainer_opened_session_is_reached_with_its_secret_key_not_its_id(serve):
    gw, base = serve(auto_open=False)
    s = gw.open(metadata={"arm": "outside"})  # what run_outside does; s.key goes to the harness
    assert len(s.key) >= 24 and s.key != s.id
    _openai_error(_chat(base, s.id, sid=s.id), 403, "belongs to another key")
    _openai_error(_chat(base, s.id), 403, "belongs to another key")
    _openai_error(_chat(base, "guess"), 404, "unknown session")  # no auto-open in training
    assert _chat(base, s.key, sid=s.id).status_code == 200 and len(s.generations) == 1
    assert _chat(base, "anything", sid="nope").status_code == 404


def test_trajectory_reward_rerender_and_listing_need_the_admin_key(serve):
    gw, base = serve()
    assert _chat(base, "alice", sid="s1").status_code == 200
    routes = [("GET", "/sessions"), ("GET", "/sessions/s1/trajectory"), ("GET", "/sessions/s1/rerender"),
              ("POST", "/sessions/s1/reward")]
    for method, path in routes:
        for headers in ({}, {"authorization": "Bearer alice"}, {"x-api-key": "s1"}):
            r = httpx.request(method, base + path, headers=headers, json={"reward": 1e9})
            _openai_error(r, 401, "admin key")
        r = httpx.request(method, base + path, headers=ADMIN, json={"reward": 0.5})
        assert r.status_code == 200, (path, r.text)
    assert gw.sessions["s1"].reward == 0.5
    assert [x["id"] for x in httpx.get(f"{base}/sessions", headers=ADMIN).json()["sessions"]] == ["s1"]


def test_admin_key_file_is_made_private_once_and_reused(tmp_path: Path):
    path = tmp_path / "admin-key"
    key = load_admin_key(path)
    assert len(key) >= 32 and path.stat().st_mode & 0o777 == 0o600
    assert load_admin_key(path) == key  # a restarted server keeps the trainer's key
    (tmp_path / "empty").write_text("")
    with pytest.raises(ValueError, match="empty"):
        load_admin_key(tmp_path / "empty")


def test_no_api_key_is_401_in_each_protocol_shape(serve):
    gw, base = serve()
    _openai_error(httpx.post(f"{base}/v1/chat/completions", json=HELLO), 401, "no API key")
    r = httpx.post(f"{base}/v1/messages", json={"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert gw.sessions == {}


# ---- bodies no parser expects -----------------------------------------------------------------

def test_deeply_nested_json_is_400_not_500(serve):
    gw, base = serve()
    for depth in (65, 5_000, 200_000):
        raw = '{"messages": [{"role": "user", "content": "x"}], "metadata": ' + "[" * depth + "]" * depth + "}"
        _openai_error(_chat(base, "k", raw=raw.encode()), 400, "nested deeper than 64")
    schema = {"type": "object"}
    for _ in range(80):
        schema = {"type": "object", "properties": {"x": schema}}
    tools = [{"type": "function", "function": {"name": "t", "parameters": schema}}]
    _openai_error(_chat(base, "k", {**HELLO, "tools": tools}), 400, "nested deeper")
    assert _chat(base, "k").status_code == 200 and len(gw.sessions["k"].generations) == 1


def test_deeply_nested_tool_call_arguments_are_400_not_500(serve):
    gw, base = serve()
    args = "[" * 100_000 + "]" * 100_000
    msgs = HELLO["messages"] + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
                                                             "function": {"name": "t", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "c", "content": "out"}]
    _openai_error(_chat(base, "k", {"messages": msgs}), 400, "arguments", "nested deeper")
    deep = {}
    for _ in range(70):
        deep = {"a": deep}
    r = httpx.post(f"{base}/v1/messages", headers={"x-api-key": "k2"}, json={"max_tokens": 5, "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "u", "name": "t", "input": deep}]},
        {"role": "user", "content": "y"}]})
    assert r.status_code == 400 and r.json()["type"] == "error" and "nested" in r.json()["error"]["message"]
    assert "k" not in gw.sessions and "k2" not in gw.sessions  # a refused request opens no session


def test_lone_surrogates_are_400_not_500(serve):
    gw, base = serve()
    for raw in (rb'{"messages": [{"role": "user", "content": "a\ud800b"}]}',
                rb'{"messages": [{"role": "user", "content": "x", "\udfff": 1}]}',
                rb'{"messages": [{"role": "user", "content": "ok \ud83d\ude00"}], "user": "\udc00"}'):
        _openai_error(_chat(base, "k", raw=raw), 400, "lone UTF-16 surrogate", "valid Unicode")
    assert _chat(base, "k",
                 raw=rb'{"messages": [{"role": "user", "content": "a pair \ud83d\ude00"}]}').status_code == 200


def test_invalid_utf8_and_non_json_constants_are_400(serve):
    _, base = serve()
    for raw in (b'{"messages": "\xff\xfe"}', b'{"messages": [], "temperature": NaN}', b'{"a": Infinity}'):
        _openai_error(_chat(base, "k", raw=raw), 400, "not valid JSON")


# ---- sampling values and non-finite numbers ---------------------------------------------------

@pytest.mark.parametrize("field,value,words", [
    ("temperature", "1e400", ("out of range", "finite")), ("temperature", "-1e400", ("finite",)),
    ("temperature", "-0.5", ("'temperature' must be a number from 0 to 2",)), ("temperature", "2.5", ("0 to 2",)),
    ("top_p", "1.5", ("'top_p' must be a number from 0 to 1",)), ("top_p", "-1", ("0 to 1",)),
    ("max_tokens", "0", ("'max_tokens' must be an integer from 1",)), ("max_tokens", "1099511627776", ("from 1",)),
    ("max_completion_tokens", "-3", ("from 1",))])
def test_sampling_values_out_of_range_are_400_naming_the_field(serve, field, value, words):
    gw, base = serve()
    raw = f'{{"messages": [{{"role": "user", "content": "x"}}], "{field}": {value}}}'.encode()
    _openai_error(_chat(base, "k", raw=raw), 400, *words)
    if field == "max_completion_tokens":  # not an Anthropic field
        return
    r = httpx.post(f"{base}/v1/messages", headers={"x-api-key": "a"},
                   content=f'{{"messages": [{{"role": "user", "content": "x"}}], "{field}": {value}}}'.encode())
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert all(s.generations == [] for s in gw.sessions.values())


def test_a_vanishing_temperature_decodes_greedily_on_the_real_engine(serve, lm):
    """1e-300 overflowed the engine's float32 logits (NaN probabilities, a 503): now 0 and any
    temperature below 1e-3 decode greedily, and agree token for token."""
    from rlonce.engine.torch_engine import TorchEngine

    engine = TorchEngine(lm.model, eos_token_ids=lm.eos_token_ids, pad_token_id=0, seed=0)
    try:
        gw, base = serve(engine=engine)
        texts = []
        for i, t in enumerate((1e-300, 0, 5e-324, 1e-4)):
            r = _chat(base, f"k{i}", {**HELLO, "temperature": t, "max_tokens": 6})
            assert r.status_code == 200, r.text
            texts.append(r.json()["choices"][0]["message"]["content"])
        assert len(set(texts)) == 1
        lp = [x for s in gw.sessions.values() for c in s.contexts for seg in c.segments if seg.logprobs
              for x in seg.logprobs]
        assert lp and all(x == 0.0 for x in lp)  # greedy: the sampled token had all the mass
    finally:
        engine.close()


def _strict(line: str):
    return json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c} emitted"))


def test_streams_and_replies_carry_only_finite_json(serve):
    _, base = serve()
    bad = b'{"model": "m", "input": "x", "stream": true, "temperature": 1e400}'
    r = httpx.post(f"{base}/v1/responses", content=bad, headers={"authorization": "Bearer k"})
    assert r.status_code == 400 and "Infinity" not in r.text
    for i, path in enumerate(("/v1/responses", "/v1/chat/completions", "/v1/messages")):
        body = {"model": "m", "input": "x", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                "temperature": 2, "top_p": 1e-300, "stream": True}
        r = httpx.post(base + path, json=body, headers={"authorization": f"Bearer s{i}"})
        assert r.status_code == 200, r.text
        data = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ") and ln != "data: [DONE]"]
        assert data and all(_strict(d) is not None for d in data)


# ---- memory, event loop, sockets --------------------------------------------------------------

def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


class _PeakRss:
    """Samples this process's resident memory (the server runs in it) while in the block."""

    def __enter__(self):
        self.base = self.peak = _rss()
        self.done = False
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()
        return self

    def _run(self):
        while not self.done:
            self.peak = max(self.peak, _rss())
            time.sleep(0.01)

    def __exit__(self, *exc):
        self.done = True
        self.t.join()
        self.growth = self.peak - self.base


def _connect(base):
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _response(s) -> bytes:
    """One whole HTTP response (head and content-length body) from a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = s.recv(65536)
        if not more:
            return data
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    n = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
    while len(body) < n:
        body += s.recv(65536)
    return head + b"\r\n\r\n" + body


def test_an_oversized_chunked_upload_is_cut_off_at_the_cap(serve):
    """The body had been read whole before its size was checked (512 MiB: +1 GiB server memory).
    Now the server answers 413 once 4 MiB have arrived and closes the connection."""
    _, base = serve()
    s = _connect(base)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer k\r\n"
              b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n" % (1 << 20) + b"[" * (1 << 20) + b"\r\n"
    sent, target = 0, 256 << 20
    with _PeakRss() as mem:
        while sent < target and not select.select([s], [], [], 0)[0]:
            try:
                s.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                break
            sent += 1 << 20
        head = b""
        try:  # the server closes after its answer; headers and body may arrive in separate reads
            while more := s.recv(65536):
                head += more
        except (ConnectionResetError, TimeoutError):
            pass
    s.close()
    print(f"oversized upload: client sent {sent >> 20} MiB of {target >> 20}; server RSS +{mem.growth >> 20} MiB")
    assert sent < 48 << 20, f"the server kept reading: {sent >> 20} MiB accepted"
    assert mem.growth < 64 << 20, f"server memory grew {mem.growth >> 20} MiB"
    assert head.startswith(b"HTTP/1.1 413") and b"request body over 4194304 bytes" in head, head[:200]


def test_a_declared_oversized_body_is_refused_before_it_is_sent(serve):
    _, base = serve()
    s = _connect(base)
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: k\r\ncontent-length: 536870912\r\n\r\n")
    head = _response(s)
    s.close()
    assert head.startswith(b"HTTP/1.1 413") and b"request_too_large" in head


def test_a_body_trickled_too_slowly_times_out_with_408(serve):
    gw, base = serve(app={"body_timeout": 1.0})
    s = _connect(base)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer k\r\n"
              b"content-length: 1000\r\n\r\n{\"messages\"")
    t0 = time.monotonic()
    head = _response(s)
    s.close()
    assert head.startswith(b"HTTP/1.1 408") and b"send it at once" in head
    assert time.monotonic() - t0 < slack(5) and gw.sessions == {}


def test_a_4mib_prompt_does_not_block_other_clients(serve):
    """Rendering and tokenizing run on the gateway's executor, not on the event loop: a small
    request completes while a 4 MiB prompt is still being tokenized."""
    gw, base = serve(app={"max_body_bytes": 5 << 20}, budgets=Budgets(8, 1 << 20))
    prompt = ("lorem ipsum dolor sit amet " * 200_000)[:4 << 20]
    big = {}
    t0 = time.monotonic()
    assert _chat(base, "alone").status_code == 200
    alone_s = time.monotonic() - t0  # this machine's own pace now: a loaded laptop is slow for both

    def send_big():
        t0 = time.monotonic()
        big["r"] = _chat(base, "big", {"messages": [{"role": "user", "content": prompt}]}, timeout=slack(60))
        big["s"] = time.monotonic() - t0

    th = threading.Thread(target=send_big)
    th.start()
    time.sleep(0.5)  # the big body is in; tokenizing it takes seconds on this machine
    t0 = time.monotonic()
    small = _chat(base, "small")
    small_s = time.monotonic() - t0
    still_busy = th.is_alive()
    th.join()
    print(f"small request {small_s * 1000:.0f} ms while a 4 MiB prompt took {big['s']:.2f} s")
    assert small.status_code == 200 and big["r"].status_code == 200
    assert big["r"].json()["usage"]["prompt_tokens"] > 1_000_000
    # blocked, the small request would end with the big one; relative bounds hold on a loaded machine
    assert still_busy and small_s < max(1.5, 10 * alone_s, big["s"] / 4), (small_s, alone_s, big["s"])


def test_half_sent_headers_are_closed_by_the_header_timeout(serve):
    """1,000 half-sent request heads (and a client trickling one byte every 0.2 s) had stayed open
    forever; now each is closed once its headers are 1 s late, and real clients are served."""
    _, base = serve(server={"header_timeout": 1.0})
    socks = []
    for i in range(1000):
        s = _connect(base)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" if i % 2 else b"GE")
        socks.append(s)
    trickle = _connect(base)
    t0 = time.monotonic()
    assert _chat(base, "k").status_code == 200  # served meanwhile
    closed_at = None
    while time.monotonic() - t0 < 6:
        try:
            trickle.sendall(b"x")
        except (BrokenPipeError, ConnectionResetError):
            closed_at = time.monotonic() - t0
            break
        time.sleep(0.2)
    assert closed_at is not None and closed_at < 4, closed_at
    open_left = 0
    for s in socks:
        s.settimeout(max(0.1, 4 - (time.monotonic() - t0)))
        try:
            open_left += s.recv(1) != b""
        except ConnectionResetError:
            pass
        except TimeoutError:
            open_left += 1
        s.close()
    trickle.close()
    assert open_left == 0


def test_an_idle_keep_alive_connection_is_closed(serve):
    _, base = serve(server={"idle_timeout": 1})
    s = _connect(base)
    body = json.dumps(HELLO).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer k\r\n"
              b"content-length: %d\r\n\r\n" % len(body) + body)
    assert _response(s).startswith(b"HTTP/1.1 200")
    t0 = time.monotonic()
    assert s.recv(1) == b"" and time.monotonic() - t0 < slack(4)  # the server hung up
    s.close()


# ---- the session table ------------------------------------------------------------------------

def _age(gw, seconds: float) -> None:
    """Every session last used ``seconds`` earlier, and the once-a-second sweep due: time passes
    for the expiry rules without the test sleeping (a loaded host cannot outrun a short TTL)."""
    for s in gw.sessions.values():
        s.last_used -= seconds
    gw._swept -= seconds


def test_idle_sessions_expire_and_free_the_cap(serve):
    """`rlonce serve` never dropped sessions: after its cap every new key got 429 until restart."""
    gw, base = serve(max_sessions=2, idle_ttl=60)
    assert _chat(base, "a").status_code == 200 and _chat(base, "b").status_code == 200
    r = _chat(base, "c")
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
    assert "retry later" in r.json()["error"]["message"]
    _age(gw, 61)
    assert _chat(base, "c").status_code == 200
    assert set(gw.sessions) == {"c"}


def test_ended_sessions_expire_before_idle_ones(serve, lm):
    gw, base = serve(budgets=Budgets(8, 40), idle_ttl=600, ended_ttl=30)
    long = {"messages": [{"role": "user", "content": "word " * 100}]}
    assert _chat(base, "ended", long).json()["choices"][0]["finish_reason"] == "length"
    assert gw.sessions["ended"].status == "truncated"
    _openai_error(_chat(base, "ended", long), 409, "has ended", "open a new session")
    assert _chat(base, "active").status_code == 200
    _age(gw, 31)  # past ended_ttl, far from idle_ttl
    assert _chat(base, "later").status_code == 200
    assert set(gw.sessions) == {"active", "later"}


def test_async_server_that_cannot_bind_raises_oserror_not_systemexit():
    """uvicorn exits the process when it cannot bind; the gateway turns that into an OSError
    the CLI prints as one line."""
    import asyncio
    import socket

    from fastapi import FastAPI

    from rlonce.gateway.server import AsyncServer

    taken = socket.create_server(("127.0.0.1", 0))
    app = FastAPI()
    app.state.admin_key = "k"

    async def go():
        async with AsyncServer(app, port=taken.getsockname()[1]):
            pass

    try:
        with pytest.raises(OSError, match="could not listen on 127.0.0.1"):
            asyncio.run(go())
    finally:
        taken.close()


# ---- serving beyond loopback ---------------------------------------------------------------

def test_serving_beyond_loopback_needs_an_api_key():
    """`rlonce serve --host 0.0.0.0` without --api-key is refused before anything binds or loads."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "rlonce.cli", "serve", "--model", "embedded", "--host", "0.0.0.0",
                        "--port", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "pass --api-key KEY" in r.stderr and r.stderr.count("\n") == 1


def test_with_api_keys_only_their_holders_open_sessions(serve):
    gw, base = serve(app={"api_keys": ["team-a", "team-b"]})
    _openai_error(_chat(base, "stranger"), 401, "invalid API key")
    assert not gw.sessions  # refused before any session opened
    assert _chat(base, "team-a", sid="a1").status_code == 200
    _openai_error(_chat(base, "team-b", sid="a1"), 403, "another key")  # a key reaches only its own sessions
    r = httpx.post(f"{base}/v1/messages", headers={"x-api-key": "stranger"},
                   json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "q"}]})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_request_heads_over_64_kib_are_431_whole_or_in_pieces(serve):
    """The documented cap on a request's line and headers holds for a head that arrives in one
    read (h11's own bound sees only a head still arriving) and for one trickled in pieces."""
    gw, base = serve()
    statuses = set()
    for kb in (65, 70, 100, 1000):
        try:
            r = httpx.post(f"{base}/v1/chat/completions", json=HELLO, timeout=30,
                           headers={"authorization": "Bearer k", "x-pad": "a" * (kb << 10)})
        except httpx.TransportError:  # cut off while still sending (h11's bound on a head in pieces)
            statuses.add("closed")
            continue
        statuses.add(r.status_code)
        assert r.status_code in (431, 400), (kb, r.status_code)
        if r.status_code == 431:
            _openai_error(r, 431, "65536-byte cap")
    assert 431 in statuses, statuses
    r = httpx.post(f"{base}/v1/messages", json={"max_tokens": 5, **HELLO}, timeout=30,
                   headers={"x-api-key": "k", "anthropic-version": "2023-06-01", "x-pad": "a" * (70 << 10)})
    assert r.status_code == 431 and r.json()["type"] == "error", r.text[:200]
    ok = _chat(base, "k2")  # a head under the cap is served
    assert ok.status_code == 200 and not gw.sessions.get("k") and "k2" in gw.sessions


def test_refused_requests_open_no_session(serve):
    """A request the turn refuses (its prompt over the context budget) leaves no session behind:
    3,000 of them must not fill the session table."""
    gw, base = serve(budgets=Budgets(max_tokens_per_turn=8, max_context=64), context_errors=True)
    long = {"messages": [{"role": "user", "content": "word " * 200}]}
    before = len(gw.sessions)
    with httpx.Client(timeout=30) as c:
        for i in range(300):
            r = c.post(f"{base}/v1/chat/completions", json=long, headers={"authorization": f"Bearer key{i}"})
            assert r.status_code == 400, r.text[:200]
    assert len(gw.sessions) == before
    assert _chat(base, "fine").status_code == 200 and len(gw.sessions) == before + 1
