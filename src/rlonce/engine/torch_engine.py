"""Torch engine: batched, KV-cached token-in/token-out generation for Hugging Face models.

Requests from many concurrent sessions are queued; a worker thread gathers them into a wave
(up to ``max_batch_size``, waiting at most ``batch_wait_s`` for company), left-pads the
prompts, prefills once (computing the LM head at the last position only) and decodes step by
step with a ``DynamicCache``. Rows that finish are dropped from the cache once a quarter of the
remaining rows is done (``compact_fraction``), so one long reply does not keep paying for the
finished ones. Sampling applies temperature, then top-k, then top-p; the
log-prob returned per token is taken from that processed distribution — the one sampled from —
and, when top-k or top-p is on, so is the size of its candidate set (its finite entries), which
the trainer renormalises over.

It departs from vLLM-style continuous batching: requests arriving during a wave wait for the
next one. With the short turns of agent loops on CPU this costs little and keeps the loop
simple; GPU backends (vLLM/SGLang) are separate engines behind the same contract.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import queue
import threading
import time
from dataclasses import dataclass

import torch

from rlonce.core import faults
from rlonce.engine.base import EngineError, Generation, SamplingParams, Watch, check_prompt
from rlonce.errors import is_internal


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    watch: Watch | None = None


def _deliver(r: _Request, fn, value) -> None:
    """Hand a result to the caller's loop — unless that loop has closed (a cancelled rollout)."""
    try:
        r.loop.call_soon_threadsafe(fn, r.future, value)
    except RuntimeError:  # the event loop is closed: nobody is waiting for this answer
        pass


def process_logits(logits_BV: torch.Tensor, temperature_B: torch.Tensor, top_k_B: torch.Tensor,
                   top_p_B: torch.Tensor) -> torch.Tensor:
    """Log-probs of the sampling distribution: temperature, then top-k, then top-p (nucleus)."""
    logits_BV = logits_BV.float() / temperature_B[:, None]
    if bool((top_k_B > 0).any()) or bool((top_p_B < 1).any()):
        sorted_BV, order_BV = logits_BV.sort(dim=-1, descending=True)
        rank_V = torch.arange(logits_BV.shape[-1], device=logits_BV.device)
        drop_BV = (top_k_B[:, None] > 0) & (rank_V[None, :] >= top_k_B[:, None])
        probs_BV = sorted_BV.masked_fill(drop_BV, float("-inf")).softmax(-1)
        before_BV = probs_BV.cumsum(-1) - probs_BV  # mass strictly above each candidate
        drop_BV |= before_BV >= top_p_B[:, None]
        drop_BV[:, 0] = False  # the most likely token always survives
        sorted_BV = sorted_BV.masked_fill(drop_BV, float("-inf"))
        logits_BV = torch.full_like(logits_BV, float("-inf")).scatter(-1, order_BV, sorted_BV)
    return logits_BV.log_softmax(-1)


class TorchEngine:
    def __init__(self, model, *, eos_token_ids: list[int], pad_token_id: int, max_batch_size: int = 64,
                 batch_wait_s: float = 0.01, seed: int = 0, version: int = 0, max_context: int | None = None,
                 compact_fraction: float = 0.25):
        self.model = model.eval()
        self.eos = torch.tensor(sorted(set(eos_token_ids)))
        self.pad = pad_token_id
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.version = version
        self.max_context = max_context or getattr(model.config, "max_position_embeddings", 1 << 30)
        self._gen = torch.Generator().manual_seed(seed)
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._last_only = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self.compact_fraction = compact_fraction
        """Drop finished rows from the cache once this share of the wave's live rows is done."""
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._lock = threading.Lock()  # held for a wave, and for a weight load
        self._paused = threading.Event()
        self._stats = {"waves": 0, "decode_steps": 0, "generated_tokens": 0, "prefill_tokens": 0}
        self._worker = threading.Thread(target=self._serve, name="rlonce-torch-engine", daemon=True)
        self._worker.start()

    # ---- contract ------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, watch: Watch | None = None) -> Generation:
        check_prompt(prompt_ids, sampling, self.max_context)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queue.put(_Request(list(prompt_ids), sampling, fut, loop, watch))
        return await fut

    async def generate_wave(self, batch: list[tuple[list[int], SamplingParams, Watch | None]]) -> list:
        """Generate ``batch`` (prompt ids, sampling, watch) as whole waves of their own, in this order
        (``max_batch_size`` at a time): no other request joins them (``rlonce.engine.lockstep``).
        Per request, its ``Generation`` or the exception that failed it."""
        loop = asyncio.get_running_loop()
        reqs = []
        for prompt_ids, sampling, watch in batch:
            fut = loop.create_future()
            try:
                check_prompt(prompt_ids, sampling, self.max_context)
            except ValueError as e:
                fut.set_exception(e)
            reqs.append(_Request(list(prompt_ids), sampling, fut, loop, watch))
        self._queue.put([r for r in reqs if not r.future.done()])
        return list(await asyncio.gather(*(r.future for r in reqs), return_exceptions=True))

    def load_weights(self, state: dict, version: int) -> None:
        """Swap in new weights between waves; every later token is stamped ``version``."""
        with self._lock:
            self.model.load_state_dict(state)
            self.version = version

    def pause(self) -> None:
        """Stop the running wave at its next token ('abort') and hold new ones until resume()."""
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=10)

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._stats)

    # ---- worker --------------------------------------------------------------------------
    def _serve(self) -> None:
        held = None  # a whole wave (or the end) that arrived while a wave was being gathered
        while True:
            first, held = (held, None) if held is not None else (self._queue.get(), None)
            if first is None:
                return
            if isinstance(first, list):  # ``generate_wave``: these requests alone, in this order
                for i in range(0, len(first), self.max_batch_size):
                    self._serve_wave(first[i:i + self.max_batch_size])
                continue
            wave = [first]
            deadline = time.monotonic() + self.batch_wait_s
            while len(wave) < self.max_batch_size:
                try:
                    nxt = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is None or isinstance(nxt, list):
                    held = nxt
                    break
                wave.append(nxt)
            self._serve_wave(wave)

    def _serve_wave(self, wave: list[_Request]) -> None:
        while self._paused.is_set():
            time.sleep(0.005)
        wave = [r for r in wave if not r.loop.is_closed() and not r.future.cancelled()]  # callers gone
        if not wave:
            return
        try:
            faults.point("engine.wave", EngineError)
            with self._lock, torch.inference_mode():
                results = self._run_wave(wave)
        except Exception as e:  # the retry boundary: the caller turns this into engine_error
            # a bug of ours travels as itself, so the caller counts it as internal_error, not an outage
            err = e if is_internal(e) else EngineError(f"{type(e).__name__}: {e}")
            for r in wave:
                _deliver(r, _set_exception, err)
            return
        for r, g in zip(wave, results):
            _deliver(r, _set_result, g)

    def _run_wave(self, wave: list[_Request]) -> list[Generation]:
        t0 = time.perf_counter()
        ids_BL, attn_BL, pos_BL = _left_pad([r.prompt_ids for r in wave], self.pad)
        rows = _WaveRows(wave)

        from transformers import DynamicCache

        cache = DynamicCache()
        out = self.model(input_ids=ids_BL, attention_mask=attn_BL, position_ids=pos_BL,
                         use_cache=True, **{self._cache_kw: cache}, **self._last_only)
        self._stats["prefill_tokens"] += sum(len(r.prompt_ids) for r in wave)
        t_prefill = time.perf_counter() - t0
        steps = self._decode(rows, cache, out.logits[:, -1], attn_BL, pos_BL[:, -1])
        self._stats["waves"] += 1
        self._stats["decode_steps"] += steps
        self._stats["generated_tokens"] += sum(len(t) for t in rows.tokens)
        wall = time.perf_counter() - t0
        return [
            Generation(rows.tokens[i], rows.logps[i], [self.version] * len(rows.tokens[i]), rows.reasons[i] or "length",
                       metrics={"wave_size": len(wave), "wave_seconds": wall, "prefill_seconds": t_prefill},
                       candidates=rows.sizes[i])
            for i in range(len(wave))
        ]

    def _decode(self, w: _WaveRows, cache, logits_BV: torch.Tensor, attn_BL: torch.Tensor,
                last_pos_R: torch.Tensor) -> int:
        """Sample token after token until every row of the wave has finished; returns the steps.
        Cache rows map to wave rows through ``rows``; finished rows ride along on pad tokens
        (their output ignored) until enough of them are done to drop them from the cache."""
        rows = list(range(len(w.tokens)))  # cache row -> wave index
        steps = 0
        while True:
            next_R = self._sample_step(w, rows, logits_BV)
            steps += 1
            keep = [r for r, i in enumerate(rows) if w.reasons[i] is None]
            if not keep:
                return steps
            if len(rows) - len(keep) >= max(1, self.compact_fraction * len(rows)):  # drop finished rows
                sel = torch.tensor(keep)
                cache.batch_select_indices(sel)
                attn_BL, last_pos_R, next_R = attn_BL[sel], last_pos_R[sel], next_R[sel]
                rows = [rows[r] for r in keep]
            attn_BL = torch.cat([attn_BL, torch.ones((len(rows), 1), dtype=torch.long)], dim=1)
            last_pos_R = last_pos_R + 1
            out = self.model(input_ids=next_R[:, None], attention_mask=attn_BL, position_ids=last_pos_R[:, None],
                             use_cache=True, **{self._cache_kw: cache})
            logits_BV = out.logits[:, -1]

    def _sample_step(self, w: _WaveRows, rows: list[int], logits_BV: torch.Tensor) -> torch.Tensor:
        """Draw one token for every unfinished row and record it; the next input token of each
        cache row (pad for finished ones)."""
        live = [r for r, i in enumerate(rows) if w.reasons[i] is None]
        wave_idx = torch.tensor([rows[r] for r in live])
        logp_AV = process_logits(logits_BV[torch.tensor(live)], w.temp_B[wave_idx], w.topk_B[wave_idx],
                                 w.topp_B[wave_idx])
        tok_A = self._draw(logp_AV, [w.gens[rows[r]] for r in live])
        lp_A = logp_AV.gather(-1, tok_A[:, None])[:, 0]
        size_A = logp_AV.isfinite().sum(-1).tolist()  # the candidate set: what top-k/top-p left
        next_R = torch.full((len(rows),), self.pad, dtype=torch.long)
        for j, r in enumerate(live):
            i, t = rows[r], int(tok_A[j])
            next_R[r] = t
            w.record(i, t, float(lp_A[j]), size_A[j], bool((self.eos == t).any()), self._paused)
        return next_R

    def _draw(self, logp_AV: torch.Tensor, gens: list[torch.Generator | None]) -> torch.Tensor:
        probs_AV = logp_AV.exp()
        if all(g is None for g in gens):
            return torch.multinomial(probs_AV, 1, generator=self._gen)[:, 0]
        out = []
        for j, g in enumerate(gens):
            out.append(torch.multinomial(probs_AV[j], 1, generator=g or self._gen))
        return torch.cat(out)


def _left_pad(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prompts as one right-aligned batch: token ids, attention mask and positions, each (B, L)."""
    lens = [len(p) for p in prompts]
    B, L = len(prompts), max(lens)
    ids_BL = torch.full((B, L), pad, dtype=torch.long)
    attn_BL = torch.zeros((B, L), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids_BL[i, L - lens[i]:] = torch.tensor(p)
        attn_BL[i, L - lens[i]:] = 1
    return ids_BL, attn_BL, (attn_BL.cumsum(-1) - 1).clamp(min=0)


class _WaveRows:
    """Sampling settings and outputs of one wave, indexed by position in the wave."""

    def __init__(self, wave: list[_Request]):
        B = len(wave)
        self.temp_B = torch.tensor([r.sampling.temperature for r in wave])
        self.topk_B = torch.tensor([r.sampling.top_k for r in wave])
        self.topp_B = torch.tensor([r.sampling.top_p for r in wave])
        self.max_new_B = torch.tensor([r.sampling.max_tokens for r in wave])
        self.run_limit = [r.sampling.stop_confident_run for r in wave]
        self.run_thr = [math.log(r.sampling.confident_p) for r in wave]
        self.runs = [0] * B
        self.gens = [torch.Generator().manual_seed(r.sampling.seed) if r.sampling.seed is not None else None
                     for r in wave]
        self.tokens: list[list[int]] = [[] for _ in range(B)]
        self.logps: list[list[float]] = [[] for _ in range(B)]
        self.sizes: list[list[int] | None] = [[] if r.sampling.records_candidates else None for r in wave]
        self.reasons: list[str | None] = [None] * B
        self.watches = [r.watch for r in wave]

    def record(self, i: int, token: int, logp: float, size: int, eos: bool, paused: threading.Event) -> None:
        """Append row ``i``'s token (and its candidate-set size, where top-k/top-p is on) and decide
        whether the row is done: end of sequence, a confident run that reached its limit
        ('repetition'), the token budget, or the engine paused ('abort')."""
        self.tokens[i].append(token)
        self.logps[i].append(logp)
        if self.sizes[i] is not None:
            self.sizes[i].append(size)
        self.runs[i] = self.runs[i] + 1 if logp > self.run_thr[i] else 0
        stop_here = self.watches[i] is not None and self.watches[i](token)  # it sees every token, once
        if eos:
            self.reasons[i] = "stop"
        elif stop_here:
            self.reasons[i] = "stop_sequence"
        elif self.run_limit[i] and self.runs[i] >= self.run_limit[i]:
            self.reasons[i] = "repetition"
        elif len(self.tokens[i]) >= int(self.max_new_B[i]):
            self.reasons[i] = "length"
        elif paused.is_set():
            self.reasons[i] = "abort"


def _set_result(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
