"""Wire-protocol clients: a harness's conversation kept in the protocol's own shape.

Each client holds the dialogue as its protocol does — Chat Completions messages, Anthropic
content blocks, Responses items chained by ``previous_response_id`` — and sends it through a
transport: ``Gateway.call`` in-process, or HTTP (``http_transport``). The gateway sees
exactly what an outside agent speaking that protocol would send.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

Send = Callable[[str, dict], Awaitable[dict]]


@dataclass
class Reply:
    text: str
    calls: list[tuple[str, str, dict]]
    """(call id, tool name, arguments)"""
    truncated: bool
    context_tokens: int
    """Prompt plus completion tokens of this turn: how full the context is."""


class Client(Protocol):
    """The harness/client contract: what the agent loop (``harness.loop.run_episode``) asks of a
    wire-protocol client. ``CLIENTS[protocol](send, system, user, tools)`` builds one."""

    protocol: str

    async def ask(self) -> Reply:
        """Send the conversation so far; the model's reply, its tool calls parsed."""

    def give(self, results: list[tuple[str, str]]) -> None:
        """Append the tool results, as ``(call id, output)``, for the next ``ask``."""

    def restart(self, user: str) -> None:
        """Start over from the system prompt and ``user`` (compaction)."""

    def say(self, user: str) -> None:
        """Append a user message (the harness's answer to a turn without a usable tool call)."""


class ChatClient:
    protocol = "openai-chat"

    def __init__(self, send: Send, system: str, user: str, tools: list[dict]):
        self.send = send
        self.system = system
        self.tools = [{"type": "function", "function": t} for t in tools]
        self.restart(user)

    def restart(self, user: str) -> None:
        """Start over from the system prompt and ``user`` (compaction)."""
        self.messages: list[dict] = [{"role": "system", "content": self.system}, {"role": "user", "content": user}]

    async def ask(self) -> Reply:
        r = await self.send(self.protocol, {"model": "policy", "messages": self.messages, "tools": self.tools})
        choice = r["choices"][0]
        msg = choice["message"]
        self.messages.append(msg)
        calls = [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                 for c in msg.get("tool_calls") or []]
        u = r["usage"]
        return Reply(msg.get("content") or "", calls, choice["finish_reason"] == "length",
                     u["prompt_tokens"] + u["completion_tokens"])

    def give(self, results: list[tuple[str, str]]) -> None:
        self.messages += [{"role": "tool", "tool_call_id": cid, "content": text} for cid, text in results]

    def say(self, user: str) -> None:
        self.messages.append({"role": "user", "content": user})


class AnthropicClient:
    protocol = "anthropic-messages"

    def __init__(self, send: Send, system: str, user: str, tools: list[dict]):
        self.send = send
        self.system = system
        self.tools = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                      for t in tools]
        self.restart(user)

    def restart(self, user: str) -> None:
        self.messages: list[dict] = [{"role": "user", "content": user}]

    async def ask(self) -> Reply:
        r = await self.send(self.protocol, {"model": "policy", "max_tokens": 4096, "system": self.system,
                                            "messages": self.messages, "tools": self.tools})
        self.messages.append({"role": "assistant", "content": r["content"]})
        text = "".join(b["text"] for b in r["content"] if b["type"] == "text")
        calls = [(b["id"], b["name"], b["input"]) for b in r["content"] if b["type"] == "tool_use"]
        u = r["usage"]
        return Reply(text, calls, r["stop_reason"] == "max_tokens", u["input_tokens"] + u["output_tokens"])

    def give(self, results: list[tuple[str, str]]) -> None:
        self.messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": cid, "content": text} for cid, text in results]})

    def say(self, user: str) -> None:
        self.messages.append({"role": "user", "content": user})


class ResponsesClient:
    """Stateful on the server side: each request sends only new items and the previous response id."""

    protocol = "openai-responses"

    def __init__(self, send: Send, system: str, user: str, tools: list[dict]):
        self.send = send
        self.system = system
        self.tools = [{"type": "function", **t} for t in tools]
        self.restart(user)

    def restart(self, user: str) -> None:
        self.previous: str | None = None
        self.pending: list[dict] = [{"role": "user", "content": user}]

    async def ask(self) -> Reply:
        body = {"model": "policy", "instructions": self.system, "input": self.pending, "tools": self.tools}
        if self.previous:
            body["previous_response_id"] = self.previous
        r = await self.send(self.protocol, body)
        self.previous, self.pending = r["id"], []
        text = "".join(p["text"] for it in r["output"] if it["type"] == "message" for p in it["content"]
                       if p["type"] == "output_text")
        calls = [(it["call_id"], it["name"], json.loads(it["arguments"])) for it in r["output"]
                 if it["type"] == "function_call"]
        u = r["usage"]
        return Reply(text, calls, r["status"] == "incomplete", u["input_tokens"] + u["output_tokens"])

    def give(self, results: list[tuple[str, str]]) -> None:
        self.pending += [{"type": "function_call_output", "call_id": cid, "output": text} for cid, text in results]

    def say(self, user: str) -> None:
        self.pending.append({"role": "user", "content": user})


CLIENTS: dict[str, type[Client]] = {c.protocol: c for c in (ChatClient, AnthropicClient, ResponsesClient)}


def http_transport(base_url: str, api_key: str, *, timeout: float = 600.0) -> Send:
    """A transport over HTTP to a gateway (or any server speaking the protocols)."""
    import httpx

    paths = {"openai-chat": "/v1/chat/completions", "anthropic-messages": "/v1/messages",
             "openai-responses": "/v1/responses"}

    async def send(protocol: str, body: dict) -> dict:
        async with httpx.AsyncClient(timeout=timeout) as c:
            r = await c.post(base_url.rstrip("/") + paths[protocol], json=body,
                             headers={"authorization": f"Bearer {api_key}"})
            r.raise_for_status()
            return r.json()

    return send
