"""Wire protocols: OpenAI Chat Completions, Anthropic Messages, OpenAI Responses.

Each adapter turns a request body into a ``ChatRequest`` and a sampled ``Turn`` into the reply
the protocol's official SDK expects — a JSON object, or the server-sent-event sequence of its
streaming mode — and renders refusals in the protocol's error shape. Fields a client sends
that rlonce does not use are ignored. Tool results and tool calls travel in each protocol's
own shape; inside the gateway they are ``Message``s. Sampling values are bounded on the way in
(``messages.request_fields``); replies are serialised with ``allow_nan=False``.
"""

from __future__ import annotations

import json
import time
import uuid

from rlonce.gateway.messages import (
    Adapter,
    ChatRequest,
    Message,
    ProtocolError,
    Turn,
    max_tokens_of,
    parse_arguments,
    request_fields,
    text_of,
)
from rlonce.model.chat import ToolCall


def _sse(data: dict, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return head + "data: " + json.dumps(data, ensure_ascii=False, allow_nan=False) + "\n\n"


def _chunks(text: str, size: int = 24) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def _obj(body, where: str = "body") -> dict:
    if not isinstance(body, dict):
        raise ProtocolError(f"{where} must be a JSON object", param=where)
    return body


def _list(value, where: str) -> list:
    if not isinstance(value, list):
        raise ProtocolError(f"'{where}' must be an array", param=where)
    return value


def _function_tool(name, description, parameters, where: str) -> dict:
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"{where}: a tool needs a string 'name'", param=where)
    if parameters is not None and not isinstance(parameters, dict):
        raise ProtocolError(f"{where}: tool parameters must be a JSON schema object", param=where)
    return {"name": name, "description": description if isinstance(description, str) else "",
            "parameters": parameters or {"type": "object", "properties": {}}}


class OpenAIChat:
    name = "openai-chat"

    def parse(self, body, history: dict[str, list[Message]] | None = None) -> ChatRequest:
        body = _obj(body)
        if body.get("n") not in (None, 1):
            raise ProtocolError("'n' > 1 is not supported: a session records one sequence", param="n")
        msgs: list[Message] = []
        for i, m in enumerate(_list(body.get("messages"), "messages")):
            where = f"messages[{i}]"
            m = _obj(m, where)
            role = m.get("role")
            if role in ("system", "developer"):
                msgs.append(Message("system", text_of(m.get("content"), where + ".content")))
            elif role == "user":
                msgs.append(Message("user", text_of(m.get("content"), where + ".content")))
            elif role == "assistant":
                calls = []
                for j, c in enumerate(_list(m.get("tool_calls") or [], where + ".tool_calls")):
                    fn = _obj(_obj(c, f"{where}.tool_calls[{j}]").get("function"), f"{where}.tool_calls[{j}].function")
                    if not isinstance(fn.get("name"), str):
                        raise ProtocolError(f"{where}.tool_calls[{j}] needs a function name", param=where)
                    calls.append(ToolCall(fn["name"], parse_arguments(fn.get("arguments"), where)))
                msgs.append(Message("assistant", text_of(m.get("content"), where + ".content"), tuple(calls)))
            elif role == "tool":
                tid = m.get("tool_call_id")
                msgs.append(Message("tool", text_of(m.get("content"), where + ".content"),
                                    tool_call_id=tid if isinstance(tid, str) else None))
            else:
                raise ProtocolError(f"{where}.role must be system, developer, user, assistant or tool", param=where)
        tools = []
        for i, t in enumerate(_list(body.get("tools") or [], "tools")):
            t = _obj(t, f"tools[{i}]")
            if t.get("type", "function") != "function":
                continue
            fn = _obj(t.get("function"), f"tools[{i}].function")
            tools.append(_function_tool(fn.get("name"), fn.get("description"), fn.get("parameters"), f"tools[{i}]"))
        return ChatRequest(msgs, tools, max_tokens=max_tokens_of(body, "max_completion_tokens", "max_tokens"),
                           **request_fields(body))

    def _message(self, turn: Turn) -> dict:
        msg: dict = {"role": "assistant", "content": turn.content or (None if turn.calls else "")}
        if turn.calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments_json}} for c in turn.calls]
        return msg

    def _usage(self, turn: Turn) -> dict:
        return {"prompt_tokens": turn.prompt_tokens, "completion_tokens": turn.completion_tokens,
                "total_tokens": turn.prompt_tokens + turn.completion_tokens}

    def reply(self, turn: Turn, req: ChatRequest) -> dict:
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
                "model": req.model, "choices": [{"index": 0, "message": self._message(turn), "logprobs": None,
                                                 "finish_reason": turn.finish}],
                "usage": self._usage(turn), "rlonce": {"session_id": turn.session_id, "turn": turn.turn_index}}

    def stream(self, turn: Turn, req: ChatRequest, body: dict) -> list[str]:
        base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": req.model}

        def chunk(delta: dict, finish=None) -> str:
            return _sse({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})

        out = [chunk({"role": "assistant", "content": ""})]
        out += [chunk({"content": piece}) for piece in _chunks(turn.content)]
        for i, c in enumerate(turn.calls):
            out.append(chunk({"tool_calls": [{"index": i, "id": c.id, "type": "function",
                                              "function": {"name": c.name, "arguments": ""}}]}))
            out += [chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
                    for piece in _chunks(c.arguments_json)]
        out.append(chunk({}, turn.finish))
        opts = body.get("stream_options")
        if isinstance(opts, dict) and opts.get("include_usage"):
            out.append(_sse({**base, "choices": [], "usage": self._usage(turn)}))
        return out + ["data: [DONE]\n\n"]

    def answer(self, turn: Turn, req: ChatRequest, body: dict, history: dict[str, list[Message]]) -> dict | list[str]:
        return self.stream(turn, req, body) if req.stream else self.reply(turn, req)

    def error(self, e: ProtocolError) -> dict:
        return {"error": {"message": str(e), "type": e.kind, "param": e.param, "code": None}}


class AnthropicMessages:
    name = "anthropic-messages"
    _ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 408: "timeout_error", 409: "invalid_request_error",
                    413: "request_too_large", 422: "invalid_request_error", 429: "rate_limit_error", 503: "api_error",
                    504: "timeout_error"}

    def parse(self, body, history: dict[str, list[Message]] | None = None) -> ChatRequest:
        body = _obj(body)
        msgs: list[Message] = []
        system = body.get("system")
        if system is not None:
            msgs.append(Message("system", text_of(system, "system")))
        for i, m in enumerate(_list(body.get("messages"), "messages")):
            where = f"messages[{i}]"
            m = _obj(m, where)
            role, content = m.get("role"), m.get("content")
            if role not in ("user", "assistant"):
                raise ProtocolError(f"{where}.role must be user or assistant", param=where)
            blocks = ([{"type": "text", "text": content}] if isinstance(content, str)
                      else _list(content, where + ".content"))
            texts, calls, results = [], [], []
            for j, b in enumerate(blocks):
                b = _obj(b, f"{where}.content[{j}]")
                kind = b.get("type")
                if kind == "text":
                    texts.append(text_of(b.get("text"), f"{where}.content[{j}].text"))
                elif kind == "tool_use" and role == "assistant":
                    if not isinstance(b.get("name"), str):
                        raise ProtocolError(f"{where}.content[{j}] tool_use needs a 'name'", param=where)
                    calls.append(ToolCall(b["name"], parse_arguments(b.get("input"), f"{where}.content[{j}].input")))
                elif kind == "tool_result" and role == "user":
                    tid = b.get("tool_use_id")
                    results.append(Message("tool", text_of(b.get("content"), f"{where}.content[{j}].content"),
                                           tool_call_id=tid if isinstance(tid, str) else None))
                elif isinstance(kind, str):
                    continue  # thinking, images, documents: not rendered by a text-only template
                else:
                    raise ProtocolError(f"{where}.content[{j}] needs a 'type'", param=where)
            if role == "assistant":
                msgs.append(Message("assistant", "".join(texts), tuple(calls)))
            else:
                msgs += results
                if texts or not results:
                    msgs.append(Message("user", "".join(texts)))
        tools = []
        for i, t in enumerate(_list(body.get("tools") or [], "tools")):
            t = _obj(t, f"tools[{i}]")
            if "input_schema" not in t and t.get("type") not in (None, "custom"):
                continue  # server tools (web search, …) are not offered to the model
            tools.append(_function_tool(t.get("name"), t.get("description"), t.get("input_schema"), f"tools[{i}]"))
        return ChatRequest(msgs, tools, max_tokens=max_tokens_of(body, "max_tokens"), **request_fields(body))

    def _content(self, turn: Turn) -> list[dict]:
        blocks = [{"type": "text", "text": turn.content}] if turn.content or not turn.calls else []
        return blocks + [{"type": "tool_use", "id": "toolu_" + c.id, "name": c.name, "input": c.arguments}
                         for c in turn.calls]

    def _stop(self, turn: Turn) -> str:
        return {"length": "max_tokens", "tool_calls": "tool_use"}.get(turn.finish, "end_turn")

    def _message(self, turn: Turn, req: ChatRequest, content: list, stop, output_tokens: int) -> dict:
        return {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": req.model,
                "content": content, "stop_reason": stop, "stop_sequence": None,
                "usage": {"input_tokens": turn.prompt_tokens, "output_tokens": output_tokens}}

    def reply(self, turn: Turn, req: ChatRequest) -> dict:
        return self._message(turn, req, self._content(turn), self._stop(turn), turn.completion_tokens)

    def stream(self, turn: Turn, req: ChatRequest, body: dict) -> list[str]:
        def ev(data: dict) -> str:
            return _sse(data, data["type"])

        out = [ev({"type": "message_start", "message": self._message(turn, req, [], None, 0)})]
        for i, b in enumerate(self._content(turn)):
            if b["type"] == "text":
                out.append(ev({"type": "content_block_start", "index": i,
                               "content_block": {"type": "text", "text": ""}}))
                out += [ev({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": p}})
                        for p in _chunks(b["text"])]
            else:
                out.append(ev({"type": "content_block_start", "index": i,
                               "content_block": {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}}))
                out += [ev({"type": "content_block_delta", "index": i,
                            "delta": {"type": "input_json_delta", "partial_json": p}})
                        for p in _chunks(json.dumps(b["input"], ensure_ascii=False))]
            out.append(ev({"type": "content_block_stop", "index": i}))
        out.append(ev({"type": "message_delta", "delta": {"stop_reason": self._stop(turn), "stop_sequence": None},
                       "usage": {"output_tokens": turn.completion_tokens}}))
        return out + [ev({"type": "message_stop"})]

    def answer(self, turn: Turn, req: ChatRequest, body: dict, history: dict[str, list[Message]]) -> dict | list[str]:
        return self.stream(turn, req, body) if req.stream else self.reply(turn, req)

    def error(self, e: ProtocolError) -> dict:
        return {"type": "error", "error": {"type": self._ERROR_TYPES.get(e.status, "invalid_request_error"),
                                           "message": str(e)}}


class OpenAIResponses:
    """Responses API. ``previous_response_id`` continues a stored response of the same session;
    its system message carries over unless the request gives ``instructions`` (the OpenAI
    service drops it, which would rewrite the prefix and force a new context every turn)."""

    name = "openai-responses"

    def parse(self, body, history: dict[str, list[Message]] | None = None) -> ChatRequest:
        body = _obj(body)
        msgs: list[Message] = []
        prev = body.get("previous_response_id")
        if prev is not None:
            if not isinstance(prev, str) or history is None or prev not in history:
                raise ProtocolError(f"previous response {prev!r} not found in this session",
                                    status=404, kind="not_found", param="previous_response_id")
            msgs += history[prev]
        instructions = body.get("instructions")
        if instructions is not None:  # replaces the stored system message; without it, that one carries over
            msgs = [Message("system", text_of(instructions, "instructions"))] + [m for m in msgs if m.role != "system"]
        items = body.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        for i, it in enumerate(_list(items, "input")):
            where = f"input[{i}]"
            it = _obj(it, where)
            kind = it.get("type", "message")
            if kind == "message":
                role = it.get("role")
                if role not in ("user", "assistant", "system", "developer"):
                    raise ProtocolError(f"{where}.role must be user, assistant, system or developer", param=where)
                role = "system" if role == "developer" else role
                msgs.append(Message(role, text_of(it.get("content"), where + ".content")))
            elif kind == "function_call":
                if not isinstance(it.get("name"), str):
                    raise ProtocolError(f"{where} function_call needs a 'name'", param=where)
                call = ToolCall(it["name"], parse_arguments(it.get("arguments"), where + ".arguments"))
                if msgs and msgs[-1].role == "assistant":
                    msgs[-1] = Message("assistant", msgs[-1].content, (*msgs[-1].tool_calls, call))
                else:
                    msgs.append(Message("assistant", "", (call,)))
            elif kind == "function_call_output":
                out = it.get("output")
                cid = it.get("call_id")
                msgs.append(Message("tool", out if isinstance(out, str) else text_of(out, where + ".output"),
                                    tool_call_id=cid if isinstance(cid, str) else None))
            elif isinstance(kind, str):
                continue  # reasoning items, images, …: not rendered by a text-only template
            else:
                raise ProtocolError(f"{where}.type must be a string", param=where)
        # system messages first, as the chat template expects
        msgs = [m for m in msgs if m.role == "system"][:1] + [m for m in msgs if m.role != "system"]
        tools = []
        for i, t in enumerate(_list(body.get("tools") or [], "tools")):
            t = _obj(t, f"tools[{i}]")
            if t.get("type") != "function":
                continue
            tools.append(_function_tool(t.get("name"), t.get("description"), t.get("parameters"), f"tools[{i}]"))
        return ChatRequest(msgs, tools, max_tokens=max_tokens_of(body, "max_output_tokens"), **request_fields(body))

    def _items(self, turn: Turn, rid: str) -> list[dict]:
        items = []
        if turn.content or not turn.calls:
            items.append({"type": "message", "id": f"msg_{rid}", "status": "completed", "role": "assistant",
                          "content": [{"type": "output_text", "text": turn.content, "annotations": [],
                                       "logprobs": []}]})
        items += [{"type": "function_call", "id": f"fc_{rid}_{i}", "call_id": c.id, "name": c.name,
                   "arguments": c.arguments_json, "status": "completed"} for i, c in enumerate(turn.calls)]
        return items

    def _response(self, turn: Turn, req: ChatRequest, rid: str, status: str, output: list[dict]) -> dict:
        incomplete = status == "incomplete"
        return {"id": rid, "object": "response", "created_at": int(time.time()), "status": status,
                "model": req.model, "output": output, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "instructions": None, "metadata": {}, "parallel_tool_calls": True, "tool_choice": "auto",
                "tools": [{"type": "function", **t, "strict": False} for t in req.tools],
                "temperature": req.temperature, "top_p": req.top_p, "text": {"format": {"type": "text"}},
                "usage": {"input_tokens": turn.prompt_tokens, "output_tokens": turn.completion_tokens,
                          "total_tokens": turn.prompt_tokens + turn.completion_tokens,
                          "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens_details": {"reasoning_tokens": 0}}}

    def new_id(self) -> str:
        return f"resp_{uuid.uuid4().hex[:24]}"

    def reply(self, turn: Turn, req: ChatRequest, rid: str) -> dict:
        status = "incomplete" if turn.finish == "length" else "completed"
        return self._response(turn, req, rid, status, self._items(turn, rid))

    def stream(self, turn: Turn, req: ChatRequest, rid: str) -> list[str]:
        seq = iter(range(1_000_000))

        def ev(kind: str, **data) -> str:
            return _sse({"type": kind, "sequence_number": next(seq), **data}, kind)

        out = [ev("response.created", response=self._response(turn, req, rid, "in_progress", [])),
               ev("response.in_progress", response=self._response(turn, req, rid, "in_progress", []))]
        items = self._items(turn, rid)
        for k, item in enumerate(items):
            if item["type"] == "message":
                text = item["content"][0]["text"]
                out.append(ev("response.output_item.added", output_index=k,
                              item={**item, "status": "in_progress", "content": []}))
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                out.append(ev("response.content_part.added", item_id=item["id"], output_index=k, content_index=0,
                              part=part))
                out += [ev("response.output_text.delta", item_id=item["id"], output_index=k, content_index=0,
                           delta=p, logprobs=[]) for p in _chunks(text)]
                out.append(ev("response.output_text.done", item_id=item["id"], output_index=k, content_index=0,
                              text=text, logprobs=[]))
                out.append(ev("response.content_part.done", item_id=item["id"], output_index=k, content_index=0,
                              part={**part, "text": text}))
            else:
                out.append(ev("response.output_item.added", output_index=k,
                              item={**item, "arguments": "", "status": "in_progress"}))
                out += [ev("response.function_call_arguments.delta", item_id=item["id"], output_index=k, delta=p)
                        for p in _chunks(item["arguments"])]
                out.append(ev("response.function_call_arguments.done", item_id=item["id"], output_index=k,
                              name=item["name"], arguments=item["arguments"]))
            out.append(ev("response.output_item.done", output_index=k, item=item))
        final = self.reply(turn, req, rid)
        out.append(ev("response.completed" if final["status"] == "completed" else "response.incomplete",
                      response=final))
        return out

    def answer(self, turn: Turn, req: ChatRequest, body: dict, history: dict[str, list[Message]]) -> dict | list[str]:
        """The reply under a new response id, which the session keeps for ``previous_response_id``."""
        rid = self.new_id()
        history[rid] = list(turn.dialogue)
        return self.stream(turn, req, rid) if req.stream else self.reply(turn, req, rid)

    def error(self, e: ProtocolError) -> dict:
        return {"error": {"message": str(e), "type": e.kind, "param": e.param, "code": None}}


PROTOCOLS: dict[str, Adapter] = {p.name: p for p in (OpenAIChat(), AnthropicMessages(), OpenAIResponses())}
