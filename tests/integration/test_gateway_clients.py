"""What real clients send that the basic protocol tests do not: Anthropic's token count (Claude
Code sizes its context with it), side requests in parallel on one key, ``"stream": null``, a
retry of an ended session, unknown paths. Real HTTP on loopback, the official SDKs, the dripping
engine of ``test_gateway_streaming`` (a turn that takes a known time).
"""

import threading
import time

import anthropic
import httpx
import openai
from test_gateway_streaming import FMT, TOOLS, Dripping, _gateway

from rlonce.gateway.http import ServerThread, make_app
from rlonce.gateway.session import Budgets

TEXT = "one two three four five" + FMT.turn_end
ANTHROPIC_TOOLS = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                   for t in TOOLS]


def test_count_tokens_is_the_prompt_a_turn_then_encodes(lm):
    engine = Dripping(TEXT, lm.encode, gap=0.0)
    gw = _gateway(lm, engine)
    with ServerThread(make_app(gw)) as srv:
        client = anthropic.Anthropic(base_url=srv.base_url, api_key="counter", max_retries=0)
        ask = {"model": "m", "system": [{"type": "text", "text": "You fix code."}], "tools": ANTHROPIC_TOOLS,
               "messages": [{"role": "user", "content": [{"type": "text", "text": "find the bug"}]}]}
        counted = client.messages.count_tokens(**ask).input_tokens
        by_path = httpx.post(f"{srv.base_url}/sessions/any/v1/messages/count_tokens", json=ask,
                             headers={"x-api-key": "counter", "anthropic-version": "2023-06-01"})
        assert not gw.sessions  # counting opens no session
        reply = client.messages.create(max_tokens=20, **ask)
        recorded = gw.sessions["counter"].contexts[0].segments[0].token_ids
        assert counted == reply.usage.input_tokens == len(recorded) > 40  # the system, the tools, the task
        assert by_path.status_code == 200 and by_path.json() == {"input_tokens": counted}
        # without a key, or with a malformed body: the Anthropic error shape, nothing opened
        r = httpx.post(f"{srv.base_url}/v1/messages/count_tokens", json=ask)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = httpx.post(f"{srv.base_url}/v1/messages/count_tokens", json={"messages": 3}, headers={"x-api-key": "k"})
        assert r.status_code == 400 and r.json()["type"] == "error" and "k" not in gw.sessions


def test_a_side_request_on_the_same_key_waits_for_the_turn_in_flight(lm):
    engine = Dripping(TEXT, lm.encode, gap=0.1)  # ~0.6 s a turn
    gw = _gateway(lm, engine, busy_wait=10.0)
    with ServerThread(make_app(gw)) as srv:
        client = anthropic.Anthropic(base_url=srv.base_url, api_key="cc", max_retries=0)
        main = threading.Thread(target=lambda: client.messages.create(
            model="m", max_tokens=50, messages=[{"role": "user", "content": "the task"}]))
        main.start()
        while not (gw.sessions.get("cc") and gw.sessions["cc"].lock.locked()):
            time.sleep(0.01)
        side = client.messages.create(model="m", max_tokens=50, system="Write a title.",
                                      messages=[{"role": "user", "content": "the task"}])
        main.join()
        assert side.content[0].text == "one two three four five"
        s = gw.sessions["cc"]
        assert len(s.generations) == 2 and len(s.contexts) == 2  # the side request has a context of its own
        assert engine.done_at[0] < engine.done_at[1] and s.queued == 0 and not s.lock.locked()


def test_past_the_wait_a_busy_session_is_a_409_with_retry_after(lm):
    engine = Dripping(TEXT, lm.encode, gap=0.3)  # ~2 s a turn
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}]}
    headers = {"authorization": "Bearer busy"}
    for wait in (0.0, 0.3):
        gw = _gateway(lm, engine, busy_wait=wait)
        with ServerThread(make_app(gw)) as srv:
            main = threading.Thread(target=httpx.post, args=(srv.base_url + "/v1/chat/completions",),
                                    kwargs={"json": body, "headers": headers, "timeout": 30})
            main.start()
            while not (gw.sessions.get("busy") and gw.sessions["busy"].lock.locked()):
                time.sleep(0.01)
            t0 = time.monotonic()
            r = httpx.post(srv.base_url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
            waited, running = time.monotonic() - t0, main.is_alive()
            main.join()
            assert r.status_code == 409 and r.headers["retry-after"] == "1", r.text
            assert "one request at a time" in r.json()["error"]["message"]
            assert running and waited >= wait, (wait, waited)  # refused within the turn, after the wait
            assert len(gw.sessions["busy"].generations) == 1 and gw.sessions["busy"].queued == 0


def test_stream_null_is_the_default(lm):
    gw = _gateway(lm, Dripping(TEXT, lm.encode, gap=0.0))
    with ServerThread(make_app(gw)) as srv:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="nul", max_retries=0)
        chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}], stream=None)
        resp = client.responses.create(model="m", input="q", stream=None)
        assert chat.choices[0].message.content == resp.output_text == "one two three four five"
        r = httpx.post(srv.base_url + "/v1/chat/completions", headers={"authorization": "Bearer nul"},
                       json={"messages": [{"role": "user", "content": "q"}], "stream": "yes"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "stream"


def test_an_ended_session_tells_the_sdks_not_to_retry(lm):
    engine = Dripping("x " * 40 + FMT.turn_end, lm.encode, gap=0.0)
    gw = _gateway(lm, engine)
    gw.open("short", key="short", budgets=Budgets(200, 40))  # the first turn fills the trajectory budget
    with ServerThread(make_app(gw)) as srv:
        body = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "q"}]}
        headers = {"x-api-key": "short", "anthropic-version": "2023-06-01"}
        first = httpx.post(srv.base_url + "/v1/messages", json=body, headers=headers)
        assert first.status_code == 200 and first.json()["stop_reason"] == "max_tokens"
        seen = []
        hooks = anthropic.DefaultHttpxClient(event_hooks={"request": [lambda req: seen.append(req.url.path)]})
        client = anthropic.Anthropic(base_url=srv.base_url, api_key="short", max_retries=3, http_client=hooks)
        try:
            client.messages.create(**body)
            raise AssertionError("an ended session took a turn")
        except anthropic.ConflictError as e:
            assert e.response.headers["x-should-retry"] == "false" and "has ended" in e.message
        assert seen == ["/v1/messages"]  # asked once, not retried three times


def test_unknown_paths_and_methods_answer_in_the_clients_protocol(lm):
    with ServerThread(make_app(_gateway(lm, Dripping(TEXT, lm.encode, gap=0.0)))) as srv:
        r = httpx.post(srv.base_url + "/v1/messages/batches", json={}, headers={"anthropic-version": "2023-06-01"})
        assert r.status_code == 404 and r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "not_found_error" and "/v1/messages/count_tokens" in r.text
        r = httpx.get(srv.base_url + "/v1/embeddings")
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        r = httpx.get(srv.base_url + "/v1/chat/completions")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert r.json()["error"]["type"] == "invalid_request_error"
