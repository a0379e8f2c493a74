"""Token streaming, stop sequences, protocol-native errors, tool-schema branches and safe serving,
each over real HTTP on loopback with the official openai and anthropic SDKs.

A dripping engine samples its scripted tokens one by one on its own thread, with a pause
between them, and hands each to the gateway's watch as it goes: the test can then see the first
SSE delta arrive while the turn is still being sampled. The embedded model behind the torch
engine checks that a streamed and a plain turn with the same seed record the same tokens.
"""

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import openai
import pytest

from rlonce.engine.base import Generation, SamplingParams
from rlonce.engine.torch_engine import TorchEngine
from rlonce.envs.workspace import BASH_TOOL, SUBMIT_TOOL
from rlonce.gateway.core import Gateway
from rlonce.gateway.http import ServerThread, make_app
from rlonce.gateway.messages import ProtocolError
from rlonce.gateway.session import Budgets, GatewaySettings
from rlonce.model.chat import get_format

FMT = get_format("hermes")
TOOLS = [BASH_TOOL, SUBMIT_TOOL]


class Dripping:
    """Samples a scripted turn token by token on a thread, ``gap`` seconds apart, calling the
    watch with each (and stopping where it says), like the torch engine does."""

    def __init__(self, text: str, encode, gap: float = 0.05):
        self.ids, self.gap, self.version = encode(text), gap, 0
        self.done_at: list[float] = []

    async def generate(self, prompt_ids, sampling, watch=None):
        def run():
            out = []
            for t in self.ids[:sampling.max_tokens]:
                time.sleep(self.gap)
                out.append(t)
                if watch is not None and watch(t) and t != self.ids[-1]:
                    return out, "stop_sequence"
            return out, "stop" if len(out) == len(self.ids) else "length"

        ids, reason = await asyncio.to_thread(run)
        self.done_at.append(time.monotonic())
        return Generation(ids, [0.0] * len(ids), [0] * len(ids), reason)


def _gateway(lm, engine, **kw):
    return Gateway(GatewaySettings(engine=engine, encode=lm.encode, decode=lm.decode, fmt=FMT,
                                   sampling=SamplingParams(max_tokens=200), budgets=Budgets(200, 1024), auto_open=True,
                                   honor_client_sampling=True, offload=ThreadPoolExecutor(2), **kw))


def test_deltas_arrive_while_the_turn_is_sampled(lm):
    text = "The answer is forty two, and here is why it holds." + FMT.turn_end
    engine = Dripping(text, lm.encode, gap=0.03)
    with ServerThread(make_app(_gateway(lm, engine))) as srv:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="drip", max_retries=0)
        t0, first, pieces = time.monotonic(), None, []
        for chunk in client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}],
                                                    stream=True):
            delta = chunk.choices[0].delta.content if chunk.choices else None
            if delta:
                first = first or time.monotonic()
                pieces.append(delta)
        n = len(engine.ids)
        assert "".join(pieces) == text.removesuffix(FMT.turn_end)
        assert len(pieces) > n // 2  # token by token, not one block at the end
        # the first delta came while most of the turn was still to be sampled
        assert engine.done_at[-1] - first > 0.5 * n * 0.03, (first - t0, engine.done_at[-1] - t0)


@pytest.mark.parametrize("protocol", ["chat", "anthropic", "responses"])
def test_streamed_and_plain_turns_record_the_same_tokens(lm, protocol):
    engine = TorchEngine(lm.model, eos_token_ids=lm.eos_token_ids, pad_token_id=0, seed=1)
    gw = _gateway(lm, engine)
    try:
        with ServerThread(make_app(gw, admin_key="adm")) as srv:
            texts = {}
            for key, stream in (("plain-" + protocol, False), ("stream-" + protocol, True)):
                gw.open(key, key=key, seed=11)
                texts[key] = _ask(srv.base_url, key, protocol, stream)
            a, b = (gw.sessions[k] for k in texts)
            seg = [[(s.role, s.token_ids) for s in x.contexts[0].segments] for x in (a, b)]
            assert seg[0] == seg[1] and len(seg[0][-1][1]) > 0
            # the second turn reuses the first's cached prompt: the same numbers, to the last bits or so
            lps = [[lp for s in x.contexts[0].segments for lp in s.logprobs or []] for x in (a, b)]
            assert lps[0] == pytest.approx(lps[1], abs=1e-5)
            assert texts["plain-" + protocol] == texts["stream-" + protocol]
    finally:
        engine.close()


def _ask(base: str, key: str, protocol: str, stream: bool) -> str:
    msgs = [{"role": "user", "content": "Find the file that holds the word ember."}]
    if protocol == "chat":
        c = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
        tools = [{"type": "function", "function": t} for t in TOOLS]
        if not stream:
            m = c.chat.completions.create(model="m", messages=msgs, tools=tools).choices[0].message
            return repr((m.content or "", [(t.function.name, t.function.arguments) for t in m.tool_calls or []]))
        with c.chat.completions.stream(model="m", messages=msgs, tools=tools) as s:
            m = s.get_final_completion().choices[0].message
        return repr((m.content or "", [(t.function.name, t.function.arguments) for t in m.tool_calls or []]))
    if protocol == "anthropic":
        c = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
        kw = dict(model="m", max_tokens=200, messages=msgs,
                  tools=[{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                         for t in TOOLS])
        if stream:
            with c.messages.stream(**kw) as s:
                m = s.get_final_message()
        else:
            m = c.messages.create(**kw)
        return repr([b.model_dump(exclude={"id"}) for b in m.content])
    c = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
    kw = dict(model="m", input=msgs, tools=[{"type": "function", **t} for t in TOOLS])
    if stream:
        with c.responses.stream(**kw) as s:
            r = s.get_final_response()
    else:
        r = c.responses.create(**kw)
    return repr([(o.type, getattr(o, "name", None), getattr(o, "arguments", None)) for o in r.output]
                + [r.output_text])


def test_stop_sequences_end_the_turn_and_are_cut(lm):
    text = "first line\nSTOP here and more text" + FMT.turn_end
    engine = Dripping(text, lm.encode, gap=0.0)
    gw = _gateway(lm, engine)
    with ServerThread(make_app(gw)) as srv:
        c = anthropic.Anthropic(base_url=srv.base_url, api_key="stopper", max_retries=0)
        m = c.messages.create(model="m", max_tokens=100, stop_sequences=["STOP"],
                              messages=[{"role": "user", "content": "q"}])
        assert m.stop_reason == "stop_sequence" and m.stop_sequence == "STOP"
        assert m.content[0].text == "first line"
        seg = gw.sessions["stopper"].contexts[0].segments[-1]
        assert "STOP" in lm.decode(seg.token_ids) and "more" not in lm.decode(seg.token_ids)
        with c.messages.stream(model="m", max_tokens=100, stop_sequences=["STOP"],
                               messages=[{"role": "user", "content": "q"}]) as s:
            streamed = s.get_final_message()
        assert streamed.content[0].text == "first line" and streamed.stop_reason == "stop_sequence"


def test_context_length_and_overload_errors_are_the_real_apis(lm):
    engine = Dripping("ok" + FMT.turn_end, lm.encode, gap=0.3)
    gw = _gateway(lm, engine, context_errors=True, max_inflight=1)
    long = "word " * 2000
    with ServerThread(make_app(gw)) as srv:
        oc = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="long", max_retries=0)
        with pytest.raises(openai.BadRequestError) as e:
            oc.chat.completions.create(model="m", messages=[{"role": "user", "content": long}])
        assert e.value.code == "context_length_exceeded" and "maximum context length is 1022" in e.value.message
        with pytest.raises(openai.BadRequestError) as e:
            oc.responses.create(model="m", input=long)
        assert e.value.code == "context_length_exceeded"
        ac = anthropic.Anthropic(base_url=srv.base_url, api_key="long-a", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as e:
            ac.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": long}])
        assert "prompt is too long" in str(e.value) and "> 1022 maximum" in str(e.value)
        assert "long" not in gw.sessions and "long-a" not in gw.sessions  # a refused first turn leaves no session
        # one turn in flight fills the engine: the next request is told to come back
        busy = threading.Thread(target=lambda: oc.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "q"}]))
        busy.start()
        deadline = time.monotonic() + 5
        while gw.inflight == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        r = httpx.post(srv.base_url + "/v1/messages", headers={"x-api-key": "other"},
                       json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "q"}]})
        assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
        assert r.headers["retry-after"] == "1"
        r = httpx.post(srv.base_url + "/v1/chat/completions", headers={"authorization": "Bearer other2"},
                       json={"model": "m", "messages": [{"role": "user", "content": "q"}]})
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
        busy.join()
        assert httpx.head(srv.base_url + "/").status_code == 200
        assert httpx.get(srv.base_url + "/").status_code == 200


def test_a_changed_tool_list_opens_a_new_context(lm):
    """A request with other tools never extends a context (a side request with its own tools gets a
    context of its own, counted); the same tools in another order are the same tools."""
    engine = Dripping("done" + FMT.turn_end, lm.encode, gap=0.0)
    gw = _gateway(lm, engine)
    with ServerThread(make_app(gw)) as srv:
        c = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="tools", max_retries=0)
        head = [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"}]
        one = [{"type": "function", "function": BASH_TOOL}]
        both = one + [{"type": "function", "function": SUBMIT_TOOL}]
        c.chat.completions.create(model="m", messages=head, tools=one)
        main = head + [{"role": "assistant", "content": "done"}, {"role": "user", "content": "next"}]
        c.chat.completions.create(model="m", messages=main, tools=one)  # extends: same tools
        s = gw.sessions["tools"]
        assert len(s.contexts) == 1 and s.events == []
        c.chat.completions.create(model="m", messages=head, tools=both)  # other tools: a context of its own
        assert len(s.contexts) == 2 and s.events[-1]["kind"] == "branch" and s.events[-1]["tools_changed"]
        assert '"name": "submit"' in lm.decode(s.contexts[1].segments[0].token_ids)
        assert '"name": "submit"' not in lm.decode(s.contexts[0].segments[0].token_ids)
        main += [{"role": "assistant", "content": "done"}, {"role": "user", "content": "more"}]
        c.chat.completions.create(model="m", messages=main, tools=one)  # the main conversation still extends
        side = head + [{"role": "assistant", "content": "done"}, {"role": "user", "content": "and?"}]
        c.chat.completions.create(model="m", messages=side, tools=both[::-1])  # the side one, tools reordered
        assert len(s.contexts) == 2 and len(s.events) == 1
        assert [len(x.segments) for x in s.contexts] == [6, 4]
    from rlonce.gateway.session import session_metrics

    assert session_metrics(s)["tool_schema_branches"] == 1.0


def test_requests_without_a_system_message_still_show_the_model_its_tools(lm):
    engine = Dripping("x" + FMT.turn_end, lm.encode, gap=0.0)
    gw = _gateway(lm, engine)
    with ServerThread(make_app(gw)) as srv:
        c = anthropic.Anthropic(base_url=srv.base_url, api_key="nosys", max_retries=0)
        c.messages.create(model="m", max_tokens=20, messages=[{"role": "user", "content": "q"}],
                          tools=[{"name": "bash", "description": "run", "input_schema": BASH_TOOL["parameters"]}])
    prompt = lm.decode(gw.sessions["nosys"].contexts[0].segments[0].token_ids)
    assert prompt.startswith("<|im_start|>system\n# Tools") and '"name": "bash"' in prompt


THOUGHT = "<think>\nThe word is in a file; list them first.\n</think>\n\nLooking."


def test_reasoning_is_split_from_content_in_every_protocol(lm):
    engine = Dripping(THOUGHT + FMT.turn_end, lm.encode, gap=0.0)
    gw = _gateway(lm, engine)
    want = "The word is in a file; list them first."
    with ServerThread(make_app(gw)) as srv:
        ac = anthropic.Anthropic(base_url=srv.base_url, api_key="r-a", max_retries=0)
        kw = dict(model="m", max_tokens=100, messages=[{"role": "user", "content": "q"}])
        for m in (ac.messages.create(**kw), ac.messages.stream(**kw).__enter__().get_final_message()):
            assert [b.type for b in m.content] == ["thinking", "text"]
            assert m.content[0].thinking == want and m.content[1].text == "Looking."
        oc = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="r-o", max_retries=0)
        reply = oc.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
        msg = reply.choices[0].message
        assert msg.content == "Looking." and msg.model_extra["reasoning_content"] == want
        # the reasoning's tokens, its markup included: what the text up to </think> encodes to
        thinking = len(lm.encode(THOUGHT[: THOUGHT.index("</think>") + len("</think>")]))
        assert reply.usage.completion_tokens_details.reasoning_tokens == thinking < reply.usage.completion_tokens
        streamed = [c.choices[0].delta for c in oc.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "q"}], stream=True) if c.choices]
        assert "".join(d.content or "" for d in streamed) == "Looking."
        thoughts = [d.model_extra.get("reasoning_content") for d in streamed if d.model_extra.get("reasoning_content")]
        assert "".join(thoughts) == want and len(thoughts) > 5  # the reasoning streams too, token by token
        first_content = next(i for i, d in enumerate(streamed) if d.content)
        assert all(not d.model_extra.get("reasoning_content") for d in streamed[first_content:])
        for r in (oc.responses.create(model="m", input="q"),
                  oc.responses.stream(model="m", input="q").__enter__().get_final_response()):
            assert [o.type for o in r.output] == ["reasoning", "message"] and r.output_text == "Looking."
            assert r.output[0].content[0].text == want and r.usage.output_tokens_details.reasoning_tokens == thinking
    seg = gw.sessions["r-a"].contexts[0].segments[-1]
    assert lm.decode(seg.token_ids).startswith("<think>")  # the tokens are recorded as sampled


def test_a_client_that_drops_reasoning_branches(lm):
    engine = Dripping(THOUGHT + FMT.turn_end, lm.encode, gap=0.0)
    gw = _gateway(lm, engine)
    with ServerThread(make_app(gw)) as srv:
        ac = anthropic.Anthropic(base_url=srv.base_url, api_key="drop", max_retries=0)
        msgs = [{"role": "user", "content": "q"}]
        m = ac.messages.create(model="m", max_tokens=100, messages=msgs)
        kept = msgs + [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
                       {"role": "user", "content": "go on"}]
        ac.messages.create(model="m", max_tokens=100, messages=kept)  # echoes the thinking block: extends
        s = gw.sessions["drop"]
        assert len(s.contexts) == 1 and s.events == []
        dropped = msgs + [{"role": "assistant", "content": [m.content[1].model_dump()]},
                          {"role": "user", "content": "go on"}]
        ac.messages.create(model="m", max_tokens=100, messages=dropped)
        assert len(s.contexts) == 2 and s.events[-1]["kind"] == "branch" and s.events[-1]["reasoning_rewritten"]
    from rlonce.gateway.session import session_metrics

    assert session_metrics(s)["reasoning_branches"] == 1.0 and session_metrics(s)["rollbacks"] == 0.0


@pytest.mark.parametrize("protocol", ["chat", "anthropic", "responses"])
def test_smollm2_tool_calls_come_back_in_each_protocols_shape(lm, protocol):
    """The smollm2 format's calls (all of a turn's calls in one JSON list) parse into each protocol's
    tool calls, plain and streamed."""
    from rlonce.model.chat import ToolCall

    smol = get_format("smollm2")
    text = smol.assistant_text("", [ToolCall("bash", {"command": "ls"}), ToolCall("submit", {"answer": "a.txt"})])
    gw = Gateway(GatewaySettings(engine=Dripping(text, lm.encode, gap=0.0), encode=lm.encode, decode=lm.decode,
                                 fmt=smol, sampling=SamplingParams(max_tokens=200), budgets=Budgets(200, 1024),
                                 auto_open=True, offload=ThreadPoolExecutor(2)))
    want = [("bash", {"command": "ls"}), ("submit", {"answer": "a.txt"})]
    with ServerThread(make_app(gw)) as srv:
        for stream in (False, True):
            key = f"{protocol}-{stream}"
            if protocol == "chat":
                c = openai.OpenAI(base_url=srv.base_url + "/v1", api_key=key, max_retries=0)
                kw = dict(model="m", messages=[{"role": "user", "content": "q"}],
                          tools=[{"type": "function", "function": t} for t in TOOLS])
                if stream:
                    with c.chat.completions.stream(**kw) as s:
                        m = s.get_final_completion().choices[0].message
                else:
                    m = c.chat.completions.create(**kw).choices[0].message
                got = [(t.function.name, json.loads(t.function.arguments)) for t in m.tool_calls]
            elif protocol == "anthropic":
                c = anthropic.Anthropic(base_url=srv.base_url, api_key=key, max_retries=0)
                kw = dict(model="m", max_tokens=200, messages=[{"role": "user", "content": "q"}],
                          tools=[{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                                 for t in TOOLS])
                m = c.messages.stream(**kw).__enter__().get_final_message() if stream else c.messages.create(**kw)
                got = [(b.name, b.input) for b in m.content if b.type == "tool_use"]
            else:
                c = openai.OpenAI(base_url=srv.base_url + "/v1", api_key=key, max_retries=0)
                kw = dict(model="m", input="q", tools=[{"type": "function", **t} for t in TOOLS])
                r = c.responses.stream(**kw).__enter__().get_final_response() if stream else c.responses.create(**kw)
                got = [(o.name, json.loads(o.arguments)) for o in r.output if o.type == "function_call"]
            assert got == want


def test_a_stream_nobody_reads_still_frees_its_session(lm):
    """The turn owns the session: an iterator dropped unread (a server that lost the client before
    the first event) or a caller cancelled while waiting for the first token never leaves it locked,
    and never lets a second request in while the turn runs."""
    engine = Dripping("one two three four" + FMT.turn_end, lm.encode, gap=0.02)
    gw = _gateway(lm, engine)
    body = {"messages": [{"role": "user", "content": "q"}], "stream": True}

    async def scenario():
        it = await gw.call("openai-chat", body, "dropped")
        del it  # never iterated
        with pytest.raises(ProtocolError) as busy:
            await gw.call("openai-chat", body, "dropped")  # the turn is still running
        assert busy.value.status == 409
        while gw.sessions["dropped"].lock.locked():
            await asyncio.sleep(0.01)
        assert gw.inflight == 0 and len(gw.sessions["dropped"].generations) == 1
        with pytest.raises(asyncio.TimeoutError):  # gives up before the first token
            await asyncio.wait_for(gw.call("openai-chat", body, "cancelled"), 0.005)
        assert gw.sessions["cancelled"].lock.locked() and gw.inflight == 1  # the turn goes on, still holding it
        while gw.sessions["cancelled"].lock.locked():
            await asyncio.sleep(0.01)
        assert gw.inflight == 0 and len(gw.sessions["cancelled"].generations) == 1
        it = await gw.call("openai-chat", body, "cancelled")  # free again
        assert "".join([e async for e in it]).endswith("data: [DONE]\n\n")

    asyncio.run(scenario())


def test_concurrent_streams_respect_the_inflight_cap_and_refusals_open_no_session(lm):
    engine = Dripping("slow answer" + FMT.turn_end, lm.encode, gap=0.02)
    gw = _gateway(lm, engine, max_inflight=2)
    body = {"messages": [{"role": "user", "content": "q"}], "stream": True}

    async def one(i):
        try:
            it = await gw.call("openai-chat", body, None, key=f"k{i}")
        except Exception as e:  # noqa: BLE001 - counted below
            return getattr(e, "status", repr(e))
        return "done" if "".join([e async for e in it]).endswith("data: [DONE]\n\n") else "cut"

    async def scenario():
        return await asyncio.gather(*(one(i) for i in range(8)))

    results = asyncio.run(scenario())
    assert results.count("done") == 2 and results.count(429) == 6, results
    assert sorted(gw.sessions) == sorted(f"k{i}" for i, r in enumerate(results) if r != 429)  # refused: no session
    with pytest.raises(ProtocolError):
        asyncio.run(gw.call("openai-chat", {"messages": "not a list"}, None, key="bad-body"))
    assert "bad-body" not in gw.sessions
