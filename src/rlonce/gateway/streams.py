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
from abc import ABC, abstractmethod
from collections.abc import Callable

from rlonce.gateway.messages import ChatRequest, Message, ProtocolError, Turn


def sse(data: dict, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return head + "data: " + json.dumps(data, ensure_ascii=False, allow_nan=False) + "\n\n"


def chunks(text: str, size: int = 24) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


class TextStream:
    """What of a turn being sampled is safe to show, as ("reasoning" | "content", piece) deltas.

    Tokens are detokenized incrementally (each token decodes a short window, as vLLM does, so
    a long turn costs linear time), and a character still incomplete in UTF-8 waits for its
    last byte. A turn that opens with the reasoning markup streams its reasoning up to the
    closing tag, then its content. Content stops at the first ``hold`` marker (tool-call markup,
    the turn end, stop sequences); a trailing part that could still become a marker, and
    trailing whitespace, wait for the next token. Both are stripped as the final reply strips
    them, so every delta is part of what the non-streamed reply says.
    """

    def __init__(self, decode: Callable[[list[int]], str], hold: tuple[str, ...],
                 reasoning: tuple[str, str] | None = None):
        self.decode = decode
        self.hold = tuple(h for h in hold if h)
        self.reasoning = reasoning
        self.ids: list[int] = []
        self.text = ""
        self._prefix = self._read = 0
        self.mode: str | None = None
        """None until the turn's opening shows whether it reasons; then "reasoning" or "content"."""
        self._start = 0  # where the current part begins in ``text``
        self._cut: int | None = None  # where content ends at a marker
        self._scanned = 0  # how far ``text`` was searched for markers
        self._from: dict[str, int] = {}  # per kind, where the next piece starts in ``text``
        self.sent = {"reasoning": "", "content": ""}

    def _detokenize(self, token: int) -> None:
        self.ids.append(token)
        before = self.decode(self.ids[self._prefix:self._read])
        after = self.decode(self.ids[self._prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before):]
            self._prefix, self._read = self._read, len(self.ids)

    def push(self, token: int) -> list[tuple[str, str]]:
        self._detokenize(token)
        out: list[tuple[str, str]] = []
        if self.mode is None:
            head = self.text.lstrip()
            opening = self.reasoning[0] if self.reasoning else None
            if opening and head and opening.startswith(head[:len(opening)]):
                if len(head) < len(opening):
                    return out  # may still become the reasoning tag
                self.mode, self._start = "reasoning", len(self.text) - len(head) + len(opening)
            elif head:
                self.mode = "content"
            else:
                return out
        if self.mode == "reasoning":
            closing = self.reasoning[1]
            at = self.text.find(closing, self._start)
            piece = self._visible("reasoning", self._start, len(self.text) if at < 0 else at, (closing,))
            if piece:
                out.append(("reasoning", piece))
            if at < 0:
                return out
            self.mode, self._start = "content", at + len(closing)
        if self._cut is None:
            found = [i for i in (self.text.find(h, max(self._start, self._scanned - len(h))) for h in self.hold)
                     if i >= 0]
            self._cut = min(found) if found else None
            self._scanned = len(self.text)
        piece = self._visible("content", self._start, len(self.text) if self._cut is None else self._cut,
                              () if self._cut is not None else self.hold)
        if piece:
            out.append(("content", piece))
        return out

    def _visible(self, kind: str, start: int, end: int, holds: tuple[str, ...]) -> str:
        """What is new in ``text[start:end]`` stripped, less a tail that may begin a marker (by
        index: nothing is copied but the new piece)."""
        t = self.text
        for h in holds:
            for k in range(min(len(h) - 1, end - start), 0, -1):
                if t.endswith(h[:k], start, end):
                    end -= k
                    break
        while end > start and t[end - 1].isspace():
            end -= 1
        if kind not in self._from:
            i = start
            while i < end and t[i].isspace():
                i += 1
            if i == end:
                return ""
            self._from[kind] = i
        if end <= self._from[kind]:
            return ""
        piece, self._from[kind] = t[self._from[kind]:end], end
        self.sent[kind] += piece
        return piece


class TurnStream(ABC):
    """One streamed reply, in one protocol's events (the subclasses below). ``sent`` and
    ``sent_reasoning`` are what was emitted so far."""

    def __init__(self, adapter, req: ChatRequest, body: dict):
        self.adapter, self.req, self.body = adapter, req, body
        self.sent = ""
        self.sent_reasoning = ""

    @abstractmethod
    def start(self, prompt_tokens: int) -> list[str]:
        """The events for it."""

    @abstractmethod
    def text(self, piece: str) -> list[str]:
        """The events for it."""

    @abstractmethod
    def thinking(self, piece: str) -> list[str]:
        """The events for it."""

    def delta(self, kind: str, piece: str) -> list[str]:
        return self.thinking(piece) if kind == "reasoning" else self.text(piece)

    def record(self, turn: Turn) -> None:  # noqa: B027 - most protocols keep nothing per response
        """Called with the committed turn while the session is still held (before ``finish``)."""

    @abstractmethod
    def finish(self, turn: Turn) -> list[str]:
        """The events for it."""

    def rest(self, turn: Turn) -> str:
        """The part of the turn's content not streamed yet."""
        return turn.content[len(self.sent):] if turn.content.startswith(self.sent) else ""

    def rest_reasoning(self, turn: Turn) -> str:
        r = turn.reasoning
        return r[len(self.sent_reasoning):] if r.startswith(self.sent_reasoning) else ""

    def whole(self, turn: Turn) -> list[str]:
        """Every event of an already sampled turn."""
        self.record(turn)
        out = self.start(turn.prompt_tokens)
        for piece in chunks(turn.reasoning):
            out += self.thinking(piece)
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

    def _chunk(self, delta: dict, finish=None, logprobs: dict | None = None) -> str:
        return sse({**self.base, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs,
                                              "finish_reason": finish}]})

    def start(self, prompt_tokens: int) -> list[str]:
        return [self._chunk({"role": "assistant"})]  # content stays null unless text comes, as in the reply

    def text(self, piece: str) -> list[str]:
        self.sent += piece
        return [self._chunk({"content": piece})]

    def thinking(self, piece: str) -> list[str]:
        self.sent_reasoning += piece
        return [self._chunk({"reasoning_content": piece})]

    def finish(self, turn: Turn) -> list[str]:
        rest, thought = self.rest(turn), self.rest_reasoning(turn)
        out = self.thinking(thought) if thought else []
        out += self.text(rest) if rest else []
        for i, c in enumerate(turn.calls):
            out.append(self._chunk({"tool_calls": [{"index": i, "id": c.id, "type": "function",
                                                    "function": {"name": c.name, "arguments": ""}}]}))
            out += [self._chunk({"tool_calls": [{"index": i, "function": {"arguments": p}}]})
                    for p in chunks(c.arguments_json)]
        out.append(self._chunk({}, self.adapter.finish_reason(turn, self.req),  # known once the turn is sampled
                               self.adapter.logprobs(turn)))
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
        self.open_thinking: int | None = None
        self.thinking_closed = False

    def _ev(self, data: dict) -> str:
        return sse(data, data["type"])

    def start(self, prompt_tokens: int) -> list[str]:
        shell = Turn("", [], "stop", prompt_tokens, 0)
        return [self._ev({"type": "message_start", "message": self.adapter.message(shell, self.req, [], None, 0)})]

    def thinking(self, piece: str) -> list[str]:
        out = []
        if self.open_thinking is None:
            self.open_thinking, self.blocks = self.blocks, self.blocks + 1
            out.append(self._ev({"type": "content_block_start", "index": self.open_thinking,
                                 "content_block": {"type": "thinking", "thinking": "", "signature": ""}}))
        self.sent_reasoning += piece
        return out + [self._ev({"type": "content_block_delta", "index": self.open_thinking,
                                "delta": {"type": "thinking_delta", "thinking": piece}})]

    def _close_thinking(self) -> list[str]:
        """The thinking block's signature and end, once the reasoning is whole."""
        if self.open_thinking is None or self.thinking_closed:
            return []
        self.thinking_closed = True
        sig = self.adapter.thinking(Turn("", [], "stop", 0, 0, reasoning=self.sent_reasoning))["signature"]
        return [self._ev({"type": "content_block_delta", "index": self.open_thinking,
                          "delta": {"type": "signature_delta", "signature": sig}}),
                self._ev({"type": "content_block_stop", "index": self.open_thinking})]

    def text(self, piece: str) -> list[str]:
        out = self._close_thinking()
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
        rest, thought, out = self.rest(turn), self.rest_reasoning(turn), []
        if thought and not self.open_text:
            out += self.thinking(thought)
        out += self._close_thinking()
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
                             "usage": self.adapter.usage(turn.prompt_tokens, turn.completion_tokens)}))
        return out + [self._ev({"type": "message_stop"})]

    def error(self, e: ProtocolError, body: dict) -> list[str]:
        return [sse(body, "error")]


class ResponsesStream(TurnStream):
    """Responses events; ``record`` stores the dialogue under the response id, for
    ``previous_response_id``."""

    def __init__(self, adapter, req: ChatRequest, body: dict, history: dict[str, list[Message]]):
        super().__init__(adapter, req, body)
        self.history = history
        self.rid = adapter.new_id()
        self.seq = 0
        self.msg_id = f"msg_{self.rid}"
        self.open_text = False
        self.msg_index = 0
        self.open_thinking = False
        self.thinking_closed = False

    def _ev(self, kind: str, **data) -> str:
        self.seq += 1
        return sse({"type": kind, "sequence_number": self.seq - 1, **data}, kind)

    def start(self, prompt_tokens: int) -> list[str]:
        shell = self.adapter.response(Turn("", [], "stop", prompt_tokens, 0), self.req, self.rid, "in_progress", [])
        return [self._ev("response.created", response=shell), self._ev("response.in_progress", response=shell)]

    def _reasoning_item(self, status: str) -> dict:
        content = [{"type": "reasoning_text", "text": self.sent_reasoning}] if status == "completed" else []
        return {"type": "reasoning", "id": f"rs_{self.rid}", "summary": [], "status": status, "content": content}

    def thinking(self, piece: str) -> list[str]:
        out = []
        if not self.open_thinking:
            self.open_thinking, self.msg_index = True, 1
            out.append(self._ev("response.output_item.added", output_index=0,
                                item=self._reasoning_item("in_progress")))
        self.sent_reasoning += piece
        return out + [self._ev("response.reasoning_text.delta", item_id=f"rs_{self.rid}", output_index=0,
                               content_index=0, delta=piece)]

    def _close_thinking(self, status: str = "completed") -> list[str]:
        if not self.open_thinking or self.thinking_closed:
            return []
        self.thinking_closed = True
        item = {**self._reasoning_item("completed"), "status": status}
        return [self._ev("response.reasoning_text.done", item_id=f"rs_{self.rid}", output_index=0, content_index=0,
                         text=self.sent_reasoning),
                self._ev("response.output_item.done", output_index=0, item=item)]

    def record(self, turn: Turn) -> None:
        self.adapter.keep(self.rid, turn, self.body, self.history)

    def text(self, piece: str) -> list[str]:
        out = self._close_thinking()
        if not self.open_text:
            self.open_text = True
            item = {"type": "message", "id": self.msg_id, "status": "in_progress", "role": "assistant", "content": []}
            out += [self._ev("response.output_item.added", output_index=self.msg_index, item=item),
                    self._ev("response.content_part.added", item_id=self.msg_id, output_index=self.msg_index,
                             content_index=0, part=self.adapter.output_text(""))]
        if piece:
            self.sent += piece
            out.append(self._ev("response.output_text.delta", item_id=self.msg_id, output_index=self.msg_index,
                                content_index=0, delta=piece, logprobs=[]))
        return out

    def finish(self, turn: Turn) -> list[str]:
        final = self.adapter.reply(turn, self.req, self.rid)
        rest, thought, out = self.rest(turn), self.rest_reasoning(turn), []
        if thought and not self.open_text:  # the reasoning item comes first
            out += self.thinking(thought)
        first = final["output"][0] if final["output"] else {}
        out += self._close_thinking(first["status"] if first.get("type") == "reasoning" else "completed")
        out += self.text(rest) if rest or (not self.open_text and not turn.calls) else []
        for k, item in enumerate(final["output"]):
            if item["type"] == "reasoning":
                continue
            if item["type"] == "message":
                part = item["content"][0]
                out += [self._ev("response.output_text.done", item_id=item["id"], output_index=k, content_index=0,
                                 text=part["text"], logprobs=part["logprobs"]),
                        self._ev("response.content_part.done", item_id=item["id"], output_index=k, content_index=0,
                                 part=part)]
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
