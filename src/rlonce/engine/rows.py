"""The torch engine's batch: requests, the rows they become, and the running batch's cache."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache

from rlonce.engine import kvcache
from rlonce.engine.base import Generation, SamplingParams, Watch
from rlonce.engine.fast import solo


@dataclass
class Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    watch: Watch | None = None
    t_arrive: float = field(default_factory=time.monotonic)
    matcher: object = None
    """The grammar matcher of a constrained request (``rlonce.engine.constrain``), made on the
    engine's thread when the request is admitted."""

    @property
    def gone(self) -> bool:
        return self.loop.is_closed() or self.future.cancelled()

    def answer(self, value) -> None:
        """Hand ``value`` to the caller's loop — unless that loop has closed (a cancelled rollout)."""
        self._deliver(_set_result, value)

    def fail(self, exc: BaseException) -> None:
        self._deliver(_set_exception, exc)

    def _deliver(self, fn, value) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, self.future, value)
        except RuntimeError:  # the event loop is closed: nobody is waiting for this answer
            pass


def _set_result(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def left_pad(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prompts as one right-aligned batch: token ids, attention mask and positions, each (B, L)."""
    lens = [len(p) for p in prompts]
    B, L = len(prompts), max(lens)
    ids_BL = torch.full((B, L), pad, dtype=torch.long)
    attn_BL = torch.zeros((B, L), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids_BL[i, L - lens[i]:] = torch.tensor(p)
        attn_BL[i, L - lens[i]:] = 1
    return ids_BL, attn_BL, (attn_BL.cumsum(-1) - 1).clamp(min=0)


class Uniforms:
    """A seeded row's own stream of float64 uniforms, one per draw: taken from its generator
    ``block`` at a time, which gives the same numbers in the same order as one at a time (torch's
    CPU generator fills a tensor element by element; ``tests/integration/test_engine.py``), for
    one ``torch.rand`` call per 64 tokens instead of one per token."""

    block = 64

    def __init__(self, seed: int):
        self.gen = torch.Generator().manual_seed(seed)
        self._left: list[float] = []

    def next(self) -> float:
        if not self._left:
            self._left = torch.rand(self.block, dtype=torch.float64, generator=self.gen).tolist()[::-1]
        return self._left.pop()


def draw(logp_AV: torch.Tensor, streams: list[Uniforms | None], gen: torch.Generator) -> torch.Tensor:
    """A token per row from ``exp(logp_AV)``: a uniform per row (a seeded row's from its own stream,
    the others' from ``gen``, the engine's) inverted through its CDF — 0.16 ms a step at 64 rows,
    against 1.2 ms for ``multinomial``."""
    probs_AV = logp_AV.exp()
    if all(s is None for s in streams):
        u_A = torch.rand(len(streams), dtype=torch.float64, generator=gen)
    else:
        u_A = torch.tensor([float(torch.rand((), dtype=torch.float64, generator=gen)) if s is None else s.next()
                            for s in streams], dtype=torch.float64)
    cdf_AV = probs_AV.double().cumsum(-1)
    tok_A = torch.searchsorted(cdf_AV, (u_A * cdf_AV[:, -1])[:, None], right=True)[:, 0]
    tok_A = tok_A.clamp_(max=probs_AV.shape[-1] - 1)  # past the end: a uniform that rounded up to the total
    cut_A = probs_AV.gather(-1, tok_A[:, None])[:, 0] == 0  # only there: a token of probability 0
    if bool(cut_A.any()):
        last_A = torch.where(probs_AV > 0, torch.arange(probs_AV.shape[-1]), 0).amax(-1)
        tok_A = torch.where(cut_A, last_A, tok_A)
    return tok_A


class Row:
    """One request in the batch: its sampling settings and what it has sampled so far."""

    def __init__(self, req: Request, reused: int):
        s = req.sampling
        self.req, self.reused = req, reused
        self.temp, self.top_k, self.top_p, self.max_new = s.temperature, s.top_k, s.top_p, s.max_tokens
        self.run_limit, self.run_thr, self.runs = s.stop_confident_run, math.log(s.confident_p), 0
        self.uniforms = Uniforms(s.seed) if s.seed is not None else None
        self.tokens: list[int] = []
        self.logps: list[float] = []
        self.sizes: list[int] | None = [] if s.records_candidates else None
        self.top_n = s.top_logprobs
        self.tops: list[list[tuple[int, float]]] | None = [] if s.top_logprobs else None
        self.reason: str | None = None
        self.t0, self.prefill_s, self.batch_size = time.perf_counter(), 0.0, 0
        self.compiled = 0
        """Tokens whose logits came from the compiled one-row decode (``rlonce.engine.fast.solo``)."""
        self.matcher = req.matcher
        self.routes: list[np.ndarray] | None = None
        """A sparse model's experts at each position run for this row so far, in pieces (prompt
        kept, prompt run, then one per decode step); None for a dense model."""

    def routes_array(self) -> np.ndarray | None:
        """``routes`` as one (positions, layers, k) array: the prompt and every sampled token but the
        last (joined once: the prefix store and the answer both ask)."""
        if self.routes is None:
            return None
        if len(self.routes) > 1:
            self.routes = [np.concatenate(self.routes)]
        return self.routes[0]

    def record(self, token: int, logp: float, size: int, eos: bool, paused: threading.Event,
               top: list[tuple[int, float]] | None = None) -> bool:
        """Append the token (and its candidate-set size, where top-k/top-p is on, and its most
        likely alternatives, where asked for) and decide whether the row is done: end of
        sequence, a confident run that reached its limit ('repetition'), the token budget, or the
        engine paused ('abort')."""
        self.tokens.append(token)
        self.logps.append(logp)
        if self.sizes is not None:
            self.sizes.append(size)
        if self.tops is not None:
            self.tops.append(top or [])
        self.runs = self.runs + 1 if logp > self.run_thr else 0
        stop_here = self.req.watch is not None and self.req.watch(token)  # it sees every token, once
        if eos:
            self.reason = "stop"
        elif stop_here:
            self.reason = "stop_sequence"
        elif self.run_limit and self.runs >= self.run_limit:
            self.reason = "repetition"
        elif len(self.tokens) >= self.max_new:
            self.reason = "length"
        elif paused.is_set():
            self.reason = "abort"
        return self.reason is not None

    def generation(self, version: int) -> Generation:
        return Generation(self.tokens, self.logps, [version] * len(self.tokens), self.reason or "length",
                          metrics={"wave_size": self.batch_size, "wave_seconds": time.perf_counter() - self.t0,
                                   "prefill_seconds": self.prefill_s, "prompt_tokens": len(self.req.prompt_ids),
                                   "cached_prompt_tokens": self.reused, "compiled_tokens": self.compiled,
                                   "constrained_tokens": len(self.tokens) if self.matcher is not None else 0},
                          candidates=self.sizes, top_logprobs=self.tops, routes=self.routes_array())


@dataclass
class Part:
    """Rows just prefilled (or a running batch): cache, mask, last positions, next-token logits."""

    kv: kvcache.KV
    attn_BL: torch.Tensor
    pos_R: torch.Tensor
    logits_BV: torch.Tensor
    rows: list[Row]
    cache: DynamicCache | None = None
    """The cache ``kv`` is read from, when a batch may take it over as it is (its layers have room
    to grow and hold these rows only)."""


class Batch:
    """The running batch: one cache, its rows left-padded; finished rows ride on pad tokens until
    compaction drops them."""

    def __init__(self, parts: list[Part]):
        if len(parts) == 1 and parts[0].cache is not None:  # nothing to join: no copy
            self.cache, self.attn_BL = parts[0].cache, parts[0].attn_BL
        else:
            self.cache, self.attn_BL = kvcache.merge([(p.kv, p.attn_BL) for p in parts])
        self.pos_R = torch.cat([p.pos_R for p in parts])
        self.logits_BV = torch.cat([p.logits_BV for p in parts])
        self.rows = [row for p in parts for row in p.rows]
        self._sampling_key: list[int] | None = None
        self._sampling: tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool] | None = None
        self.static = None
        """While the batch is one row decoding compiled: its static cache, ``n`` columns filled
        (``cache`` is then None)."""
        self.n = 0
        self.dense = bool(self.attn_BL.all())
        """No masked column: the model needs no attention mask (decoding appends unmasked columns)."""
        for row in self.rows:
            row.batch_size = max(row.batch_size, len(self.rows))

    def sampling(self, live: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        """Temperature, top-k and top-p of the rows ``live``, as tensors, and whether any row
        filters its candidates (remade when the rows change)."""
        key = [id(self.rows[r]) for r in live]
        if self._sampling_key != key:
            rows = [self.rows[r] for r in live]
            self._sampling_key, self._sampling = key, (torch.tensor([x.temp for x in rows]),
                                                       torch.tensor([x.top_k for x in rows]),
                                                       torch.tensor([x.top_p for x in rows]),
                                                       any(x.top_k > 0 or x.top_p < 1 for x in rows))
        return self._sampling

    def part(self) -> Part:
        return Part(self.kv(), self.attn_BL, self.pos_R, self.logits_BV, self.rows)

    def kv(self) -> kvcache.KV:
        return solo.kv_of(self.static, self.n) if self.static is not None else kvcache.kv_of(self.cache)

    @property
    def live(self) -> int:
        return sum(row.reason is None for row in self.rows)

    def compact(self, fraction: float) -> None:
        """Drop the finished rows once they are ``fraction`` of the batch."""
        keep = [r for r, row in enumerate(self.rows) if row.reason is None]
        if len(self.rows) - len(keep) < max(1, fraction * len(self.rows)):
            return
        kv, self.attn_BL = kvcache.take(self.kv(), self.attn_BL, keep)
        self.dense = bool(self.attn_BL.all())
        self.cache = kvcache.new_cache(kv)
        self.pos_R = self.pos_R[torch.tensor(keep)]
        self.rows = [self.rows[r] for r in keep]


