"""Protocol adapters without a server: requests to messages, turns to replies and SSE events."""

import json

import pytest

from rlonce.gateway.messages import CallOut, Message, ProtocolError, Turn
from rlonce.gateway.protocols import PROTOCOLS
from rlonce.model.chat import ToolCall

CHAT, ANTH, RESP = (PROTOCOLS[k] for k in ("openai-chat", "anthropic-messages", "openai-responses"))
TURN = Turn("hi", [CallOut("call_0_0", "bash", {"command": "ls"})], "tool_calls", 10, 5, "s", 0)


def _events(lines):
    return [json.loads(x.split("data: ", 1)[1]) for x in lines if "data: {" in x]


def test_the_three_shapes_of_one_dialogue_are_the_same_messages():
    want = [Message("system", "sys"), Message("user", "q"), Message("assistant", "hm", (ToolCall("bash", {"a": 1}),)),
            Message("tool", "out", tool_call_id="c1"), Message("user", "more")]
    chat = CHAT.parse({"messages": [
        {"role": "developer", "content": "sys"}, {"role": "user", "content": [{"type": "text", "text": "q"}]},
        {"role": "assistant", "content": "hm", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "bash", "arguments": '{"a":1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "out"}, {"role": "user", "content": "more"}],
        "unused_field": {"x": 1}})
    anth = ANTH.parse({"system": [{"type": "text", "text": "sys"}], "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "..."}, {"type": "text", "text": "hm"},
                                          {"type": "tool_use", "id": "c1", "name": "bash", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": [
            {"type": "text", "text": "out"}]}, {"type": "text", "text": "more"}]}]})
    resp = RESP.parse({"instructions": "sys", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hm"}]},
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": '{"a": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "out"}, {"role": "user", "content": "more"}]})
    for req in (chat, anth, resp):
        assert [(m.role, m.content, m.tool_calls, m.tool_call_id) for m in req.messages] == [
            (m.role, m.content, m.tool_calls, m.tool_call_id) for m in want]


def test_previous_response_id_continues_and_keeps_the_system_prompt():
    history = {"resp_1": [Message("system", "sys"), Message("user", "q"), Message("assistant", "a")]}
    req = RESP.parse({"previous_response_id": "resp_1", "input": "next"}, history)
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "user"]
    req = RESP.parse({"previous_response_id": "resp_1", "instructions": "new", "input": "next"}, history)
    assert req.messages[0] == Message("system", "new") and [m.role for m in req.messages].count("system") == 1
    with pytest.raises(ProtocolError) as e:
        RESP.parse({"previous_response_id": "resp_2", "input": "x"}, history)
    assert e.value.status == 404


def test_chat_stream_reassembles_to_the_reply():
    ev = _events(CHAT.streamer(CHAT.parse({"messages": [{"role": "user", "content": "q"}], "model": "m"}),
                               {"stream_options": {"include_usage": True}}, {}).whole(TURN))
    assert all(e["object"] == "chat.completion.chunk" for e in ev)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in ev if e["choices"])
    args = "".join(tc["function"].get("arguments", "") for e in ev if e["choices"]
                   for tc in e["choices"][0]["delta"].get("tool_calls", []))
    assert text == "hi" and json.loads(args) == {"command": "ls"}
    assert ev[-2]["choices"][0]["finish_reason"] == "tool_calls" and ev[-1]["usage"]["total_tokens"] == 15


def test_anthropic_and_responses_streams_follow_the_sdk_sequences():
    req = ANTH.parse({"messages": [{"role": "user", "content": "q"}]})
    kinds = [e["type"] for e in _events(ANTH.streamer(req, {}, {}).whole(TURN))]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 2
    history: dict = {}
    ev = _events(RESP.streamer(RESP.parse({"input": "q"}), {}, history).whole(TURN))
    assert [e["sequence_number"] for e in ev] == list(range(len(ev)))
    assert ev[0]["type"] == "response.created" and ev[-1]["type"] == "response.completed"
    assert {e["response"]["id"] for e in ev if "response" in e} == set(history)  # stored for previous_response_id
    assert ev[-1]["response"]["output"][1]["call_id"] == "call_0_0"


def test_error_shapes():
    e = ProtocolError("bad", param="messages")
    assert CHAT.error(e) == {"error": {"message": "bad", "type": "invalid_request_error", "param": "messages",
                                       "code": None}}
    assert ANTH.error(ProtocolError("gone", status=404)) == {"type": "error", "error": {
        "type": "not_found_error", "message": "gone"}}
    for bad in ({"messages": [{"role": "user", "content": 3}]}, {"messages": [{"role": "tool"}], "max_tokens": True},
                {"messages": [], "stream": "yes"}):
        with pytest.raises(ProtocolError):
            CHAT.parse(bad)


def test_text_stream_shows_only_what_the_final_content_will_hold():
    """Deltas are a prefix of the final content: tool-call markup, the turn end, a stop sequence and a
    marker's first characters are held back; an incomplete UTF-8 character waits for its last byte;
    a turn that opens with reasoning streams it as reasoning, then its content."""
    from rlonce.gateway.streams import TextStream

    def content(pieces):
        return [p for out in pieces for kind, p in out if kind == "content"]

    pieces = ["  Let", " me", " look", ".", " <", "tool", "_call", ">{}", "</tool_call>", "<|im_end|>"]
    ts = TextStream(lambda ids: "".join(pieces[i] for i in ids), ("<tool_call>", "<|im_end|>"))
    shown = [ts.push(i) for i in range(len(pieces))]
    assert content(shown) == ["Let", " me", " look", "."] and all(not s for s in shown[4:])
    raw = "é!".encode()
    ts = TextStream(lambda ids: bytes(raw[i] for i in ids).decode(errors="replace"), ())
    assert [ts.push(i) for i in range(len(raw))] == [[], [("content", "é")], [("content", "!")]]
    ts = TextStream(lambda ids: "".join("ab\nEND more"[i] for i in ids), ("END",))
    assert "".join(content([ts.push(i) for i in range(11)])) == "ab"
    pieces = ["<th", "ink>", "\nfirst", " find", "\n</thi", "nk>", "\n\nHere", " it", " is", "<tool_call>", "{}"]
    ts = TextStream(lambda ids: "".join(pieces[i] for i in ids), ("<tool_call>", "<|im_end|>", "<think>"),
                    ("<think>", "</think>"))
    out = [x for i in range(len(pieces)) for x in ts.push(i)]
    assert out == [("reasoning", "first"), ("reasoning", " find"), ("content", "Here"), ("content", " it"),
                   ("content", " is")]


def test_text_stream_costs_linear_time():
    """Each token decodes a short window, not the whole turn: 20,000 tokens stream in well under a second
    of decoding calls (counted, not timed: the window stays a few tokens long)."""
    from rlonce.gateway.streams import TextStream

    seen = []

    def decode(ids):
        seen.append(len(ids))
        return "".join(f"w{i % 10} " for i in ids)

    ts = TextStream(decode, ("<tool_call>",))
    for i in range(20_000):
        ts.push(i)
    assert max(seen) <= 3 and ts.sent["content"].startswith("w0 w1 w2")


def test_protocol_native_context_and_overload_errors():
    from rlonce.gateway.messages import ContextLengthExceeded, Overloaded

    e = ContextLengthExceeded(30000, 1022)
    assert ANTH.error(e) == {"type": "error", "error": {"type": "invalid_request_error",
                                                        "message": "prompt is too long: 30000 tokens > 1022 maximum"}}
    chat = CHAT.error(e)["error"]
    assert chat["code"] == "context_length_exceeded" and chat["type"] == "invalid_request_error"
    assert "maximum context length is 1022 tokens" in chat["message"] and "30000 tokens" in chat["message"]
    assert RESP.error(e)["error"]["code"] == "context_length_exceeded" and RESP.error(e)["error"]["param"] == "input"
    o = Overloaded(64)
    assert o.status == 429 and o.retry_after == 1.0 and CHAT.error(o)["error"]["code"] == "rate_limit_exceeded"


def test_what_agent_clients_send_is_accepted():
    """System entries inside Anthropic messages and Responses input stay system turns where they stand;
    stop sequences, top_k and legacy function messages are read; unknown fields are ignored."""
    anth = ANTH.parse({"system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
                       "thinking": {"type": "adaptive"}, "context_management": {"edits": []},
                       "output_config": {"effort": "low"}, "metadata": {"user_id": "u"}, "top_k": 5,
                       "stop_sequences": ["END"], "messages": [
                           {"role": "user", "content": [{"type": "text", "text": "q", "cache_control": {
                               "type": "ephemeral"}}]},
                           {"role": "system", "content": "<system-reminder>be brief</system-reminder>"},
                           {"role": "user", "content": "go"}]})
    assert [m.role for m in anth.messages] == ["system", "user", "system", "user"]
    assert anth.stop == ("END",) and anth.top_k == 5
    chat = CHAT.parse({"messages": [{"role": "user", "content": "q"},
                                    {"role": "assistant", "content": None,
                                     "function_call": {"name": "f", "arguments": "{}"}},
                                    {"role": "function", "name": "f", "content": "out"}], "stop": "x"})
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool"] and chat.stop == ("x",)
    resp = RESP.parse({"instructions": "sys", "input": [{"role": "user", "content": "q"},
                                                        {"role": "developer", "content": "mid"}]})
    assert [(m.role, m.content) for m in resp.messages] == [("system", "sys"), ("user", "q"), ("system", "mid")]
    with pytest.raises(ProtocolError):
        CHAT.parse({"messages": [{"role": "user", "content": "q"}], "stop": [""]})
