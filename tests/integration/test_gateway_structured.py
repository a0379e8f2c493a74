"""Structured output end to end: the embedded model served as ``rlonce serve`` serves it (the torch
engine with its tokenizer, real HTTP on loopback), asked through the official openai and
anthropic SDKs for JSON under a schema and for forced tool calls; every reply is checked against
its schema with ``jsonschema``. A paused turn resumes under its grammar, and a training gateway
refuses a constraint with one line.
"""

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import jsonschema
import openai
import pytest

from rlonce.engine.base import SamplingParams
from rlonce.engine.torch_engine import TorchEngine
from rlonce.gateway.core import Gateway
from rlonce.gateway.http import ServerThread, make_app
from rlonce.gateway.protocols import PROTOCOLS
from rlonce.gateway.session import Budgets, GatewaySettings
from rlonce.gateway.structured import accept
from rlonce.model.chat import get_format

N = 10
VERDICT = {"type": "object", "additionalProperties": False, "required": ["verdict", "score", "reason"],
           "properties": {"verdict": {"enum": ["pass", "fail"]}, "score": {"type": "integer", "minimum": 0,
                                                                           "maximum": 10},
                          "reason": {"type": "string", "maxLength": 30}}}
BASH = {"type": "object", "properties": {"command": {"type": "string", "maxLength": 40}}, "required": ["command"],
        "additionalProperties": False}
READ = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 30},
                                         "line": {"type": "integer", "minimum": 1, "maximum": 999}},
        "required": ["path", "line"], "additionalProperties": False}
SCHEMAS = {"bash": BASH, "read": READ}
CHAT_TOOLS = [{"type": "function", "function": {"name": n, "description": f"the {n} tool", "parameters": s}}
              for n, s in SCHEMAS.items()]
ANT_TOOLS = [{"name": n, "description": f"the {n} tool", "input_schema": s} for n, s in SCHEMAS.items()]
ASK = [{"role": "user", "content": "Check the build and report."}]


@pytest.fixture(scope="module")
def served(lm):
    pad = lm.tokenizer.pad_token_id
    engine = TorchEngine(lm.model, eos_token_ids=lm.eos_token_ids, pad_token_id=pad if pad is not None else 0,
                         tokenizer=lm.tokenizer, prefix_cache_mb=0)
    gw = Gateway(GatewaySettings.serving(engine=engine, encode=lm.encode, decode=lm.decode,
                                         fmt=get_format(lm.chat_format), model_name="embedded", max_tokens=160,
                                         max_context=2048, offload=ThreadPoolExecutor(2), tokenizer=lm.tokenizer))
    with ServerThread(make_app(gw)) as srv:
        yield srv.base_url, gw, engine
    engine.close()


def _openai(url: str) -> openai.OpenAI:
    """A fresh client (a pooled connection the server closed while idle would reset); each request
    names its session by its key."""
    return openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)


def _anthropic(url: str, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)  # a key is a session


def _each(fn):
    """``fn(i)`` for i < N, in parallel (the engine batches them)."""
    with ThreadPoolExecutor(N) as pool:
        return list(pool.map(fn, range(N)))


def test_json_schema_replies_are_valid_on_every_protocol(served):
    url, _, _ = served
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT, "strict": True}}
    chats = _each(lambda i: _openai(url).chat.completions.create(model="embedded", messages=ASK, response_format=fmt,
                                                       seed=i, extra_headers={"authorization": f"Bearer c{i}"}))
    for c in chats:
        jsonschema.validate(json.loads(c.choices[0].message.content), VERDICT)
        assert c.choices[0].finish_reason == "stop"
    responses = _each(lambda i: _openai(url).responses.create(
        model="embedded", input="Check the build.", extra_headers={"authorization": f"Bearer r{i}"},
        text={"format": {"type": "json_schema", "name": "verdict", "schema": VERDICT, "strict": True}}))
    for r in responses:
        jsonschema.validate(json.loads(r.output_text), VERDICT)
        assert r.status == "completed"
    messages = _each(lambda i: _anthropic(url, f"a{i}").messages.create(
        model="embedded", max_tokens=160, messages=ASK,
        output_config={"format": {"type": "json_schema", "schema": VERDICT}}))
    for m in messages:
        jsonschema.validate(json.loads(m.content[0].text), VERDICT)
    objects = _each(lambda i: _openai(url).chat.completions.create(model="embedded", messages=ASK, seed=i,
                                                         response_format={"type": "json_object"},
                                                         extra_headers={"authorization": f"Bearer o{i}"}))
    for c in objects:  # any object: nothing bounds it, so one the token cap cut is still an object's start
        text = c.choices[0].message.content
        assert text.startswith("{") and (c.choices[0].finish_reason == "length" or isinstance(json.loads(text), dict))


def test_forced_tool_calls_are_one_valid_call_in_each_protocol_shape(served):
    url, _, _ = served
    required = _each(lambda i: _openai(url).chat.completions.create(
        model="embedded", messages=ASK, tools=CHAT_TOOLS, tool_choice="required", seed=i,
        extra_headers={"authorization": f"Bearer q{i}"}))
    for c in required:
        (call,) = c.choices[0].message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        assert c.choices[0].finish_reason == "tool_calls"
    named = _each(lambda i: _openai(url).chat.completions.create(
        model="embedded", messages=ASK, tools=CHAT_TOOLS, seed=i, extra_headers={"authorization": f"Bearer n{i}"},
        tool_choice={"type": "function", "function": {"name": "read"}}))
    for c in named:
        (call,) = c.choices[0].message.tool_calls
        assert call.function.name == "read" and c.choices[0].finish_reason == "stop"  # as OpenAI answers a named call
        jsonschema.validate(json.loads(call.function.arguments), READ)
    resp = _each(lambda i: _openai(url).responses.create(
        model="embedded", input="Check the build.", extra_headers={"authorization": f"Bearer p{i}"},
        tools=[{"type": "function", "name": n, "parameters": s, "strict": True} for n, s in SCHEMAS.items()],
        tool_choice={"type": "function", "name": "bash"}))
    for r in resp:
        (item,) = r.output
        assert item.type == "function_call" and item.name == "bash"
        jsonschema.validate(json.loads(item.arguments), BASH)
    for choice in ({"type": "any"}, {"type": "tool", "name": "bash"}):
        msgs = _each(lambda i, choice=choice: _anthropic(url, f"{choice['type']}{i}").messages.create(
            model="embedded", max_tokens=160, messages=ASK, tools=ANT_TOOLS, tool_choice=choice))
        for m in msgs:
            (block,) = m.content
            assert block.type == "tool_use" and m.stop_reason == "tool_use"
            assert choice["type"] == "any" or block.name == "bash"
            jsonschema.validate(block.input, SCHEMAS[block.name])


def test_tool_choice_none_returns_no_call(served):
    url, _, _ = served
    for i in range(3):
        c = _openai(url).chat.completions.create(model="embedded", messages=ASK, tools=CHAT_TOOLS, tool_choice="none",
                                                 seed=i, max_tokens=40, extra_headers={"authorization": f"Bearer x{i}"})
        assert not c.choices[0].message.tool_calls and "<tool_call>" not in (c.choices[0].message.content or "")


def test_an_unenforceable_schema_is_a_protocol_native_400(served):
    url, _, _ = served
    odd = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(openai.BadRequestError) as e:
        _openai(url).chat.completions.create(model="embedded", messages=ASK, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": odd, "strict": True}})
    err = e.value.body
    assert err["type"] == "invalid_request_error" and err["param"] == "response_format.json_schema.schema"
    assert "uniqueItems" in err["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        _anthropic(url, "odd").messages.create(model="embedded", max_tokens=20, messages=ASK, tools=ANT_TOOLS,
                            tool_choice={"type": "tool", "name": "rm"})
    assert e.value.body["error"]["type"] == "invalid_request_error" and "'rm'" in e.value.body["error"]["message"]


def test_a_paused_turn_resumes_under_its_grammar(served):
    _, gw, engine = served
    long = {"type": "object", "properties": {"command": {"type": "string", "minLength": 120, "maxLength": 160}},
            "required": ["command"], "additionalProperties": False}
    body = {"messages": ASK, "tools": [{"type": "function", "function": {"name": "bash", "parameters": long}}],
            "tool_choice": "required", "max_tokens": 400}
    session = gw.open("paused", key="paused")

    async def go():
        req = accept(PROTOCOLS["openai-chat"].parse(body), gw.settings)
        seen = []

        def on_token(t):
            seen.append(t)
            if len(seen) == 8:  # well inside the call: pause for a "weight update", resume shortly after
                engine.pause()
                asyncio.get_running_loop().call_later(0.2, engine.resume)

        return await session.turn(req, on_token)

    turn = asyncio.run(go())
    assert session.interrupts >= 1
    (call,) = turn.calls
    jsonschema.validate(call.arguments, long)


def test_a_training_gateway_refuses_a_constraint_in_one_line(lm):
    engine = TorchEngine(lm.model, eos_token_ids=lm.eos_token_ids, pad_token_id=0, tokenizer=lm.tokenizer)
    gw = Gateway(GatewaySettings(engine=engine, encode=lm.encode, decode=lm.decode, fmt=get_format(lm.chat_format),
                                 sampling=SamplingParams(max_tokens=20), budgets=Budgets(20, 1024), auto_open=True,
                                 offload=ThreadPoolExecutor(1)))
    try:
        with ServerThread(make_app(gw)) as srv:
            r = httpx.post(srv.base_url + "/v1/chat/completions", headers={"authorization": "Bearer t"},
                           json={"messages": ASK, "response_format": {"type": "json_object"}})
            assert r.status_code == 400 and "\n" not in r.json()["error"]["message"]
            assert "log-probs" in r.json()["error"]["message"] and "rlonce serve" in r.json()["error"]["message"]
            assert "t" not in gw.sessions  # refused before any session opened
            ok = httpx.post(srv.base_url + "/v1/chat/completions", headers={"authorization": "Bearer t"},
                            json={"messages": ASK, "tools": CHAT_TOOLS, "tool_choice": "auto"})
            assert ok.status_code == 200
    finally:
        engine.close()
