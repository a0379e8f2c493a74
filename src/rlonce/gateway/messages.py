"""The gateway's protocol-neutral conversation: what every wire protocol is translated into.

OpenAI Chat Completions, Anthropic Messages and OpenAI Responses all describe the same thing —
a system prompt, user turns, assistant turns that may call tools, tool results — in three
shapes. The adapters in ``rlonce.gateway.protocols`` turn a request into a ``ChatRequest`` of
``Message``s and a ``Turn`` back into the protocol's reply; the session only ever compares and
encodes ``Message``s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from rlonce.model.chat import ToolCall


class ProtocolError(ValueError):
    """A request the gateway refuses; rendered as a 4xx in the protocol's own error shape."""

    def __init__(self, message: str, *, status: int = 400, kind: str = "invalid_request_error",
                 param: str | None = None):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.param = param


@dataclass(frozen=True)
class Message:
    """One message of a dialogue. ``role`` is system, user, assistant or tool."""

    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    def same_as(self, other: Message) -> bool:
        """Equal for prefix matching: ids and surrounding whitespace do not count, arguments
        compare as JSON values (clients re-serialise them with their own spacing)."""
        return (self.role == other.role and self.content.strip() == other.content.strip()
                and [(c.name, c.arguments) for c in self.tool_calls]
                == [(c.name, c.arguments) for c in other.tool_calls])


@dataclass
class ChatRequest:
    messages: list[Message]
    tools: list[dict] = field(default_factory=list)
    """Function tools as ``{"name", "description", "parameters"}``."""
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    model: str = ""


@dataclass
class CallOut:
    """A tool call as returned to the client, with the id the gateway gave it."""

    id: str
    name: str
    arguments: dict

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass
class Turn:
    """One sampled assistant turn as the client sees it."""

    content: str
    calls: list[CallOut]
    finish: str
    """'stop', 'tool_calls' or 'length' (the token cap, or a trajectory budget, ended it)."""
    prompt_tokens: int
    completion_tokens: int
    session_id: str = ""
    turn_index: int = 0


def parse_arguments(raw, where: str) -> dict:
    """Tool-call arguments arrive as a JSON string (OpenAI) or an object (Anthropic)."""
    if isinstance(raw, dict):
        return raw
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise ProtocolError(f"{where}: arguments are not valid JSON", param=where) from None
        if isinstance(value, dict):
            return value
    raise ProtocolError(f"{where}: arguments must be a JSON object", param=where)


def text_of(content, where: str) -> str:
    """A message's text: a string, or a list of text parts (``text``/``input_text``/``output_text``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, p in enumerate(content):
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append(p["text"])
            elif isinstance(p, dict) and isinstance(p.get("type"), str):
                continue  # images, files, thinking: not rendered by a text-only chat template
            else:
                raise ProtocolError(f"{where}[{i}] is not a content part", param=where)
        return "".join(parts)
    raise ProtocolError(f"{where} must be a string or a list of content parts", param=where)
