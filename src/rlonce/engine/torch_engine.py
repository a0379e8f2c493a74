"""Torch engine: continuously batched, KV-cached token-in/token-out generation for Hugging Face models.

Requests from many concurrent sessions are queued; a worker thread runs one batch at a time.
An idle worker waits at most ``batch_wait_s`` for company, prefills the arrivals together
(left-padded, the LM head at the last position only) and decodes step by step. While the batch
decodes, a request that arrives **joins at the next step** (``continuous``): it is prefilled on
its own and merged into the batch's cache; a row that finishes is answered at once, and
finished rows are dropped from the cache once a quarter of the batch is done
(``compact_fraction``). Sampling applies temperature, then top-k, then top-p; the log-prob
returned per token is taken from that processed distribution — the one sampled from — and, when
top-k or top-p is on, so is the size of its candidate set (its finite entries), which the trainer
renormalises over.

**Prefix reuse** (``prefix_cache_mb`` > 0): the cache of every finished sequence is kept
(``rlonce.engine.kvcache.PrefixStore``), and a prompt that starts with a kept sequence — the next
turn of an agent session — runs the model only on its new tokens. A weight load drops every
kept cache (they belong to the old weights), so a partial rollout continued after an update
re-prefills. ``generate_wave`` (lockstep) runs its requests alone, with no joiners.

**Sparse models**: every prefill and decode step runs with the routers recording, and each answer
carries the experts of every position it ran, kept caches carrying theirs (``Generation.routes``,
``rlonce.model.moe``: routing replay); with ``rollout_quant = "mxfp4"`` the experts are
quantize-dequantized after every weight load (``rlonce.model.mxfp4``).

**Compiled one-row decoding** (``compile_solo``): a batch down to one row decodes with the model
``torch.compile``-d over a static cache (``rlonce.engine.fast.solo``); off by default. Otherwise a
Llama-family model decodes through ``rlonce.engine.fast.decode``'s written-out step (``fast_decode``).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time

import torch

from rlonce.core import faults
from rlonce.engine import constrain, forward, kvcache, prefill
from rlonce.engine.base import EngineError, Generation, SamplingParams, Watch, check_prompt
from rlonce.engine.fast.solo import Solo
from rlonce.engine.rows import Batch, Part, Request, Row, draw, left_pad
from rlonce.errors import is_internal
from rlonce.model import lora, moe, mxfp4, omp, precision


def process_logits(logits_BV: torch.Tensor, temperature_B: torch.Tensor, top_k_B: torch.Tensor,
                   top_p_B: torch.Tensor, filtered: bool | None = None) -> torch.Tensor:
    """Log-probs of the sampling distribution: temperature, then top-k, then top-p (nucleus).
    ``filtered``: whether any row has top-k or top-p on (None: found from the tensors)."""
    logits_BV = logits_BV.float() / temperature_B[:, None]
    if filtered is None:
        filtered = bool((top_k_B > 0).any()) or bool((top_p_B < 1).any())
    if filtered:
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


_FORGET_WAVES = object()


class TorchEngine:
    def __init__(self, model, *, eos_token_ids: list[int], pad_token_id: int, max_batch_size: int = 64,
                 batch_wait_s: float = 0.01, seed: int = 0, version: int = 0, max_context: int | None = None,
                 compact_fraction: float = 0.25, continuous: bool = True, prefix_cache_mb: float = 1024,
                 threads: int | None = None, compile_solo: bool = False, fast_decode: bool = True,
                 native_kernels: bool = True, tokenizer=None, rollout_quant: str = "none"):
        self.model = model.eval()
        self.rollout_quant = rollout_quant
        """'mxfp4': the experts are quantize-dequantized after every weight load (``rlonce.model.mxfp4``)."""
        if rollout_quant == "mxfp4" and not mxfp4.quantize_experts_(self.model):
            raise ValueError("model.rollout_quant = 'mxfp4' quantizes a mixture-of-experts model's experts; this "
                             "model has none (it is dense): set it to 'none'")
        self.eos = set(eos_token_ids)
        self.pad = pad_token_id
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.version = version
        self._lora_base: dict | None = None
        """W0 of the adapted weights, copied before the first adapter sent without it is merged."""
        self.max_context = max_context or getattr(model.config, "max_position_embeddings", 1 << 30)
        self._gen = torch.Generator().manual_seed(seed)
        self._cache_kw = forward.cache_keyword(model)
        self.compact_fraction = compact_fraction
        """Drop finished rows from the cache once this share of the batch's rows is done."""
        self.continuous = continuous
        """Requests arriving while a batch decodes join it at the next step (else they wait for it to end)."""
        self._fwd = forward.stepper(self.model, self._cache_kw, fast_decode, native_kernels)
        """The decode step and the prefill: the fast path's (``rlonce.engine.fast``) where it is on and
        passed its parity check on this model, else transformers' forward (``rlonce.engine.forward``)."""
        self.fast_path: str = self._fwd.status
        """Which forward the engine runs, and why, in one line (``engine.fast_path``)."""
        self.route_shape = moe.install(self.model)
        """A sparse model's routing (``rlonce.model.moe``): every answer carries the experts of each
        position the engine ran for it (``Generation.routes``); None for a dense model."""
        self._rec = None
        """While a batch runs on a sparse model: the routers' record of the last forward."""
        self.solo = Solo(self.model, self._cache_kw) if compile_solo and self.route_shape is None \
            and not forward.forced_off() else None
        """A batch down to one row decodes compiled over a static cache (``rlonce.engine.fast.solo``)."""
        self.prefixes = kvcache.PrefixStore(int(prefix_cache_mb * 2**20)) if prefix_cache_mb > 0 else None
        self._kv_bytes = prefill.kv_bytes_per_token(model)
        self._masks = constrain.Masks(tokenizer, model.config.vocab_size, eos_token_ids)
        """Constrained decoding (``SamplingParams.constraint``); ``tokenizer`` None: refused."""
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()  # held while a batch runs, and for a weight load
        self._draining = threading.Event()  # a weight load waits: admit no one until the batch ends
        self._paused = threading.Event()
        self._stats = {"waves": 0, "decode_steps": 0, "generated_tokens": 0, "prefill_tokens": 0, "joined": 0}
        self.threads = threads or torch.get_num_threads()
        """Torch threads of the worker (default: the constructing thread's; a thread's own count is
        not inherited). The worker hands back its OpenMP team when idle (``rlonce.model.omp``)."""
        self._worker = threading.Thread(target=self._serve, name="rlonce-torch-engine", daemon=True)
        self._worker.start()
        omp.release()  # the constructing thread loaded the model and ran the parity check: an OpenMP
        # team it keeps counts against the cores and makes the worker's helpers sleep between ops

    # ---- contract ------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, watch: Watch | None = None) -> Generation:
        self._check(prompt_ids, sampling)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queue.put(Request(list(prompt_ids), sampling, fut, loop, watch))
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
                self._check(prompt_ids, sampling)
            except ValueError as e:
                fut.set_exception(e)
            reqs.append(Request(list(prompt_ids), sampling, fut, loop, watch))
        self._queue.put([r for r in reqs if not r.future.done()])
        return list(await asyncio.gather(*(r.future for r in reqs), return_exceptions=True))

    def _check(self, prompt_ids: list[int], sampling: SamplingParams) -> None:
        """Refuse, before it queues, a request the engine cannot serve (``ValueError``)."""
        check_prompt(prompt_ids, sampling, self.max_context)
        c = sampling.constraint
        if c is not None:
            if self._masks.tokenizer is None:
                raise ValueError("this engine was built without its tokenizer: constrained decoding needs it")
            problem = constrain.check(c)
            if problem:
                raise ValueError(f"the constraint cannot be enforced: {problem}")

    def load_weights(self, state: dict | lora.AdapterWeights, version: int) -> None:
        """Swap in new weights once the running batch ends; every later token is stamped
        ``version``, and no cache of the old weights is reused. ``state``: a whole state dict, or
        a LoRA adapter merged into the weights (``rlonce.model.lora.merge_into``). An adapter sent
        without W0 (from another process) is merged into a copy of the weights this engine held
        before its first such adapter: it must have been built from the base folder."""
        self._draining.set()
        try:
            with self._lock:
                if isinstance(state, lora.AdapterWeights):
                    if not state.base and self._lora_base is None:  # sent without W0: keep the base's own
                        self._lora_base = lora.own_base(self.model, state)
                    lora.merge_into(self.model, state, None if state.base else self._lora_base)
                else:
                    self.model.load_state_dict(state)
                if self.rollout_quant == "mxfp4":
                    mxfp4.quantize_experts_(self.model)
                self.version = version
                if self.prefixes is not None:
                    self.prefixes.clear()
        finally:
            self._draining.clear()
            omp.release()  # the copy ran in the caller's thread: its OpenMP team would slow the worker's

    def forget_waves(self) -> None:
        """Drop the kept caches of lockstep waves, in order with the requests queued before it: a new
        round of lockstep sequences starts from none."""
        self._queue.put(_FORGET_WAVES)

    def warm_solo(self) -> str | None:
        """Compile the one-row decode for the smallest static cache now, in the engine's thread,
        rather than on the first lone row's turn; why compiling failed, or None."""
        if self.solo is None:
            return "compile_solo is off"
        done = threading.Event()
        self._queue.put(done)
        while not done.wait(0.5):
            if not self._worker.is_alive():
                return "the engine is closed"
        return self.solo.failed

    def pause(self) -> None:
        """Stop the running batch at its next token ('abort') and hold new requests until resume()."""
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=10)

    @property
    def stats(self) -> dict[str, float]:
        out = dict(self._stats)
        if self.prefixes is not None:
            out.update({f"prefix_{k}": v for k, v in self.prefixes.stats.items()})
            out["prefix_kept_mb"] = self.prefixes.used / 2**20
        if self.solo is not None:
            out.update(self.solo.stats)
        return out

    # ---- worker --------------------------------------------------------------------------
    def _serve(self) -> None:
        torch.set_num_threads(self.threads)
        held, carry = None, []  # held: a whole wave, the end or a command met while gathering
        while True:
            if carry:  # requests that were waiting to join when the last batch ended
                wave, carry = carry, []
            else:
                first, held = (held, None) if held is not None else (omp.get_idle(self._queue), None)
                if first is None:
                    return
                if first is _FORGET_WAVES:
                    with self._lock:
                        if self.prefixes is not None:
                            self.prefixes.clear("wave")
                    continue
                if isinstance(first, threading.Event):  # ``warm_solo``
                    try:
                        with self._lock, torch.inference_mode(), precision.autocast(self.model):
                            self.solo.warm()
                    finally:
                        first.set()
                    continue
                if isinstance(first, list):  # ``generate_wave``: these requests alone, in this order
                    for i in range(0, len(first), self.max_batch_size):
                        self._run(first[i:i + self.max_batch_size], lane="wave")
                    continue
                wave = [first]
            if held is None:
                wave, held = self._gather(wave, self.max_batch_size, time.monotonic() + self.batch_wait_s)
            held, carry = self._run(wave, lane="free", held=held)

    @contextlib.contextmanager
    def _recording(self):
        """Record the routers' choices while a batch runs (a sparse model), for ``_routes``."""
        if self.route_shape is None:
            yield
            return
        with moe.recording() as self._rec:
            try:
                yield
            finally:
                self._rec = None

    def _routes(self, B: int, T: int):
        """The experts of the forward just run over B×T tokens, (B, T, layers, k) in their storage
        type; None for a dense model."""
        if self._rec is None:
            return None
        got = self._rec.take(B, T)
        return got.astype(self.route_shape.dtype, copy=False)

    def _gather(self, got: list[Request], room: int, deadline: float | None):
        """Add queued requests to ``got`` up to ``room`` (waiting until ``deadline``, or not at all);
        a whole wave, the end or a command met on the way is handed back to be served after."""
        while len(got) < room:
            try:
                nxt = (self._queue.get(timeout=max(0.0, deadline - time.monotonic())) if deadline is not None
                       else self._queue.get_nowait())
            except queue.Empty:
                break
            if not isinstance(nxt, Request):
                return got, nxt
            got.append(nxt)
        return got, None

    def _run(self, wave: list[Request], lane: str, held=None):
        """Run a batch from ``wave`` until its last row ends, taking joiners (unless this is a whole
        wave of its own, or a weight load waits). Joiners are prefilled together: once they are a
        quarter of the running rows, or the first has waited ``batch_wait_s``. Returns what the
        gathering held back, and the requests still waiting to join."""
        while self._paused.is_set():
            time.sleep(0.005)
        pending: list[Request] = []
        with self._lock, torch.inference_mode(), precision.autocast(self.model), self._recording():
            batch = None
            self._stats["waves"] += 1
            while True:
                wave = [r for r in wave if not r.gone]  # callers gone
                if wave:
                    batch = self._admit(batch, wave, lane)
                try:
                    if batch is None or not self._step(batch, lane):
                        break
                except Exception as e:  # noqa: BLE001 - every unanswered row hears of it
                    _fail([row.req for row in batch.rows if row.reason is None], e)
                    break
                wave = []
                if lane == "free" and self.continuous and held is None and not self._draining.is_set() \
                        and not self._paused.is_set():
                    more, held = self._gather([], self.max_batch_size - batch.live - len(pending), None)
                    pending += more
                    if pending and (4 * len(pending) >= batch.live
                                    or time.monotonic() - pending[0].t_arrive >= self.batch_wait_s):
                        wave, pending = pending, []
                        self._stats["joined"] += len(wave)
        return held, pending

    def _admit(self, batch: Batch | None, reqs: list[Request], lane: str) -> Batch | None:
        """Prefill ``reqs`` (from kept caches where their prompts allow) and merge them into
        ``batch``; a failure fails these requests only."""
        reqs = self._matchers(reqs)
        if not reqs:
            return batch
        try:
            faults.point("engine.wave", EngineError)
            parts = self._prefill(reqs, lane)
        except Exception as e:  # noqa: BLE001 - the retry boundary: these callers turn it into engine_error
            _fail(reqs, e)
            return batch
        if batch is not None:
            parts.insert(0, batch.part())
        return Batch(parts)

    def _matchers(self, reqs: list[Request]) -> list[Request]:
        """Give each constrained request its grammar matcher; one that cannot have it fails alone
        (its constraint was checked when it queued: this is a prefix that does not match it)."""
        ok = []
        for r in reqs:
            if r.sampling.constraint is not None and r.matcher is None:
                try:
                    r.matcher = self._masks.matcher(r.sampling.constraint)
                except ValueError as e:
                    r.fail(e)
                    continue
            ok.append(r)
        return ok

    def _prefill(self, reqs: list[Request], lane: str) -> list[Part]:
        """Run the model on the requests' prompts: those without a kept prefix together,
        left-padded; those with one together too, on their new tokens after their kept caches.
        Equal prompts run once; a prefix several share runs once first (``rlonce.engine.prefill``)."""
        t0 = time.perf_counter()
        fresh = self._keep_shared([r.prompt_ids for r in reqs], lane) if self.prefixes is not None else []
        reuse = [self.prefixes.lookup(r.prompt_ids, lane) if self.prefixes is not None else (0, None, None)
                 for r in reqs]
        kept, unread = prefill.charge(fresh, [r.prompt_ids for r in reqs], [m for m, _, _ in reuse])
        self._stats["prefill_tokens"] += unread
        parts = []
        cold = [r for r, (m, _, _) in zip(reqs, reuse) if not m]
        if cold:
            first, of, reused = prefill.dedupe([r.prompt_ids for r in cold], [0] * len(cold))
            ids_BL, attn_BL, pos_BL = left_pad([cold[i].prompt_ids for i in first], self.pad)
            parts.append(self._forward_part(cold, self._fwd.new_cache(), ids_BL, attn_BL, pos_BL, reused, of,
                                            [(0, None)] * len(first)))
        hits = [(r, m, kv, k, routes) for r, (m, kv, routes), k in zip(reqs, reuse, kept) if m]
        if hits:  # each row: [pad | kept cache | pad | new tokens], the holes masked out
            first, of, reused = prefill.dedupe([h[0].prompt_ids for h in hits], [h[3] for h in hits])
            hits_u = [hits[i] for i in first]
            cache, kept_BK = kvcache.merge([(h[2], torch.ones((1, h[1]), dtype=torch.long)) for h in hits_u])
            ids_BL, new_BL, pos_BL = left_pad([h[0].prompt_ids[h[1]:] for h in hits_u], self.pad)
            pos_BL = pos_BL + torch.tensor([[h[1]] for h in hits_u])
            parts.append(self._forward_part([h[0] for h in hits], cache, ids_BL, torch.cat([kept_BK, new_BL], 1),
                                            pos_BL, reused, of, [(h[1], h[4]) for h in hits_u]))
        for p in parts:
            self._stats["prefill_tokens"] += sum(len(row.req.prompt_ids) - row.reused for row in p.rows)
            for row in p.rows:
                row.prefill_s = time.perf_counter() - t0
        return parts

    def _keep_shared(self, prompts: list[list[int]], lane: str) -> list[list[int]]:
        """Prefill once and keep (room allowing) each prefix several ``prompts`` share; those run."""
        fresh = []
        for prefix in prefill.shared_prefixes(prompts):
            if self.prefixes.covered(prefix, lane) < len(prefix) \
                    and self.prefixes.fits(len(prefix) * self._kv_bytes, lane):
                cache, attn_1L = self._fwd.new_cache(), torch.ones((1, len(prefix)), dtype=torch.long)
                self._fwd.prefill(torch.tensor([prefix]), torch.arange(len(prefix))[None], cache, attn_1L)
                kv = kvcache.row_of(kvcache.kv_of(cache), attn_1L, 0)
                routes = self._routes(1, len(prefix))
                # refused (the estimate was short): no one reads it
                self.prefixes.put(prefix, kv, lane, None if routes is None else routes[0])
                fresh.append(prefix)
        return fresh

    def _forward_part(self, reqs, cache, ids_BL, attn_BL, pos_BL, reused, rows_of, kept_routes) -> Part:
        """Run the model on a left-padded batch after ``cache``; ``rows_of[i]``: the batch row
        request i reads (None: row i); ``kept_routes[b]``: how many tokens batch row b read from a
        kept cache, and a sparse model's experts at them (None: not recorded)."""
        logits_BV = self._fwd.prefill(ids_BL, pos_BL, cache, attn_BL)
        if not kvcache.mergeable(cache):
            raise EngineError("this model's cache layers (sliding windows?) cannot be batched by the torch engine")
        rows = [Row(r, m) for r, m in zip(reqs, reused)]
        new = self._routes(*ids_BL.shape)
        if new is not None:
            L = ids_BL.shape[1]
            for i, (row, r) in enumerate(zip(rows, reqs)):
                b = i if rows_of is None else rows_of[i]
                m, kept = kept_routes[b]
                if m and kept is None:  # a kept cache without its experts: this row's routing is unknown
                    continue
                row.routes = ([kept] if m else []) + [new[b, L - (len(r.prompt_ids) - m):]]
        kv = kvcache.kv_of(cache)
        if rows_of is not None:
            i = torch.tensor(rows_of)
            kv, attn_BL, pos_BL, logits_BV = [(k[i], v[i]) for k, v in kv], attn_BL[i], pos_BL[i], logits_BV[i]
            cache = None
        return Part(kv, attn_BL, pos_BL[:, -1], logits_BV, rows, cache if kvcache.growing(cache) else None)

    def _step(self, b: Batch, lane: str) -> bool:
        """Sample a token for every live row, answer the rows that ended, run the model one step on
        the new tokens; False once no row is left."""
        for row in b.rows:  # a matcher in error (a grammar bug of ours, never the model's) fails its row alone
            if row.reason is None and row.matcher is not None and row.matcher.is_error():
                row.reason = "error"
                row.req.fail(EngineError(f"the grammar matcher failed: {row.matcher.get_error()[:300]}"))
        live = [r for r, row in enumerate(b.rows) if row.reason is None]
        if not live:
            return False
        rows = [b.rows[r] for r in live]
        logits_AV = b.logits_BV if len(live) == len(b.rows) else b.logits_BV[torch.tensor(live)]
        matchers = [x.matcher for x in rows]
        constrained = any(m is not None for m in matchers)
        if constrained:  # the grammar's disallowed tokens out before temperature, top-k and top-p
            logits_AV = self._masks.apply(logits_AV, matchers)
        logp_AV = process_logits(logits_AV, *b.sampling(live))
        tok_A = draw(logp_AV, [x.uniforms for x in rows], self._gen)
        lp_A = logp_AV.gather(-1, tok_A[:, None])[:, 0].tolist()
        size_A = logp_AV.isfinite().sum(-1).tolist() if any(x.sizes is not None for x in rows) else [0] * len(rows)
        toks = tok_A.tolist()
        if constrained:
            self._masks.advance(matchers, toks)
        top_A = _top(logp_AV, rows)
        done = [(r, row) for j, (r, row) in enumerate(zip(live, rows))
                if row.record(toks[j], lp_A[j], size_A[j], toks[j] in self.eos, self._paused, top_A[j])]
        self._finish(b, done, lane)
        self._stats["decode_steps"] += 1
        if not b.live:
            return False
        b.compact(self.compact_fraction)
        next_R = torch.tensor([[row.tokens[-1] if row.reason is None else self.pad] for row in b.rows])
        b.attn_BL = torch.cat([b.attn_BL, torch.ones((len(b.rows), 1), dtype=torch.long)], dim=1)
        b.pos_R = b.pos_R + 1
        logits = self._solo_step(b, next_R) if self.solo is not None and self.solo.failed is None \
            and len(b.rows) == 1 else None
        b.logits_BV = logits if logits is not None else \
            self._fwd(next_R, b.pos_R[:, None], b.cache, None if b.dense else b.attn_BL)
        got = self._routes(len(b.rows), 1)
        if got is not None:
            for r, row in enumerate(b.rows):
                if row.reason is None and row.routes is not None:
                    row.routes.append(got[r])
        return True

    def _solo_step(self, b: Batch, next_R: torch.Tensor) -> torch.Tensor | None:
        """Run the one row's new token compiled over a static cache (moving its cache there first);
        None: run it eagerly (compiling failed)."""
        solo, row = self.solo, b.rows[0]
        if b.static is not None and b.n < b.static.layers[0].max_cache_len:
            logits = solo.step(b.static, b.n, next_R, b.pos_R[:, None])
        else:  # entering (its cache is sized for the row's budget: it does not fill up)
            kv = kvcache.row_of(b.kv(), b.attn_BL[:, :-1], 0)  # its attended columns, holes dropped
            n = kv[0][0].shape[-2]
            got = solo.enter(kv, max(1, min(row.max_new - len(row.tokens), self.max_context - n)), next_R,
                             b.pos_R[:, None])
            if got is None:
                return None
            b.static, logits = got
            b.cache, b.n, b.dense = None, n, True
            b.attn_BL = torch.ones((1, n + 1), dtype=torch.long)  # holes dropped; later steps append ones
        b.n += 1
        row.compiled += 1
        return logits

    def _finish(self, b: Batch, done: list[tuple[int, Row]], lane: str) -> None:
        """Keep the cache of each row ``r`` that ended for a later turn that starts with its tokens,
        then answer them all (an answer wakes the caller's thread, which would contend with the
        copying for the interpreter lock)."""
        for r, row in done:
            if self.prefixes is not None and row.reason != "abort":  # the last token was sampled, not yet run
                self.prefixes.put(row.req.prompt_ids + row.tokens[:-1], kvcache.row_of(b.kv(), b.attn_BL, r), lane,
                                  row.routes_array())
            self._stats["generated_tokens"] += len(row.tokens)
        for _, row in done:
            row.req.answer(row.generation(self.version))


def _top(logp_AV: torch.Tensor, rows: list[Row]) -> list[list[tuple[int, float]] | None]:
    """Per row that asks for them (``SamplingParams.top_logprobs``), its most likely tokens and
    their log-probs in the distribution just sampled from; tokens top-k/top-p cut (−inf) are left
    out. Nothing is computed when no row asks."""
    n = max(row.top_n for row in rows)
    if not n:
        return [None] * len(rows)
    vals_AN, ids_AN = logp_AV.topk(min(n, logp_AV.shape[-1]), dim=-1)
    vals, ids = vals_AN.tolist(), ids_AN.tolist()
    return [[(t, v) for t, v in zip(ids[j][:row.top_n], vals[j][:row.top_n]) if v != float("-inf")]
            if row.top_n else None for j, row in enumerate(rows)]


def _fail(reqs: list[Request], e: Exception) -> None:
    # a bug of ours travels as itself, so the caller counts it as internal_error, not an outage
    err = e if is_internal(e) else EngineError(f"{type(e).__name__}: {e}")
    for r in reqs:
        r.fail(err)
