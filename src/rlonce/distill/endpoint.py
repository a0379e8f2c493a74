"""An endpoint teacher: a teacher served behind an OpenAI-compatible HTTP endpoint that returns
prompt log-probs, in the form vLLM's OpenAI server gives them (``rlonce serve`` answers the same).

Each row a group yields (``scoring_rows``: one per context with a trained turn) is one request::

    POST {base_url}/completions
    {"model": M, "prompt": [token ids...], "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}

and the reply's ``choices[0].prompt_logprobs`` holds one entry per prompt token: null for the first,
then ``{"<token id>": {"logprob": float, "rank": int, "decoded_token": str}, ...}`` — the prompt's
own token at that position always, plus the ``prompt_logprobs`` most likely others. This is vLLM's
shape: ``CompletionRequest.prompt_logprobs: int | None`` and ``CompletionResponseChoice.prompt_logprobs:
list[dict[int, Logprob] | None] | None`` (vllm/entrypoints/openai/completion/protocol.py), ``Logprob``
being ``(logprob, rank, decoded_token)`` (vllm/logprobs.py), the first prompt token's entry None
(``LogprobsProcessor.from_new_request``, vllm/v1/engine/logprobs.py); JSON writes the int keys as
strings, and a log-prob of −inf arrives as −9999.0 (``clamp_prompt_logprobs`` in vLLM's serving
code). Read in vllm-project/vllm at 002032ee. A prompt of token ids is taken as given (no special
tokens added); ``max_tokens`` 1 because vLLM samples at least one token (its text is ignored).
With ``distill.topk`` = k the request asks ``"prompt_logprobs": k``, and the k entries of highest
log-prob at each trained position are the teacher's top-k (the prompt's own token is among them
only when it ranks there).

What it cannot do, refused when the config is checked (``rlonce.rollout.sources.endpoint_refusal``):
such a server returns the model's raw log-probs over the whole vocabulary at temperature 1, so a
source sampled at another temperature or under top-p/top-k (rows with candidate sets) cannot be
scored by it, and it only scores — it samples no prefix rollouts. Its tokenizer cannot be checked
against the student's either: the endpoint must serve a model of the student's tokenizer.

The endpoint is not trusted: every reply is checked — one entry per token, the row's own token in
each scored entry, each log-prob a finite number ≤ 0, the body at most ``reply_bytes`` — and any
failure (refused connection, timeout, a non-200 status, a malformed reply) is an ``EngineError``
naming the endpoint: the group becomes an infrastructure failure, never the student's.
"""

from __future__ import annotations

import asyncio
import json
import math
import os

import httpx

from rlonce.core.records import Sequence, TrainingRow
from rlonce.distill.teachers import Scored, assign, scoring_rows
from rlonce.engine.base import EngineError


class EndpointTeacher:
    """``LocalTeacher.score`` over an endpoint: one scoring request per row, at most ``concurrency``
    in flight (across every group this teacher scores at once), each within ``timeout`` seconds."""

    def __init__(self, base_url: str, model: str, *, timeout: float, concurrency: int, api_key: str = "EMPTY",
                 topk: int = 0, vocab: int | None = None):
        self.name = self.base_url = base_url.rstrip("/")
        self.topk, self.vocab = topk, vocab
        """``vocab``: the student tokenizer's size; a top-k token id at or past it is a malformed reply."""
        self.model, self.timeout, self.concurrency, self.api_key = model, timeout, concurrency, api_key
        self._gate: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    @classmethod
    def from_config(cls, distill, url: str, *, vocab: int | None = None) -> EndpointTeacher:
        """The teacher at ``url`` with the ``[distill]`` table's model name, timeout, concurrency and
        key (read from the environment variable ``teacher_api_key_env`` names; a missing one is a
        one-line ``ConfigError`` now, not a run of failed groups)."""
        key = "EMPTY"
        if distill.teacher_api_key_env:
            key = os.environ.get(distill.teacher_api_key_env, "")
            if not key:
                from rlonce.config import ConfigError

                raise ConfigError(f"distill.teacher_api_key_env names {distill.teacher_api_key_env}, which is not set "
                                  "in the environment: export the teacher endpoint's key in it")
        return cls(url, distill.teacher_model, timeout=distill.teacher_timeout_s,
                   concurrency=distill.teacher_concurrency, api_key=key, topk=distill.topk, vocab=vocab)

    def preflight(self, ids: list[int]) -> str | None:
        """Ask the endpoint to score ``ids`` once, as a run would, before the run starts. A refusal
        (any answer but a well-formed 200: a ``prompt_logprobs`` over the server's limit, a wrong key,
        another route) is a one-line ``ConfigError`` now, not a run whose every group is an
        infrastructure failure. An endpoint that cannot be reached is not refused — it may still be
        starting, and its groups are infrastructure failures until it answers — the line saying so
        is returned for the run's log (None when the endpoint answered)."""
        from rlonce.config import ConfigError

        n = len(ids)
        row = TrainingRow(list(ids), [0] + [1] * (n - 1), [0.0] * n, [0.0] * n, [0] * n)
        body = {"model": self.model, "prompt": list(ids), "max_tokens": 1, "temperature": 1.0,
                "prompt_logprobs": self.topk}
        buf = bytearray()
        try:
            with httpx.Client(timeout=min(self.timeout, 30.0), trust_env=False) as client, client.stream(
                    "POST", f"{self.base_url}/completions", json=body,
                    headers={"authorization": f"Bearer {self.api_key}"}) as r:
                for chunk in r.iter_bytes():
                    buf += chunk
                    if len(buf) > reply_bytes(n):
                        break
        except httpx.HTTPError as e:
            return (f"teacher endpoint {self.base_url} did not answer a scoring request before the run "
                    f"({type(e).__name__}); its groups are infrastructure failures until it does")
        hint = (f"; it must serve prompt_logprobs = {self.topk} (distill.topk): lower distill.topk, or start vLLM "
                f"with --max-logprobs {self.topk} (its default is 20)" if self.topk else "")
        if r.status_code != 200:
            text = _line(buf[:300].decode("utf-8", "replace"))
            why = ("; set distill.teacher_api_key_env to the variable holding its key"
                   if r.status_code in (401, 403) else hint)
            raise ConfigError(f"teacher endpoint {self.base_url} refused a scoring request before the run: HTTP "
                              f"{r.status_code}{f' ({text})' if text else ''}{why}")
        try:
            if len(buf) > reply_bytes(n):
                raise ValueError(f"a reply over {reply_bytes(n)} bytes")
            read_reply(bytes(buf), row, self.topk, self.vocab)
        except ValueError as e:
            raise ConfigError(f"teacher endpoint {self.base_url} answered a scoring request before the run with a "
                              f"malformed reply: {e}{hint}") from None
        return None

    def _semaphore(self) -> asyncio.Semaphore:
        """This event loop's gate (a run calls ``asyncio.run`` once per phase: each loop gets its own)."""
        loop = asyncio.get_running_loop()
        if self._gate is None or self._gate[0] is not loop:
            self._gate = (loop, asyncio.Semaphore(self.concurrency))
        return self._gate[1]

    async def score(self, seqs: list[Sequence]) -> None:
        """Set ``teacher_logprobs`` on every trainable model segment of ``seqs``; ``EngineError`` when
        the endpoint fails (nothing is set then)."""
        rows, where = scoring_rows(seqs)
        if rows:
            assign(where, await self.score_rows(rows))

    async def score_rows(self, rows) -> list[Scored]:
        """Per row, the endpoint's log-prob of each trained token (0.0 at position 0 and wherever the
        loss mask is 0), and with ``topk`` its k most likely tokens there. The first failure cancels
        the row requests still in flight."""
        for r in rows:
            if r.temperature != 1.0 or r.candidates:
                raise ValueError(f"teacher {self.name} scores at temperature 1 over the whole vocabulary; a row at "
                                 f"temperature {r.temperature:g}{' with candidate sets' if r.candidates else ''} "
                                 "cannot be scored by it (rlonce.rollout.sources.endpoint_refusal refuses its source)")
        gate = self._semaphore()
        async with httpx.AsyncClient(timeout=self.timeout, trust_env=False,
                                     limits=httpx.Limits(max_connections=self.concurrency)) as client:
            tasks = [asyncio.ensure_future(self._one(client, gate, r)) for r in rows]
            try:
                out = await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        return out

    async def _one(self, client: httpx.AsyncClient, gate: asyncio.Semaphore, row) -> Scored:
        body = {"model": self.model, "prompt": list(row.token_ids), "max_tokens": 1, "temperature": 1.0,
                "prompt_logprobs": self.topk}
        async with gate:
            try:
                async with asyncio.timeout(self.timeout):
                    raw = await self._post(client, body, reply_bytes(len(row)))
            except (TimeoutError, httpx.TimeoutException):
                raise EngineError(f"teacher endpoint {self.base_url} did not score a row of {len(row)} tokens "
                                  f"within {self.timeout:g} s (distill.teacher_timeout_s)") from None
            except httpx.HTTPError as e:
                raise EngineError(f"teacher endpoint {self.base_url} is unreachable: {type(e).__name__}: "
                                  f"{_line(str(e)) or 'no detail'}") from None
        try:
            return read_reply(raw, row, self.topk, self.vocab)
        except ValueError as e:
            raise EngineError(f"teacher endpoint {self.base_url} sent a malformed reply: {e}") from None

    async def _post(self, client: httpx.AsyncClient, body: dict, limit: int) -> bytes:
        """The reply's body, read up to ``limit`` bytes; ``EngineError`` on any status but 200."""
        headers = {"authorization": f"Bearer {self.api_key}"}
        async with client.stream("POST", f"{self.base_url}/completions", json=body, headers=headers) as r:
            buf = bytearray()
            async for chunk in r.aiter_bytes():
                buf += chunk
                if len(buf) > limit:
                    raise EngineError(f"teacher endpoint {self.base_url} sent a reply over {limit} bytes")
                if r.status_code != 200 and len(buf) > 300:
                    break
        if r.status_code != 200:
            text = _line(buf[:300].decode("utf-8", "replace"))
            raise EngineError(f"teacher endpoint {self.base_url} answered HTTP {r.status_code}"
                              + (f": {text}" if text else ""))
        return bytes(buf)


def reply_bytes(tokens: int) -> int:
    """The largest scoring reply read for a row of ``tokens`` tokens (2 KiB a token, and 1 MiB)."""
    return (1 << 20) + 2048 * tokens


def read_reply(raw: bytes, row, topk: int = 0, vocab: int | None = None) -> Scored:
    """The row's teacher log-probs from a vLLM-shaped reply (``ValueError`` saying what is wrong):
    each trained token's own entry, a finite log-prob ≤ 0; 0.0 at position 0 and wherever the loss
    mask is 0 (those entries are not read). With ``topk`` = k also, per trained position, the k
    entries of highest log-prob as (token id, log-prob) pairs, each a token id below ``vocab`` and
    a finite log-prob ≤ 0 (None without)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"not JSON ({_line(str(e))[:120]})") from None
    try:
        entries = data["choices"][0]["prompt_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise ValueError("no choices[0].prompt_logprobs (does the server return prompt log-probs, as vLLM "
                         "does?)") from None
    if not isinstance(entries, list) or len(entries) != len(row):
        n = len(entries) if isinstance(entries, list) else type(entries).__name__
        raise ValueError(f"prompt_logprobs has {n} entries for a prompt of {len(row)} tokens")
    out = [0.0]
    top: list[list[tuple[int, float]]] = [[]]
    for t in range(1, len(row)):
        if not row.loss_mask[t]:
            out.append(0.0)
            top.append([])
            continue
        token = row.token_ids[t]
        entry = entries[t].get(str(token)) if isinstance(entries[t], dict) else None
        lp = entry.get("logprob") if isinstance(entry, dict) else None
        if lp is None:
            raise ValueError(f"no log-prob for prompt token {token} at position {t}")
        if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp) or lp > 0:
            raise ValueError(f"log-prob {lp!r} for prompt token {token} at position {t} is not a finite number <= 0")
        out.append(float(lp))
        if topk:
            top.append(_top(entries[t], topk, t, vocab))
    return out, (top if topk else None)


def _top(entry: dict, k: int, t: int, vocab: int | None) -> list[tuple[int, float]]:
    """The k (token id, log-prob) pairs of highest log-prob in one position's entry."""
    pairs = []
    for key, v in entry.items():
        lp = v.get("logprob") if isinstance(v, dict) else None
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) < 10
                and (vocab is None or int(key) < vocab)):
            raise ValueError(f"entry key {str(key)[:20]!r} at position {t} is not a token id of the student's "
                             "vocabulary")
        if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp) or lp > 0:
            raise ValueError(f"log-prob {lp!r} for token {key} at position {t} is not a finite number <= 0")
        pairs.append((int(key), float(lp)))
    if len(pairs) < k:
        raise ValueError(f"{len(pairs)} entries at position {t} where prompt_logprobs {k} asked for {k}")
    pairs.sort(key=lambda p: -p[1])
    return pairs[:k]


def _line(text: str) -> str:
    """The first line of ``text``, stripped and at most 200 characters (what an error message quotes)."""
    lines = text.strip().splitlines()
    return lines[0][:200] if lines else ""
