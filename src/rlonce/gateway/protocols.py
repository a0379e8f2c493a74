"""Wire protocols: OpenAI Chat Completions, Anthropic Messages, OpenAI Responses.

Each adapter turns a request body into a ``ChatRequest`` and a sampled ``Turn`` into the reply
the protocol's official SDK expects — a JSON object, or the server-sent-event sequence of its
streaming mode — and renders refusals in the protocol's error shape. Fields a client sends
that rlonce does not use are ignored, unless they change what the conversation is: those are
honoured or refused (``rlonce.gateway.stateful``). Tool results and tool calls travel in each protocol's
own shape; inside the gateway they are ``Message``s. Sampling values are bounded on the way in
(``messages.request_fields``); replies are serialised with ``allow_nan=False``.
"""

from __future__ import annotations

import hashlib
import time
import uuid

from rlonce.gateway import stateful, structured
from rlonce.gateway.messages import (
    Adapter,
    ChatRequest,
    ContextLengthExceeded,
    Message,
    Overloaded,
    ProtocolError,
    TokenLogprob,
    Turn,
    max_tokens_of,
    parse_arguments,
    request_fields,
    stops_of,
    text_of,
    top_k_of,
    top_logprobs_of,
)
from rlonce.gateway.streams import ChatStream, MessagesStream, ResponsesStream, TurnStream
from rlonce.model.chat import ToolCall


def _obj(body, where: str = "body") -> dict:
    if not isinstance(body, dict):
        raise ProtocolError(f"{where} must be a JSON object", param=where)
    return body


def _list(value, where: str) -> list:
    if not isinstance(value, list):
        raise ProtocolError(f"'{where}' must be an array", param=where)
    return value


def _top(lp: TokenLogprob) -> list[dict]:
    return [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in lp.top]


def logprob_entries(lps: list[TokenLogprob] | None) -> list[dict]:
    """Token log-probs in the shape both OpenAI APIs share: token, logprob, its UTF-8 bytes, and
    the most likely tokens at its position in the same shape."""
    return [{"token": lp.token, "logprob": lp.logprob, "bytes": list(lp.token.encode()), "top_logprobs": _top(lp)}
            for lp in lps or []]


def _flag(body: dict, key: str) -> bool:
    v = body.get(key)
    if v is not None and not isinstance(v, bool):
        raise ProtocolError(f"'{key}' must be a boolean", param=key)
    return bool(v)


def _function_tool(name, description, parameters, where: str) -> dict:
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"{where}: a tool needs a string 'name'", param=where)
    if parameters is not None and not isinstance(parameters, dict):
        raise ProtocolError(f"{where}: tool parameters must be a JSON schema object", param=where)
    return {"name": name, "description": description if isinstance(description, str) else "",
            "parameters": parameters or {"type": "object", "properties": {}}}


def _tool_name(t: dict) -> str | None:
    """The name of a tool the model is not offered (hosted, server, custom), if it has one."""
    name = t.get("name") if isinstance(t, dict) else None
    return name if isinstance(name, str) else t.get("type") if isinstance(t, dict) else None


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
                    c = _obj(c, f"{where}.tool_calls[{j}]")
                    if c.get("type") == "custom":  # a custom (free-form) tool's call: its text as 'input'
                        fn = _obj(c.get("custom"), f"{where}.tool_calls[{j}].custom")
                        args = {"input": fn.get("input") if isinstance(fn.get("input"), str) else ""}
                    else:
                        fn = _obj(c.get("function"), f"{where}.tool_calls[{j}].function")
                        args = parse_arguments(fn.get("arguments"), where)
                    if not isinstance(fn.get("name"), str):
                        raise ProtocolError(f"{where}.tool_calls[{j}] needs a function name", param=where)
                    calls.append(ToolCall(fn["name"], args))
                legacy = m.get("function_call")  # the deprecated single-call field
                if isinstance(legacy, dict) and isinstance(legacy.get("name"), str):
                    calls.append(ToolCall(legacy["name"], parse_arguments(legacy.get("arguments"), where)))
                thought = m.get("reasoning_content", m.get("reasoning"))
                msgs.append(Message("assistant", text_of(m.get("content"), where + ".content"), tuple(calls),
                                    reasoning=thought if isinstance(thought, str) else ""))
            elif role == "function":  # the deprecated form of a tool result
                msgs.append(Message("tool", text_of(m.get("content"), where + ".content")))
            elif role == "tool":
                tid = m.get("tool_call_id")
                msgs.append(Message("tool", text_of(m.get("content"), where + ".content"),
                                    tool_call_id=tid if isinstance(tid, str) else None))
            else:
                raise ProtocolError(f"{where}.role must be system, developer, user, assistant, tool or function",
                                    param=where)
        tools, others, strict = [], set(), []
        for i, t in enumerate(_list(body.get("tools") or [], "tools")):
            t = _obj(t, f"tools[{i}]")
            if t.get("type", "function") != "function":
                others.add(_tool_name(t.get(t.get("type")) or t))
                continue
            fn = _obj(t.get("function"), f"tools[{i}].function")
            tools.append(_function_tool(fn.get("name"), fn.get("description"), fn.get("parameters"), f"tools[{i}]"))
            if fn.get("strict") is True:
                strict.append((fn["name"], f"tools[{i}].function.parameters"))
        logprobs = _flag(body, "logprobs")
        shape = structured.structure(structured.openai_format(body.get("response_format"), "response_format", True),
                                     structured.openai_tool_choice(body.get("tool_choice"), False), tools, others,
                                     strict)
        return ChatRequest(msgs, tools, max_tokens=max_tokens_of(body, "max_completion_tokens", "max_tokens"),
                           stop=stops_of(body, "stop"), logprobs=logprobs,
                           top_logprobs=top_logprobs_of(body) if logprobs else 0, structure=shape,
                           **request_fields(body))

    def _message(self, turn: Turn) -> dict:
        msg: dict = {"role": "assistant", "content": turn.content or (None if turn.calls else "")}
        if turn.reasoning:
            msg["reasoning_content"] = turn.reasoning
        if turn.calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments_json}} for c in turn.calls]
        return msg

    def usage(self, turn: Turn) -> dict:
        return {"prompt_tokens": turn.prompt_tokens, "completion_tokens": turn.completion_tokens,
                "total_tokens": turn.prompt_tokens + turn.completion_tokens,
                "completion_tokens_details": {"reasoning_tokens": turn.reasoning_tokens}}

    def logprobs(self, turn: Turn) -> dict | None:
        """``choices[].logprobs``: every sampled token of the turn, when the request asked."""
        return None if turn.logprobs is None else {"content": logprob_entries(turn.logprobs), "refusal": None}

    def finish_reason(self, turn: Turn, req: ChatRequest) -> str:
        """The turn's finish reason as the real API gives it: a call forced by name ends with
        "stop" (one forced by ``required`` with "tool_calls", like a call the model chose)."""
        return "stop" if turn.finish == "tool_calls" and req.structure.tool_choice == "named" else turn.finish

    def reply(self, turn: Turn, req: ChatRequest) -> dict:
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
                "model": req.model, "choices": [{"index": 0, "message": self._message(turn),
                                                 "logprobs": self.logprobs(turn),
                                                 "finish_reason": self.finish_reason(turn, req)}],
                "usage": self.usage(turn), "rlonce": {"session_id": turn.session_id, "turn": turn.turn_index}}

    def streamer(self, req: ChatRequest, body: dict, history: dict[str, list[Message]]) -> TurnStream:
        return ChatStream(self, req, body)

    def answer(self, turn: Turn, req: ChatRequest, body: dict, history: dict[str, list[Message]]) -> dict:
        return self.reply(turn, req)

    def error(self, e: ProtocolError) -> dict:
        msg = str(e)
        if isinstance(e, ContextLengthExceeded):  # the real API's words
            msg = (f"This model's maximum context length is {e.limit} tokens. However, your messages resulted in "
                   f"{e.tokens} tokens. Please reduce the length of the messages.")
        return {"error": {"message": msg, "type": e.kind, "param": e.param, "code": e.code}}


class AnthropicMessages:
    name = "anthropic-messages"
    _ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 408: "timeout_error", 409: "invalid_request_error",
                    413: "request_too_large", 422: "invalid_request_error", 429: "rate_limit_error", 503: "api_error",
                    504: "timeout_error", 529: "overloaded_error"}

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
            if role == "system":  # agent CLIs interleave system reminders this way: a system turn where it stands
                for j, b in enumerate(content if isinstance(content, list) else []):
                    if isinstance(b, dict) and b.get("type") in ("tool_addition", "tool_removal"):
                        stateful.refuse_block(b["type"], b, f"{where}.content[{j}]")
                msgs.append(Message("system", text_of(content, where + ".content")))
                continue
            if role not in ("user", "assistant"):
                raise ProtocolError(f"{where}.role must be user, assistant or system", param=where)
            blocks = ([{"type": "text", "text": content}] if isinstance(content, str)
                      else _list(content, where + ".content"))
            texts, calls, results, thoughts = [], [], [], []
            for j, b in enumerate(blocks):
                b = _obj(b, f"{where}.content[{j}]")
                kind = b.get("type")
                if kind == "thinking" and role == "assistant" and isinstance(b.get("thinking"), str):
                    thoughts.append(b["thinking"])
                elif kind == "text":
                    texts.append(text_of(b.get("text"), f"{where}.content[{j}].text"))
                elif kind == "tool_use" and role == "assistant":
                    if not isinstance(b.get("name"), str):
                        raise ProtocolError(f"{where}.content[{j}] tool_use needs a 'name'", param=where)
                    calls.append(ToolCall(b["name"], parse_arguments(b.get("input"), f"{where}.content[{j}].input")))
                elif kind == "tool_result" and role == "user":
                    tid = b.get("tool_use_id")
                    results.append(Message("tool", text_of(b.get("content"), f"{where}.content[{j}].content"),
                                           tool_call_id=tid if isinstance(tid, str) else None))
                elif kind in ("compaction", "tool_addition", "tool_removal"):
                    stateful.refuse_block(kind, b, f"{where}.content[{j}]")  # a failed compaction passes: skipped
                elif isinstance(kind, str):
                    continue  # redacted thinking, images, documents: not rendered by a text-only template
                else:
                    raise ProtocolError(f"{where}.content[{j}] needs a 'type'", param=where)
            if role == "assistant":
                msgs.append(Message("assistant", "\n".join(texts), tuple(calls), reasoning="\n".join(thoughts)))
            else:
                msgs += results
                if texts or not results:
                    msgs.append(Message("user", "\n".join(texts)))
        tools, others, strict = [], set(), []
        for i, t in enumerate(_list(body.get("tools") or [], "tools")):
            t = _obj(t, f"tools[{i}]")
            if "input_schema" not in t and t.get("type") not in (None, "custom"):
                others.add(_tool_name(t))
                continue  # server tools (web search, …) are not offered to the model
            tools.append(_function_tool(t.get("name"), t.get("description"), t.get("input_schema"), f"tools[{i}]"))
            if t.get("strict") is True:
                strict.append((t["name"], f"tools[{i}].input_schema"))
        shape = structured.structure(structured.anthropic_format(body),
                                     structured.anthropic_tool_choice(body.get("tool_choice")), tools, others, strict)
        return ChatRequest(msgs, tools, max_tokens=max_tokens_of(body, "max_tokens"), top_k=top_k_of(body),
                           stop=stops_of(body, "stop_sequences"), edit_trigger=stateful.anthropic(body, msgs),
                           structure=shape, **request_fields(body))

    def thinking(self, turn: Turn) -> dict:
        """The turn's reasoning as a thinking block; the signature is its digest (nothing is hidden)."""
        return {"type": "thinking", "thinking": turn.reasoning,
                "signature": hashlib.sha256(turn.reasoning.encode()).hexdigest()}

    def _content(self, turn: Turn) -> list[dict]:
        blocks = [self.thinking(turn)] if turn.reasoning else []
        blocks += [{"type": "text", "text": turn.content}] if turn.content or not turn.calls else []
        return blocks + [{"type": "tool_use", "id": "toolu_" + c.id, "name": c.name, "input": c.arguments}
                         for c in turn.calls]

    def stop_reason(self, turn: Turn) -> str:
        if turn.stop_sequence is not None:
            return "stop_sequence"
        return {"length": "max_tokens", "tool_calls": "tool_use"}.get(turn.finish, "end_turn")

    def usage(self, input_tokens: int, output_tokens: int) -> dict:
        """Usage as the real API counts it; the cache fields are 0 (no prompt-cache billing here,
        whatever the engine's prefix reuse saved)."""
        return {"input_tokens": input_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                "output_tokens": output_tokens}

    def message(self, turn: Turn, req: ChatRequest, content: list, stop, output_tokens: int) -> dict:
        return {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": req.model,
                "content": content, "stop_reason": stop, "stop_sequence": turn.stop_sequence,
                "usage": self.usage(turn.prompt_tokens, output_tokens)}

    def reply(self, turn: Turn, req: ChatRequest) -> dict:
        return self.message(turn, req, self._content(turn), self.stop_reason(turn), turn.completion_tokens)

    def streamer(self, req: ChatRequest, body: dict, history: dict[str, list[Message]]) -> TurnStream:
        return MessagesStream(self, req, body)

    def answer(self, turn: Turn, req: ChatRequest, body: dict, history: dict[str, list[Message]]) -> dict:
        return self.reply(turn, req)

    def error(self, e: ProtocolError) -> dict:
        if isinstance(e, Overloaded):
            return {"type": "error", "error": {"type": "overloaded_error", "message": str(e)}}
        err = {"type": self._ERROR_TYPES.get(e.status, "invalid_request_error"), "message": str(e)}
        if e.details:
            err["details"] = e.details  # what the SDK recovers by (``thread_unsupported_request``)
        return {"type": "error", "error": err}


class OpenAIResponses:
    """Responses API. ``previous_response_id`` continues a stored response of the same session
    (one made with ``store: false`` is not kept, as the real API keeps none); its system message
    carries over unless the request gives ``instructions`` (the OpenAI service drops it, which
    would rewrite the prefix and force a new context every turn)."""

    name = "openai-responses"

    def parse(self, body, history: dict[str, list[Message]] | None = None) -> ChatRequest:
        body = _obj(body)
        trigger = stateful.responses(body)
        msgs: list[Message] = []
        prev = body.get("previous_response_id")
        if prev is not None:
            if not isinstance(prev, str) or history is None or prev not in history:
                raise ProtocolError(f"previous response {prev!r} not found in this session",
                                    status=404, kind="not_found", param="previous_response_id")
            msgs += history[prev]
        instructions = body.get("instructions")
        if instructions is not None:  # replaces the stored leading system message; without it, that one carries over
            lead = Message("system", text_of(instructions, "instructions"))
            msgs = [lead] + (msgs[1:] if msgs and msgs[0].role == "system" else msgs)
        items = body.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        thought = ""  # a reasoning item belongs to the assistant turn after it
        for i, it in enumerate(_list(items, "input")):
            thought = self._item(msgs, _obj(it, f"input[{i}]"), f"input[{i}]", thought)
        tools, others, strict = [], set(), []
        for i, t in enumerate(_list(body.get("tools") or [], "tools")):
            t = _obj(t, f"tools[{i}]")
            if t.get("type") != "function":
                others.add(_tool_name(t))
                continue
            tools.append(_function_tool(t.get("name"), t.get("description"), t.get("parameters"), f"tools[{i}]"))
            if t.get("strict") is True:
                strict.append((t["name"], f"tools[{i}].parameters"))
        include = _list(body.get("include") or [], "include")
        top = top_logprobs_of(body)
        logprobs = "message.output_text.logprobs" in include or top > 0
        text = body.get("text")
        fmt = _obj(text, "text").get("format") if text is not None else None
        shape = structured.structure(structured.openai_format(fmt, "text.format", False),
                                     structured.openai_tool_choice(body.get("tool_choice"), True), tools, others,
                                     strict)
        return ChatRequest(msgs, tools, max_tokens=max_tokens_of(body, "max_output_tokens"), logprobs=logprobs,
                           top_logprobs=top, edit_trigger=trigger, structure=shape, **request_fields(body))

    def _item(self, msgs: list[Message], it: dict, where: str, thought: str) -> str:
        """Add one input item to ``msgs``; returns the reasoning waiting for the next assistant turn."""
        stateful.refuse_item(it, where)
        kind = it.get("type", "message")
        if kind == "reasoning":
            parts = it.get("content") or it.get("summary") or []
            return thought + text_of(parts if isinstance(parts, list) else [], where + ".content")
        if thought and kind in ("message", "function_call", "custom_tool_call") \
                and it.get("role", "assistant") == "assistant":
            msgs.append(Message("assistant", "", (), reasoning=thought))  # what follows merges into it
            thought = ""
        if kind == "message":
            role = it.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ProtocolError(f"{where}.role must be user, assistant, system or developer", param=where)
            role = "system" if role == "developer" else role
            text = text_of(it.get("content"), where + ".content")
            last = msgs[-1] if msgs else None
            if role == "assistant" and last and last.role == "assistant" and not last.content \
                    and not last.tool_calls:  # the turn its reasoning item opened
                msgs[-1] = Message("assistant", text, reasoning=last.reasoning)
            else:
                msgs.append(Message(role, text))
        elif kind in ("function_call", "custom_tool_call"):
            if not isinstance(it.get("name"), str):
                raise ProtocolError(f"{where} {kind} needs a 'name'", param=where)
            args = ({"input": it.get("input") if isinstance(it.get("input"), str) else ""}
                    if kind == "custom_tool_call" else parse_arguments(it.get("arguments"), where + ".arguments"))
            call = ToolCall(it["name"], args)
            if msgs and msgs[-1].role == "assistant":
                last = msgs[-1]
                msgs[-1] = Message("assistant", last.content, (*last.tool_calls, call), reasoning=last.reasoning)
            else:
                msgs.append(Message("assistant", "", (call,)))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out, cid = it.get("output"), it.get("call_id")
            msgs.append(Message("tool", out if isinstance(out, str) else text_of(out, where + ".output"),
                                tool_call_id=cid if isinstance(cid, str) else None))
        elif not isinstance(kind, str):  # other items (images, web searches, …) are not rendered
            raise ProtocolError(f"{where}.type must be a string", param=where)
        return thought

    def output_text(self, text: str, turn: Turn | None = None) -> dict:
        """The message's ``output_text`` part; its ``logprobs`` are every sampled token of the
        turn when the request asked (``include``), else empty."""
        return {"type": "output_text", "text": text, "annotations": [],
                "logprobs": logprob_entries(turn.logprobs if turn is not None else None)}

    def _items(self, turn: Turn, rid: str) -> list[dict]:
        items = [{"type": "reasoning", "id": f"rs_{rid}", "summary": [], "status": "completed",
                  "content": [{"type": "reasoning_text", "text": turn.reasoning}]}] if turn.reasoning else []
        if turn.content or not turn.calls:
            items.append({"type": "message", "id": f"msg_{rid}", "status": "completed", "role": "assistant",
                          "content": [self.output_text(turn.content, turn)]})
        items += [{"type": "function_call", "id": f"fc_{rid}_{i}", "call_id": c.id, "name": c.name,
                   "arguments": c.arguments_json, "status": "completed"} for i, c in enumerate(turn.calls)]
        if turn.finish == "length" and items:  # the item the cap cut short, as the real API marks it
            items[-1]["status"] = "incomplete"
            if items[0]["type"] == "reasoning" and not turn.content and not turn.calls:
                items[0]["status"] = "incomplete"  # the cap came inside the reasoning (or right after it)
        return items

    def response(self, turn: Turn, req: ChatRequest, rid: str, status: str, output: list[dict]) -> dict:
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
                          "output_tokens_details": {"reasoning_tokens": turn.reasoning_tokens}}}

    def new_id(self) -> str:
        return f"resp_{uuid.uuid4().hex[:24]}"

    def reply(self, turn: Turn, req: ChatRequest, rid: str) -> dict:
        status = "incomplete" if turn.finish == "length" else "completed"
        return self.response(turn, req, rid, status, self._items(turn, rid))

    def streamer(self, req: ChatRequest, body: dict, history: dict[str, list[Message]]) -> TurnStream:
        return ResponsesStream(self, req, body, history)

    def answer(self, turn: Turn, req: ChatRequest, body: dict, history: dict[str, list[Message]]) -> dict:
        """The reply under a new response id, which the session keeps for ``previous_response_id``."""
        rid = self.new_id()
        self.keep(rid, turn, body, history)
        return self.reply(turn, req, rid)

    def keep(self, rid: str, turn: Turn, body: dict, history: dict[str, list[Message]]) -> None:
        """Store the dialogue after ``turn`` under ``rid``, unless the request said ``store: false``."""
        if body.get("store") is not False:
            history[rid] = list(turn.dialogue)

    def error(self, e: ProtocolError) -> dict:
        if isinstance(e, ContextLengthExceeded):  # the real API's words
            return {"error": {"message": "Your input exceeds the context window of this model. Please adjust your "
                              f"input and try again. ({e.tokens} tokens > {e.limit} maximum)",
                              "type": e.kind, "param": "input", "code": e.code}}
        return {"error": {"message": str(e), "type": e.kind, "param": e.param, "code": e.code}}


PROTOCOLS: dict[str, Adapter] = {p.name: p for p in (OpenAIChat(), AnthropicMessages(), OpenAIResponses())}
