"""Judges: a model asked for a structured verdict, behind an endpoint or a script.

A judge takes a prompt and a pydantic schema and returns a ``Verdict``: the validated object, or
none with the reason in one word (``FAILURES``). It never raises for what the endpoint does —
down, slow, an error status, text that is not JSON, JSON that is not the schema — because a
judge that fails must cost the run a fallback, never a step and never a model failure (DESIGN.md,
"Grader"). Every call is appended to a JSON-lines record (prompt, reply, verdict, outcome,
latency, tokens; never a key), answers are cached by (model, prompt, sample, images) and at most
``concurrency`` calls are in flight.

A question may carry images — (label, PNG bytes), e.g. a page's screenshot — sent after the text
as the protocol's native image parts, each preceded by a text part naming its label. The record
keeps each image's label, sha256 and size, never its bytes.

``EndpointJudge`` speaks the OpenAI Chat Completions protocol (``{base_url}/chat/completions``,
the OpenAI SDK's convention: ``base_url`` ends in ``/v1``) or Anthropic's Messages protocol
(``{base_url}/v1/messages``, the Anthropic SDK's); the key is read from an environment variable
named in the config. ``{call}`` in ``base_url`` becomes a fresh id per call — ``rlonce serve``
names a session by its path, so concurrent calls need one each. Every request asks for the
question's schema in the protocol's own shape (``rlonce.grading.structure``: OpenAI
``response_format``, an Anthropic forced tool whose input is the verdict); an endpoint that refuses
structured output is asked once more without it, and the call is counted ``unstructured`` (a mode,
not a failure: its verdict is used when it parses). ``ScriptedJudge`` answers from a Python
function: the deterministic judge of tests and CPU runs.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import hashlib
import inspect
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ValidationError

from rlonce.errors import RlonceError
from rlonce.grading.structure import answer_tool, refuses_structure, response_format

FAILURES = ("down", "timeout", "http_error", "non_json", "invalid")
"""Why a call gave no verdict: the endpoint refused connections, did not answer in time, answered
with an error status, answered with no JSON object, or with one that is not the schema."""
RECORD_CHARS = 20_000
"""Prompt and reply characters kept per call in the record."""
Image = tuple[str, bytes]
"""An image shown to a judge: its label (named in the prompt) and its PNG (or JPEG) bytes."""
SYSTEM = ("You are a careful grader. Read the material, then answer with exactly one JSON object that "
          "follows the requested schema. Write nothing before or after the JSON object.")


def image_facts(images: Sequence[Image]) -> list[dict]:
    """What the record and the cache key hold of ``images``: label, sha256, byte size."""
    return [{"label": label, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
            for label, data in images]


def media_type(data: bytes) -> str:
    """The image's MIME type from its magic bytes (PNG unless it says JPEG, GIF or WebP)."""
    if data[:3] == b"\xff\xd8\xff":
        return "image/jpeg"
    if data[:4] == b"GIF8":
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return "image/png"


class JudgeFailed(RlonceError):
    """A call gave no usable reply; ``category`` is one of ``FAILURES``; an error status's ``status``
    and body (``detail``) when the endpoint answered with one."""

    def __init__(self, category: str, message: str, *, status: int = 0, detail: str = ""):
        super().__init__(message)
        self.category, self.status, self.detail = category, status, detail


@dataclass
class Completion:
    """A judge's reply to one request: its text and token counts."""

    text: str
    tokens_in: int = 0
    tokens_out: int = 0
    structured: bool | None = None
    """Asked for the schema and not refused (True), asked again without it after a refusal (False);
    None where no endpoint was asked (a script)."""


@dataclass
class Verdict:
    value: BaseModel | None
    outcome: str
    """'ok' or one of ``FAILURES``."""
    seconds: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0
    cached: bool = False
    structured: bool | None = None
    """As ``Completion.structured``, for the attempt that gave this verdict or failure."""

    @property
    def ok(self) -> bool:
        return self.value is not None


def parse_verdict(text: str, schema: type[BaseModel]) -> BaseModel:
    """The first JSON object in ``text`` that validates as ``schema`` (models wrap JSON in prose and
    code fences); ``JudgeFailed('non_json')`` when there is no JSON object, ``'invalid'`` when
    none validates."""
    decoder, seen, error = json.JSONDecoder(), False, ""
    i = text.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except (ValueError, RecursionError):  # a reply nested past the parser's depth is no verdict
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict):
            seen = True
            try:
                return schema.model_validate(obj)
            except ValidationError as e:
                error = str(e).splitlines()[0] if str(e) else "schema mismatch"
        i = text.find("{", end)
    if not seen:
        raise JudgeFailed("non_json", f"no JSON object in the reply ({len(text)} chars)")
    raise JudgeFailed("invalid", f"no JSON object in the reply is a {schema.__name__}: {error}")


class Judge(abc.ABC):
    """What every judge shares: cache, concurrency limit, retries, the record, the counts; a
    subclass says how a question is answered (``complete``)."""

    def __init__(self, name: str, model: str, *, retries: int = 1, timeout: float = 60.0, concurrency: int = 4,
                 record: Path | None = None):
        self.name, self.model = name, model
        self.retries, self.timeout = retries, timeout
        self.limit = asyncio.Semaphore(concurrency)
        self.record = record
        self.cache: dict[str, Verdict] = {}
        self.counts: Counter = Counter()
        """calls, cached, ok and each failure, tokens_in, tokens_out, seconds (since ``take_counts``)."""

    @abc.abstractmethod
    async def complete(self, prompt: str, sample: int, kind: str, images: Sequence[Image] = (),
                       schema: type[BaseModel] | None = None) -> Completion:
        """The model's reply to ``prompt`` (a question of ``kind``, showing ``images``, answered as
        ``schema``); raises ``JudgeFailed`` with the transport's category."""

    async def ask(self, prompt: str, schema: type[BaseModel], *, kind: str, sample: int = 0, task=None,
                  files: dict[str, str] | None = None, images: Sequence[Image] = ()) -> Verdict:
        """A verdict of ``schema`` on ``prompt``; ``sample`` > 0 asks again as an independent draw
        (the agreement check), cached under its own key. ``task`` and ``files`` are the workspace
        an agentic grader works in (``rlonce.grading.agentic``); a plain judge sees the prompt and
        ``images`` — (label, bytes) pairs, part of the cache key by their sha256."""
        images = tuple(images)
        shown = image_facts(images)
        seen = "".join(f"\0{x['label']}\0{x['sha256']}" for x in shown)
        key = hashlib.sha256(f"{self.model}\0{schema.__name__}\0{sample}\0{prompt}{seen}".encode()).hexdigest()
        if key in self.cache:
            self.counts["cached"] += 1
            hit = self.cache[key]
            return Verdict(hit.value, hit.outcome, cached=True)
        async with self.limit:
            v, text = await self._attempts(prompt, schema, sample, kind, images)
        self.counts.update({"calls": 1, v.outcome: 1, "tokens_in": v.tokens_in, "tokens_out": v.tokens_out})
        self.counts["seconds"] += v.seconds
        if v.structured is False:
            self.counts["unstructured"] += 1
        if v.ok:
            self.cache[key] = v
        self._write(kind, prompt, text, v, sample, shown)
        return v

    async def _attempts(self, prompt: str, schema: type[BaseModel], sample: int, kind: str,
                        images: tuple[Image, ...] = ()) -> tuple[Verdict, str]:
        t0, outcome, text, tin, tout, structured = time.perf_counter(), "down", "", 0, 0, None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(0.25 * 2 ** attempt, 4.0))
            try:
                c = await asyncio.wait_for(self.complete(prompt, sample * 1000 + attempt, kind, images, schema),
                                           self.timeout)
                text, structured, tin, tout = c.text, c.structured, tin + c.tokens_in, tout + c.tokens_out
                value = parse_verdict(text, schema)
                return Verdict(value, "ok", time.perf_counter() - t0, tin, tout, structured=structured), text
            except asyncio.TimeoutError:
                outcome = "timeout"
            except JudgeFailed as e:
                outcome, text = e.category, text or str(e)
        return Verdict(None, outcome, time.perf_counter() - t0, tin, tout, structured=structured), text

    def _write(self, kind: str, prompt: str, text: str, v: Verdict, sample: int, images: list[dict] = ()) -> None:
        if self.record is None:
            return
        self.record.parent.mkdir(parents=True, exist_ok=True)
        line = {"time": time.time(), "judge": self.name, "model": self.model, "kind": kind, "sample": sample,
                "outcome": v.outcome, "seconds": round(v.seconds, 4), "tokens_in": v.tokens_in,
                "tokens_out": v.tokens_out, "verdict": v.value.model_dump() if v.value is not None else None,
                "prompt": prompt[:RECORD_CHARS], "reply": text[:RECORD_CHARS]}
        if v.structured is not None:
            line["structured"] = v.structured
        if images:
            line["images"] = list(images)
        with self.record.open("a") as f:
            f.write(json.dumps(line) + "\n")

    def take_counts(self) -> dict[str, float]:
        """The counts since the last call, as ``judge_*`` metrics; then zero them."""
        out = {f"judge_{k}": float(v) for k, v in self.counts.items()}
        self.counts = Counter()
        return out


def _takes(script: Callable, name: str) -> bool:
    try:
        params = inspect.signature(script).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


class ScriptedJudge(Judge):
    """Answers with ``script(kind, prompt, sample)``: text, parsed like any model's reply; a script
    that takes an ``images`` keyword also gets the question's (label, bytes) pairs, one that takes
    ``schema`` the pydantic schema asked for. Deterministic, for tests and for runs that exercise
    the grading path without a model."""

    def __init__(self, script: Callable[..., str | Awaitable[str]], **kw):
        super().__init__(kw.pop("name", "scripted"), kw.pop("model", "scripted"), **kw)
        self.script = script
        self.sees_images, self.sees_schema = _takes(script, "images"), _takes(script, "schema")

    async def complete(self, prompt: str, sample: int, kind: str, images: Sequence[Image] = (),
                       schema: type[BaseModel] | None = None) -> Completion:
        extra = {**({"images": list(images)} if self.sees_images else {}),
                 **({"schema": schema} if self.sees_schema else {})}
        out = self.script(kind, prompt, sample, **extra)
        text = await out if asyncio.iscoroutine(out) else out
        return Completion(text, len(prompt.split()), len(text.split()))


def user_content(prompt: str, images: Sequence[Image], protocol: str) -> str | list[dict]:
    """The user message's content: the prompt alone, or with images the prompt's text part and,
    per image, a text part naming its label and the image as ``protocol``'s base64 part."""
    if not images:
        return prompt
    parts: list[dict] = [{"type": "text", "text": prompt}]
    for label, data in images:
        b64, mime = base64.b64encode(data).decode("ascii"), media_type(data)
        parts.append({"type": "text", "text": f"Image {label}:"})
        parts.append({"type": "image", "source": {"type": "base64", "media_type": mime, "data": b64}}
                     if protocol == "anthropic"
                     else {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{b64}"}})
    return parts


class EndpointJudge(Judge):
    """A model behind an OpenAI-compatible or Anthropic endpoint."""

    def __init__(self, base_url: str, model: str, *, protocol: str = "openai", api_key_env: str = "",
                 max_tokens: int = 512, temperature: float = 0.0, **kw):
        if protocol not in ("openai", "anthropic"):
            raise ValueError(f"unknown judge protocol {protocol!r}: use 'openai' or 'anthropic'")
        super().__init__(kw.pop("name", model), model, **kw)
        self.base_url, self.protocol = base_url.rstrip("/"), protocol
        self.api_key_env, self.max_tokens, self.temperature = api_key_env, max_tokens, temperature

    def _key(self) -> str:
        if not self.api_key_env:
            return "rlonce-judge"
        key = os.environ.get(self.api_key_env)
        if not key:
            raise JudgeFailed("down", f"the judge's key variable {self.api_key_env} is not set in the environment")
        return key

    def _url(self, protocol: str) -> str:
        base = self.base_url.replace("{call}", uuid.uuid4().hex)
        return base + ("/v1/messages" if protocol == "anthropic-messages" else "/chat/completions")

    async def send(self, protocol: str, body: dict) -> dict:
        """One request of wire protocol ``protocol`` ('openai-chat' or 'anthropic-messages') with
        this judge's model and key: the reply body. What an agentic grader's client sends through."""
        import httpx

        key = self._key()
        headers = ({"x-api-key": key, "anthropic-version": "2023-06-01"} if protocol == "anthropic-messages"
                   else {"authorization": f"Bearer {key}"})
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as c:
                r = await c.post(self._url(protocol), json={**body, "model": self.model}, headers=headers)
        except httpx.TimeoutException as e:
            raise JudgeFailed("timeout", f"the judge at {self.base_url} did not answer: {e!r}") from None
        except httpx.HTTPError as e:
            raise JudgeFailed("down", f"the judge at {self.base_url} is unreachable: {e!r}") from None
        if r.status_code >= 400:
            raise JudgeFailed("http_error", f"the judge answered {r.status_code}: {r.text[:200]}",
                              status=r.status_code, detail=r.text[:4000])
        try:
            out = r.json()
        except ValueError:
            raise JudgeFailed("http_error", f"the judge's reply body is not JSON: {r.text[:200]!r}") from None
        if not isinstance(out, dict):
            raise JudgeFailed("http_error", "the judge's reply body is not a JSON object")
        return out

    async def complete(self, prompt: str, sample: int, kind: str, images: Sequence[Image] = (),
                       schema: type[BaseModel] | None = None) -> Completion:
        """The reply to a request asking for ``schema``; when the endpoint refuses structured
        output (``refuses_structure``), the reply to the same request without it."""
        content = user_content(prompt, images, self.protocol)
        if schema is None:
            return await self._request(content, sample, None)
        try:
            return await self._request(content, sample, schema)
        except JudgeFailed as e:
            if not refuses_structure(e.status, e.detail):
                raise
        plain = await self._request(content, sample, None)
        plain.structured = False
        return plain

    async def _request(self, content: str | list[dict], sample: int, schema: type[BaseModel] | None) -> Completion:
        asked = True if schema is not None else None
        if self.protocol == "anthropic":
            body = {"max_tokens": self.max_tokens, "temperature": self.temperature, "system": SYSTEM,
                    "messages": [{"role": "user", "content": content}]}
            if schema is not None:
                body |= {"tools": [answer_tool(schema)], "tool_choice": {"type": "tool", "name": schema.__name__}}
            out = await self.send("anthropic-messages", body)
            try:
                blocks = out["content"]
                used = [b["input"] for b in blocks if b.get("type") == "tool_use"]
                text = (json.dumps(used[0]) if used
                        else "".join(b.get("text", "") for b in blocks if b.get("type") == "text"))
                usage = out.get("usage") or {}
                return Completion(text, int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0)), asked)
            except (KeyError, TypeError, AttributeError, ValueError):
                raise JudgeFailed("http_error", "the reply is not an Anthropic message") from None
        body = {"max_tokens": self.max_tokens, "temperature": self.temperature, "seed": sample,
                "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]}
        if schema is not None:
            body["response_format"] = response_format(schema)
        out = await self.send("openai-chat", body)
        try:
            msg = out["choices"][0]["message"]
            text = msg.get("content") or msg.get("refusal") or ""
            usage = out.get("usage") or {}
            return Completion(text, int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)), asked)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError):
            raise JudgeFailed("http_error", "the reply is not a chat completion") from None
