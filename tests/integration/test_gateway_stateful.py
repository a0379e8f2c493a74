"""Request fields that change what the conversation is, honoured or refused — never ignored.

Real HTTP on loopback, the official SDKs, and the scripted tool-calling model of ``tests/conftest.py``
(``ToolCaller``) behind a gateway with ``rlonce serve``'s settings: its first turn calls a tool the
request offers, its next turn quotes the tool's result. The anthropic SDK's tool runner, with its
defaults, asks for a server-held thread; the gateway refuses ``thread`` with the API's own
``thread_unsupported_request``, the SDK falls back to sending the whole conversation, and the second
turn's recorded prompt is checked by hand: system prompt, tool schema, question, tool result.
"""

import json

import anthropic
import httpx
import openai
import pytest
from anthropic import beta_tool

from rlonce.core.records import Role
from rlonce.gateway.session import session_metrics

SYSTEM = "You are a careful file lister. Use the tools."
QUESTION = "Which files are in /srv/box?"
LISTING = "alpha.txt beta.py gamma"
CALLS = {"list_files": {"directory": "/srv/box"}}
ANTHROPIC_VERSION = {"anthropic-version": "2023-06-01"}


@beta_tool
def list_files(directory: str) -> str:
    """List the files in a directory, space-separated."""
    assert directory == "/srv/box"
    return LISTING


def _recording_client(base_url: str, key: str):
    """An Anthropic client whose every request (path, JSON body) and response status is kept."""
    sent, statuses = [], []
    hooks = {"request": [lambda r: sent.append((r.url.path, json.loads(r.content or b"null")))],
             "response": [lambda r: statuses.append(r.status_code)]}
    client = anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0,
                                 http_client=anthropic.DefaultHttpxClient(event_hooks=hooks))
    return client, sent, statuses


def _model_turn_prompts(session):
    """Per model segment of the session's contexts: the recorded tokens before it."""
    out = []
    for ctx in session.contexts:
        ids = []
        for seg in ctx.segments:
            if seg.role is Role.MODEL:
                out.append(list(ids))
            ids += seg.token_ids
    return out


@pytest.mark.parametrize("stream", [False, True])
def test_the_anthropic_tool_runner_with_its_defaults_completes_a_round_trip_on_the_whole_conversation(
        tool_served, lm, stream):
    gw, engine, srv = tool_served(CALLS)
    client, sent, statuses = _recording_client(srv.base_url, "runner")
    runner = client.beta.messages.tool_runner(model="embedded", max_tokens=200, system=SYSTEM, tools=[list_files],
                                              messages=[{"role": "user", "content": QUESTION}], stream=stream)
    replies = [s.get_final_message() for s in runner] if stream else list(runner)

    # the model called the tool, the runner ran it and sent its result, the model answered with it
    assert [r.stop_reason for r in replies] == ["tool_use", "end_turn"]
    (call,) = [b for b in replies[0].content if b.type == "tool_use"]
    assert (call.name, call.input) == ("list_files", {"directory": "/srv/box"})
    assert replies[1].content[0].text == f"The tool answered: {LISTING}"

    # the SDK asked for a thread, was refused with the API's own code, and sent everything again
    assert statuses == [400, 200, 200]
    assert sent[0][1]["thread"] == {"type": "create"}
    assert all("thread" not in body for _, body in sent[1:])
    last = sent[2][1]
    assert last["system"] == SYSTEM and [t["name"] for t in last["tools"]] == ["list_files"]
    assert [m["role"] for m in last["messages"]] == ["user", "assistant", "user"]

    # one context, four segments: the second turn extended the first with the tool result
    s = gw.sessions["runner"]
    assert len(s.contexts) == 1 and not any(e["kind"] in ("branch", "context_lost") for e in s.events)
    assert [seg.role for seg in s.contexts[0].segments] == [Role.PROMPT, Role.MODEL, Role.OBSERVATION, Role.MODEL]
    assert session_metrics(s)["context_lost_turns"] == 0.0
    first, second = _model_turn_prompts(s)
    assert second == engine.prompts[1] and first == engine.prompts[0]  # what the model was given, token for token
    text = lm.decode(second)
    for part in (SYSTEM, '"name": "list_files"', "List the files in a directory, space-separated.", QUESTION,
                 f"<tool_response>\n{LISTING}\n</tool_response>", '"arguments": {"directory": "/srv/box"}'):
        assert part in text, (part, text)
    assert text.index(SYSTEM) < text.index(QUESTION) < text.index(LISTING)


def test_a_message_thread_gets_the_apis_own_refusal_and_runs_unthreaded_when_asked(tool_served):
    gw, _, srv = tool_served(CALLS)
    client, sent, statuses = _recording_client(srv.base_url, "threads")
    thread = client.beta.messages.thread(model="embedded", max_tokens=100, system=SYSTEM)
    with pytest.raises(anthropic.BadRequestError) as refused:
        thread.send({"role": "user", "content": QUESTION})
    assert refused.value.error_code == "thread_unsupported_request" and "threads" not in gw.sessions
    assert refused.value.body["error"]["type"] == "invalid_request_error"

    thread = client.beta.messages.thread(model="embedded", max_tokens=100, system=SYSTEM,
                                         unsupported_request_behavior="continue_unthreaded")
    first = thread.send({"role": "user", "content": QUESTION})
    second = thread.send({"role": "user", "content": "And again?"})
    assert first.content[0].text.startswith("No tool I can call is offered")  # no tools given to this thread
    assert second.content[0].text.startswith("No tool I can call is offered")
    assert statuses == [400, 400, 200, 200]
    assert [len(body["messages"]) for _, body in sent[2:]] == [1, 3]  # the whole conversation each time
    assert len(gw.sessions["threads"].contexts) == 1


def _post(base_url: str, path: str, key: str, body: dict):
    return httpx.post(base_url + path, json=body, headers={"authorization": f"Bearer {key}", **ANTHROPIC_VERSION},
                      timeout=30)


def _messages_body(**extra):
    tools = [{"name": "list_files", "description": "List files.", "input_schema": {
        "type": "object", "properties": {"directory": {"type": "string"}}}}]
    return {"model": "m", "max_tokens": 100, "system": SYSTEM, "tools": tools,
            "messages": [{"role": "user", "content": QUESTION}], **extra}


def test_a_turn_on_a_conversation_that_lost_its_history_is_a_context_lost_event(tool_served):
    """What the gateway answered before it refused ``thread``: a request holding only the tool result."""
    gw, engine, srv = tool_served(CALLS)
    first = _post(srv.base_url, "/v1/messages", "lost", _messages_body()).json()
    (call,) = [b for b in first["content"] if b["type"] == "tool_use"]
    lost = _post(srv.base_url, "/v1/messages", "lost", {"model": "m", "max_tokens": 100, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": LISTING}]}]})
    assert lost.status_code == 200  # a client may do this; the record must say so
    s = gw.sessions["lost"]
    (event,) = [e for e in s.events if e["kind"] == "context_lost"]
    assert event["lost"] == ["tools", "system", "tool_calls"] and event["from"] == "main"
    assert event["context"] == "branch-1" and event["prompt_tokens"] == len(engine.prompts[1])
    assert session_metrics(s)["context_lost_turns"] == 1.0
    # a side request after a turn with tools, with its own system prompt and none: it lacked the tools
    _post(srv.base_url, "/v1/messages", "side", _messages_body())
    _post(srv.base_url, "/v1/messages", "side", {"model": "m", "max_tokens": 20, "system": "Write a title.",
                                                 "messages": [{"role": "user", "content": QUESTION}]})
    side = gw.sessions["side"]
    assert [e["lost"] for e in side.events if e["kind"] == "context_lost"] == [["tools"]]


def test_anthropic_fields_that_would_rewrite_the_history_are_refused_unless_they_change_nothing(tool_served):
    gw, engine, srv = tool_served(CALLS)
    ok = _post(srv.base_url, "/v1/messages", "edits", _messages_body(
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}))
    assert ok.status_code == 200  # what Claude Code sends: keeps every thinking block, changes nothing
    call = [b for b in ok.json()["content"] if b["type"] == "tool_use"][0]
    history = [{"role": "user", "content": QUESTION}]
    for i in range(4):  # four earlier tool uses, each answered
        history += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "list_files",
                                                      "input": {"directory": "/srv/box"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "x"}]}]
    clear = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 30}}

    def refused(body, where):
        n = len(gw.sessions["edits"].generations)
        r = _post(srv.base_url, "/v1/messages", "edits", body)
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
        assert r.json()["error"]["type"] == "invalid_request_error" and where in r.json()["error"]["message"]
        assert len(gw.sessions["edits"].generations) == n  # nothing sampled
        return r.json()["error"]["message"]

    # past its trigger, with more tool uses than it keeps (3): the real API would clear; here, a 400
    msg = refused(_messages_body(messages=history, context_management={"edits": [clear]}),
                  "context_management.edits[0]")
    assert "clear old tool results" in msg
    # the same edit with three tool uses clears nothing at any size: served as sent
    short = history[:1] + history[3:]
    r = _post(srv.base_url, "/v1/messages", "edits", _messages_body(messages=short,
                                                                      context_management={"edits": [clear]}))
    assert r.status_code == 200, r.text
    # under its trigger it changes nothing either (the default trigger is 100,000 input tokens)
    r = _post(srv.base_url, "/v1/messages", "edits", _messages_body(
        messages=history, context_management={"edits": [{"type": "clear_tool_uses_20250919"}]}))
    assert r.status_code == 200, r.text
    thinking = [{"role": "user", "content": QUESTION},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                                  {"type": "text", "text": "A."}]},
                {"role": "user", "content": "more"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm2", "signature": "s"},
                                                  {"type": "text", "text": "B."}]},
                {"role": "user", "content": "more"}]
    refused(_messages_body(messages=thinking, context_management={"edits": [{"type": "clear_thinking_20251015"}]}),
            "context_management.edits[0]")  # keeps the last turn's thinking only: the first one's would go
    refused(_messages_body(compaction={"type": "summarize"}), "`compaction`")
    refused(_messages_body(messages=[{"role": "assistant", "content": [{"type": "compaction", "content": "sum"}]},
                                     {"role": "user", "content": QUESTION}]), "messages[0].content[0]")
    refused(_messages_body(messages=[{"role": "user", "content": QUESTION}, {"role": "system", "content": [
        {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "list_files"}}]}]),
        "messages[1].content[0]")
    # a token count is of the messages as sent: these fields ask nothing of it
    counts = [_post(srv.base_url, "/v1/messages/count_tokens", "edits", body).json() for body in (
        _messages_body(), _messages_body(thread={"type": "create"}, compaction={"type": "summarize"},
                                         context_management={"edits": [clear]}))]
    assert counts[0] == counts[1] and counts[0]["input_tokens"] > 20
    # a failed compaction (content null) is a no-op for the API, and here
    r = _post(srv.base_url, "/v1/messages", "edits", _messages_body(
        messages=[{"role": "assistant", "content": [{"type": "compaction", "content": None}]},
                  {"role": "user", "content": QUESTION}]))
    assert r.status_code == 200, r.text
    assert call["name"] == "list_files"


def test_responses_fields_that_ask_the_server_for_history_are_honoured_or_refused(tool_served):
    gw, engine, srv = tool_served(CALLS)
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="resp", max_retries=0)
    tools = [{"type": "function", "name": "list_files", "description": "List files.",
              "parameters": {"type": "object", "properties": {"directory": {"type": "string"}}}}]
    for kw, param in (({"conversation": "conv_1"}, "conversation"),
                      ({"prompt": {"id": "pmpt_1"}}, "prompt")):
        with pytest.raises(openai.NotFoundError) as e:
            client.responses.create(model="m", input=QUESTION, **kw)
        assert e.value.body["param"] == param and "not found" in e.value.body["message"]
    assert "resp" not in gw.sessions  # refused before any session opened
    for item, where in (({"type": "item_reference", "id": "msg_1"}, "item_reference"),
                        ({"id": "msg_1"}, "item_reference"),
                        ({"type": "compaction", "encrypted_content": "x"}, "compaction"),
                        ({"type": "additional_tools", "role": "developer", "tools": tools}, "additional_tools")):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="m", input=[{"role": "user", "content": QUESTION}, item])
        assert e.value.body["param"] == "input[1]" and where in e.value.body["message"]
    with pytest.raises(openai.BadRequestError):  # compaction needs its threshold to be honoured exactly
        client.responses.create(model="m", input=QUESTION, context_management=[{"type": "compaction"}])
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input=QUESTION, instructions=SYSTEM, tools=tools,
                                context_management=[{"type": "compaction", "compact_threshold": 20}])
    assert e.value.body["param"] == "context_management[0]" and "compact the conversation" in e.value.body["message"]

    # previous_response_id: the stored dialogue, continued — unless it was made with store: false
    first = client.responses.create(model="m", input=QUESTION, instructions=SYSTEM, tools=tools,
                                    context_management=[{"type": "compaction", "compact_threshold": 100_000}])
    (fc,) = [o for o in first.output if o.type == "function_call"]
    second = client.responses.create(model="m", previous_response_id=first.id, tools=tools, input=[
        {"type": "function_call_output", "call_id": fc.call_id, "output": LISTING}])
    assert second.output_text == f"The tool answered: {LISTING}"
    s = gw.sessions["resp"]
    assert len(s.contexts) == 1 and session_metrics(s)["context_lost_turns"] == 0.0
    unstored = client.responses.create(model="m", input=QUESTION, instructions=SYSTEM, tools=tools, store=False)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="m", previous_response_id=unstored.id, input="again")
    assert e.value.body["param"] == "previous_response_id"


def test_chat_store_and_metadata_do_not_change_the_conversation(tool_served):
    gw, engine, srv = tool_served(CALLS)
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="chat", max_retries=0)
    tools = [{"type": "function", "function": {"name": "list_files", "description": "List files.",
                                               "parameters": {"type": "object", "properties": {}}}}]
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    plain = client.chat.completions.create(model="m", messages=msgs, tools=tools)
    client2 = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="chat-stored", max_retries=0)
    stored = client2.chat.completions.create(model="m", messages=msgs, tools=tools, store=True,
                                             metadata={"run": "x"})
    assert engine.prompts[0] == engine.prompts[1]  # the same prompt, token for token
    assert plain.choices[0].message.tool_calls[0].function.name == stored.choices[0].message.tool_calls[0].function.name
