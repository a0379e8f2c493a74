"""Server-sent events of one streamed turn, in each protocol's sequence, emitted as tokens arrive.

A ``TurnStream`` is made when a streaming request starts; ``start`` gives the events that open
the reply, ``text`` one content delta, ``finish`` the rest once the turn is sampled (what is
left of the content, the tool calls with their arguments, the stop reason, the usage), and
``error`` what a failure mid-stream becomes. The content streamed is only ever a prefix of the
content the non-streamed reply would carry (``TextStream`` holds back anything that may turn
out to be tool-call markup, reasoning or a stop sequence), so ``finish`` completes it and the
two replies say the same. The events are the ones each official SDK's stream helper
accumulates (``openai``'s ``chat.completions.stream``/``responses.stream``, ``anthropic``'s
``messages.stream``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

from rlonce.gateway.messages import ChatRequest, Message, ProtocolError, Turn


def sse(data: dict, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return head + "data: " + json.dumps(data, ensure_ascii=False, allow_nan=False) + "\n\n"


def chunks(text: str, size: int = 24) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


class TextStream:
    """The content of a turn being sampled, as far as it is safe to show: the decoded tokens up
    to the first marker (``hold``: tool-call markup, the turn-end text, reasoning tags, stop
    sequences), without a trailing part that could still become one, without an incomplete
    UTF-8 character, and stripped as the final content is. ``push`` returns what is new."""

    def __init__(self, decode: Callable[[list[int]], str], hold: tuple[str, ...]):
        self.decode = decode
        self.hold = tuple(h for h in hold if h)
        self.sent = ""
        self.ids: list[int] = []

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.decode(self.ids).rstrip("\ufffd")
        cut = min((i for i in (text.find(h) for h in self.hold) if i >= 0), default=len(text))
        text = text[:cut]
        for h in self.hold:  # a tail that may be the start of a marker waits for the next token
            for k in range(min(len(h) - 1, len(text)), 0, -1):
                if text.endswith(h[:k]):
                    text = text[:-k]
                    break
        text = text.strip()
        if not text.startswith(self.sent) or len(text) == len(self.sent):
            return ""
        new, self.sent = text[len(self.sent):], text
        return new


class TurnStream:
    """One streamed reply. ``sent`` is the content emitted so far."""

    def __init__(self, adapter, req: ChatRequest, body: dict):
        self.adapter, self.req, self.body = adapter, req, body
        self.sent = ""

    def start(self, prompt_tokens: int) -> list[str]:
        raise NotImplementedError

    def text(self, piece: str) -> list[str]:
        raise NotImplementedError

    def finish(self, turn: Turn) -> list[str]:
        raise NotImplementedError

    def rest(self, turn: Turn) -> str:
        """The part of the turn's content not streamed yet."""
        return turn.content[len(self.sent):] if turn.content.startswith(self.sent) else ""

    def whole(self, turn: Turn) -> list[str]:
        """Every event of an already sampled turn."""
        out = self.start(turn.prompt_tokens)
        for piece in chunks(turn.content):
            out += self.text(piece)
        return out + self.finish(turn)

    def error(self, e: ProtocolError, body: dict) -> list[str]:
        return [sse(body)]


class ChatStream(TurnStream):
    def __init__(self, adapter, req: ChatRequest, body: dict):
        super().__init__(adapter, req, body)
        self.base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk",
                     "created": int(time.time()), "model": req.model}

    def _chunk(self, delta: dict, finish=None) -> str:
        return sse({**self.base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})

    def start(self, prompt_tokens: int) -> list[str]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def text(self, piece: str) -> list[str]:
        self.sent += piece
        return [self._chunk({"content": piece})]

    def finish(self, turn: Turn) -> list[str]:
        rest = self.rest(turn)
        out = [self._chunk({"reasoning_content": turn.reasoning})] if turn.reasoning else []
        out += self.text(rest) if rest else []
        for i, c in enumerate(turn.calls):
            out.append(self._chunk({"tool_calls": [{"index": i, "id": c.id, "type": "function",
                                                    "function": {"name": c.name, "arguments": ""}}]}))
            out += [self._chunk({"tool_calls": [{"index": i, "function": {"arguments": p}}]})
                    for p in chunks(c.arguments_json)]
        out.append(self._chunk({}, turn.finish))
        opts = self.body.get("stream_options")
        if isinstance(opts, dict) and opts.get("include_usage"):
            out.append(sse({**self.base, "choices": [], "usage": self.adapter.usage(turn)}))
        return out + ["data: [DONE]\n\n"]


class MessagesStream(TurnStream):
    def __init__(self, adapter, req: ChatRequest, body: dict):
        super().__init__(adapter, req, body)
        self.open_text = False
        self.blocks = 0
        self.text_index = 0

    def _ev(self, data: dict) -> str:
        return sse(data, data["type"])

    def start(self, prompt_tokens: int) -> list[str]:
        shell = Turn("", [], "stop", prompt_tokens, 0)
        return [self._ev({"type": "message_start", "message": self.adapter.message(shell, self.req, [], None, 0)})]

    def text(self, piece: str) -> list[str]:
        out = []
        if not self.open_text:
            self.open_text, self.text_index, self.blocks = True, self.blocks, self.blocks + 1
            out.append(self._ev({"type": "content_block_start", "index": self.text_index,
                                 "content_block": {"type": "text", "text": ""}}))
        if piece:
            self.sent += piece
            out.append(self._ev({"type": "content_block_delta", "index": self.text_index,
                                 "delta": {"type": "text_delta", "text": piece}}))
        return out

    def finish(self, turn: Turn) -> list[str]:
        rest, out = self.rest(turn), []
        if turn.reasoning and not self.open_text:  # reasoning opens the turn: its block comes first
            block = self.adapter.thinking(turn)
            i, self.blocks = self.blocks, self.blocks + 1
            out += [self._ev({"type": "content_block_start", "index": i,
                              "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
                    self._ev({"type": "content_block_delta", "index": i,
                              "delta": {"type": "thinking_delta", "thinking": block["thinking"]}}),
                    self._ev({"type": "content_block_delta", "index": i,
                              "delta": {"type": "signature_delta", "signature": block["signature"]}}),
                    self._ev({"type": "content_block_stop", "index": i})]
        out += self.text(rest) if rest or (not self.open_text and not turn.calls) else []
        if self.open_text:
            out.append(self._ev({"type": "content_block_stop", "index": self.text_index}))
        for c in turn.calls:
            i, self.blocks = self.blocks, self.blocks + 1
            out.append(self._ev({"type": "content_block_start", "index": i, "content_block": {
                "type": "tool_use", "id": "toolu_" + c.id, "name": c.name, "input": {}}}))
            out += [self._ev({"type": "content_block_delta", "index": i,
                              "delta": {"type": "input_json_delta", "partial_json": p}})
                    for p in chunks(json.dumps(c.arguments, ensure_ascii=False))]
            out.append(self._ev({"type": "content_block_stop", "index": i}))
        out.append(self._ev({"type": "message_delta", "delta": {"stop_reason": self.adapter.stop_reason(turn),
                                                                "stop_sequence": turn.stop_sequence},
                             "usage": {"output_tokens": turn.completion_tokens}}))
        return out + [self._ev({"type": "message_stop"})]

    def error(self, e: ProtocolError, body: dict) -> list[str]:
        return [sse(body, "error")]


class ResponsesStream(TurnStream):
    """Responses events; ``finish`` also stores the dialogue under the response id, for
    ``previous_response_id``."""

    def __init__(self, adapter, req: ChatRequest, body: dict, history: dict[str, list[Message]]):
        super().__init__(adapter, req, body)
        self.history = history
        self.rid = adapter.new_id()
        self.seq = 0
        self.msg_id = f"msg_{self.rid}"
        self.open_text = False
        self.msg_index = 0
        self.prompt_tokens = 0

    def _ev(self, kind: str, **data) -> str:
        self.seq += 1
        return sse({"type": kind, "sequence_number": self.seq - 1, **data}, kind)

    def start(self, prompt_tokens: int) -> list[str]:
        shell = self.adapter.response(Turn("", [], "stop", prompt_tokens, 0), self.req, self.rid, "in_progress", [])
        return [self._ev("response.created", response=shell), self._ev("response.in_progress", response=shell)]

    def _part(self, text: str) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def text(self, piece: str) -> list[str]:
        out = []
        if not self.open_text:
            self.open_text = True
            item = {"type": "message", "id": self.msg_id, "status": "in_progress", "role": "assistant", "content": []}
            out += [self._ev("response.output_item.added", output_index=self.msg_index, item=item),
                    self._ev("response.content_part.added", item_id=self.msg_id, output_index=self.msg_index,
                             content_index=0, part=self._part(""))]
        if piece:
            self.sent += piece
            out.append(self._ev("response.output_text.delta", item_id=self.msg_id, output_index=self.msg_index,
                                content_index=0, delta=piece, logprobs=[]))
        return out

    def finish(self, turn: Turn) -> list[str]:
        self.history[self.rid] = list(turn.dialogue)
        final = self.adapter.reply(turn, self.req, self.rid)
        rest, out = self.rest(turn), []
        if turn.reasoning and not self.open_text:  # the reasoning item comes first
            item = final["output"][0]
            self.msg_index = 1
            out += [self._ev("response.output_item.added", output_index=0, item={**item, "status": "in_progress"}),
                    self._ev("response.output_item.done", output_index=0, item=item)]
        out += self.text(rest) if rest or (not self.open_text and not turn.calls) else []
        for k, item in enumerate(final["output"]):
            if item["type"] == "reasoning":
                continue
            if item["type"] == "message":
                text = item["content"][0]["text"]
                out += [self._ev("response.output_text.done", item_id=item["id"], output_index=k, content_index=0,
                                 text=text, logprobs=[]),
                        self._ev("response.content_part.done", item_id=item["id"], output_index=k, content_index=0,
                                 part=self._part(text))]
            else:
                out.append(self._ev("response.output_item.added", output_index=k,
                                    item={**item, "arguments": "", "status": "in_progress"}))
                out += [self._ev("response.function_call_arguments.delta", item_id=item["id"], output_index=k,
                                 delta=p) for p in chunks(item["arguments"])]
                out.append(self._ev("response.function_call_arguments.done", item_id=item["id"], output_index=k,
                                    name=item["name"], arguments=item["arguments"]))
            out.append(self._ev("response.output_item.done", output_index=k, item=item))
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return out + [self._ev(kind, response=final)]

    def error(self, e: ProtocolError, body: dict) -> list[str]:
        return [self._ev("error", code=body["error"].get("code"), message=body["error"]["message"],
                         param=body["error"].get("param"))]
