"""vLLM engine: the Engine contract on vLLM's V1 ``AsyncLLM``, for GPUs.

Written against vLLM 0.33 (every call used is also in 0.32). It keeps the contract of ``TorchEngine`` exactly:

- **Log-probs of the distribution sampled from.** The engine is built with
  ``logprobs_mode="processed_logprobs"`` and every request asks for ``logprobs=0``, which returns
  the sampled token's log-prob after temperature, top-k and top-p — the same processing, in the
  same order and with the same nucleus rule, as ``torch_engine.process_logits``.
- **Candidate-set sizes under top-k/top-p.** Such a request asks for the ``CANDIDATE_LOGPROBS``
  highest processed log-probs instead, and each token's set size is the number of finite ones
  (``base.candidate_size``). A set that fills all of them (and is not capped by a top-k within
  them) has an unknown size: it is recorded as 0 — the whole vocabulary, the trainer's old
  normalisation — and counted in ``metrics["candidate_sets_unknown"]``. Not yet run on a GPU.
- **One version per request.** A request is stamped with the engine's version when it is
  admitted. Weights change only while nothing is in flight: ``pause()`` aborts every running
  request first, and ``load_weights`` refuses while requests run unpaused. vLLM's own weight
  version is set to the same number, and the spans it reports on each finished request are
  checked against the stamp.
- **Pause aborts at the next token.** ``pause()`` calls vLLM's ``pause_generation(mode="abort")``:
  each in-flight request ends with finish reason 'abort' and the tokens (and log-probs) streamed
  so far, and vLLM waits until the GPU is idle. New ``generate()`` calls wait on rlonce's side
  until ``resume()``. A request admitted just before the pause that reaches vLLM just after it
  is aborted by id (0.33 rejects it as retryable, 0.32 would queue it): it too comes back as
  'abort', with no tokens, for the caller to continue.
- **Weights go to the workers through ``collective_rpc``** into ``WeightSync``, a worker
  extension that calls the model's ``load_weights``. vLLM's utility channel (msgpack) only carries
  plain data, not tensors, so each tensor travels as (name, dtype, shape, raw bytes), in chunks of
  about 256 MiB. A folder of ``*.safetensors`` files can be passed instead of a dict: the workers
  read it themselves, which is the cheaper path when a trainer in another process publishes
  checkpoints to a shared disk. The prefix cache is reset after every load: its KV entries were
  computed by the old weights.
- **The LM head in float32** (MiniMax-M1 §3.2) when the weights are not: the engine passes
  ``hf_overrides={"head_dtype": "float32"}`` (``head_overrides``), vLLM's own knob for it, which
  vLLM honours for generation models since its PR #48390, so the engine's head matches the
  trainer's (``rlonce.model.loader.fp32_lm_head``). Not measured here (no GPU on this machine).
- **The confident-run stop rule** (``stop_confident_run``) is evaluated on the streamed tokens;
  when it fires the request is aborted in vLLM and the turn ends 'repetition' with exactly the
  tokens of the run — tokens vLLM produced beyond it are dropped.

vLLM runs on a thread of its own with its own event loop: ``AsyncLLM``'s output handler and
sockets belong to the loop that created them, while rlonce callers await ``generate`` from
whatever loop they run (every ``asyncio.run`` makes a new one) and call ``pause``/``load_weights``/
``resume`` synchronously, as ``TorchEngine`` allows.

**LoRA** (``lora_rank`` > 0, written, not yet run on a GPU): vLLM starts with ``enable_lora`` and
a ``max_lora_rank`` at or above the rank; a publish of ``rlonce.model.lora.AdapterWeights`` writes
the adapter as a peft folder (``lora.save_peft``) and registers it with ``add_lora`` as one
``LoRARequest`` per version, the previous one removed; every request carries the current one.
vLLM computes base + adapter unmerged in its LoRA kernels, so its log-probs differ from the
trainer's merged-or-not float32 sum by those kernels' rounding (``mismatch_kl`` says how much).

Departures from ``TorchEngine``: ``load_weights`` writes parameters through the model's own
``load_weights`` (checkpoint names, unquantized models); a load that fails half-way leaves mixed
weights and the old version until a load succeeds. A per-request seed fixes vLLM's sampling noise
(by seed and position); with bf16 weights, batch-dependent kernel rounding can still change a
draw now and then, so seeded reproducibility is exact only up to that rounding.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import json
import math
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import torch

from rlonce.engine.base import (
    BackendMissing,
    Constraint,
    EngineError,
    Generation,
    SamplingParams,
    Watch,
    candidate_size,
    check_prompt,
)

INSTALL = "pip install 'rlonce[vllm]'"
CHUNK_BYTES = 256 << 20
CANDIDATE_LOGPROBS = 20
"""Under top-k/top-p a request asks for this many top processed log-probs (vLLM's default
``max_logprobs``) and counts the finite ones: its tokens' candidate-set sizes."""
"""Tensors are sent to the workers in collective_rpc calls of about this many bytes."""


def head_overrides(dtype: str, lm_head_fp32: bool, overrides: dict | None = None) -> dict | None:
    """vLLM's ``hf_overrides`` that compute the LM head in float32 when the weights are in a
    lower precision and ``lm_head_fp32`` is on (``model.lm_head_fp32``, as the trainer does), merged
    over the caller's own ``overrides``; None when there is nothing to override."""
    out = dict(overrides or {})
    if lm_head_fp32 and dtype not in ("float32", "fp32"):
        out["head_dtype"] = "float32"
    return out or None


def require_vllm() -> None:
    """Raise ``BackendMissing`` with the install command unless vLLM imports."""
    try:
        importlib.import_module("vllm")
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] == "vllm":
            raise BackendMissing(f"the vllm engine needs vLLM, which is not installed: {INSTALL}") from None
        raise BackendMissing(f"vLLM failed to import ({e}); reinstall it with: {INSTALL}") from None
    except ImportError as e:
        raise BackendMissing(f"vLLM failed to import ({e}); reinstall it with: {INSTALL}") from None


# ---- weights as plain data ---------------------------------------------------------------------

def pack_tensors(state: dict, chunk_bytes: int = CHUNK_BYTES) -> list[list[tuple[str, str, list[int], bytes]]]:
    """``state`` as chunks of (name, dtype, shape, raw bytes): what vLLM's utility channel carries."""
    chunks: list[list[tuple[str, str, list[int], bytes]]] = [[]]
    size = 0
    for name, t in state.items():
        t = t.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        if chunks[-1] and size + len(raw) > chunk_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append((name, str(t.dtype).removeprefix("torch."), list(t.shape), raw))
        size += len(raw)
    return chunks if chunks[-1] else []


def unpack_tensor(dtype: str, shape: list[int], raw: bytes) -> torch.Tensor:
    dt = getattr(torch, dtype)
    if not raw:
        return torch.empty(shape, dtype=dt)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dt).reshape(shape)


class WeightSync:
    """Mixed into every vLLM worker (``worker_extension_cls``); called through ``collective_rpc``.

    ``self`` is the worker: ``self.model_runner`` and ``self.vllm_config`` are vLLM's.
    """

    def rlonce_load_tensors(self, entries: list) -> int:
        weights = [(name, unpack_tensor(dtype, shape, raw)) for name, dtype, shape, raw in entries]
        return self.rlonce_load_named(weights)

    def rlonce_load_folder(self, path: str) -> int:
        from safetensors.torch import load_file

        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{path} holds no *.safetensors file")
        return sum(self.rlonce_load_named(list(load_file(f).items())) for f in files)

    def rlonce_load_named(self, weights: list[tuple[str, torch.Tensor]]) -> int:
        from vllm.config import set_current_vllm_config

        model = self.model_runner.get_model()
        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            model.load_weights(weights=weights)
        return len(weights)


def sparse_route_dtype(model):
    """The type a sparse model's routes are kept in (``rlonce.model.moe.Shape.dtype``), read from its
    folder's config.json (experts under any of the names Hugging Face configs give them); None for a
    dense model or a hub name without a local folder."""
    import numpy as np

    cfg_file = Path(model) / "config.json"
    if not cfg_file.is_file():
        return None
    cfg = json.loads(cfg_file.read_text())
    cfg = cfg.get("text_config", cfg)
    experts = next((cfg[k] for k in ("num_experts", "num_local_experts", "n_routed_experts") if cfg.get(k)), 0)
    return None if not experts else (np.uint8 if experts <= 256 else np.uint16)


# ---- the engine ----------------------------------------------------------------------------------

class VLLMEngine:
    def __init__(self, model: str | os.PathLike, *, dtype: str = "bfloat16", gpu_memory_utilization: float = 0.5,
                 max_model_len: int | None = None, seed: int = 0, version: int = 0, tensor_parallel_size: int = 1,
                 enforce_eager: bool = False, enable_prefix_caching: bool = True,
                 eos_token_ids: list[int] | None = None, pause_timeout_s: float = 120.0, lm_head_fp32: bool = True,
                 lora_rank: int = 0, **engine_kwargs):
        """Start vLLM on ``model`` (a Hugging Face folder or hub name) and wait until it is ready.

        ``gpu_memory_utilization`` is the share of GPU memory vLLM takes (weights and KV cache);
        the rest stays free for a trainer on the same GPU. ``eos_token_ids`` end a turn in
        addition to the tokenizer's EOS (pass ``LoadedModel.eos_token_ids``, as for
        ``TorchEngine``). ``lm_head_fp32`` computes the LM head in float32 when ``dtype`` is lower
        (``head_overrides``). Further keyword arguments go to ``AsyncEngineArgs`` unchanged.
        """
        require_vllm()
        from vllm.engine.arg_utils import AsyncEngineArgs

        self.version = version
        self.base = str(model)
        self._lora = None  # the LoRARequest of the adapter every request carries
        self._lora_dir = Path(tempfile.mkdtemp(prefix="rlonce-vllm-lora-")) if lora_rank > 0 else None
        if lora_rank > 0:
            engine_kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_lora_rank(lora_rank))
        self.eos_token_ids = sorted(set(eos_token_ids)) if eos_token_ids else None
        self.pause_timeout_s = pause_timeout_s
        self.route_dtype = sparse_route_dtype(model)
        """A sparse model's routes are asked of vLLM (``enable_return_routed_experts``) and returned as
        ``Generation.routes`` in this type (``rlonce.model.moe``); None for a dense model. Written to
        vLLM's documented fields (``RequestOutput.prompt_routed_experts``, ``CompletionOutput.routed_experts``)
        and not run here: no GPU in this project's CI."""
        if self.route_dtype is not None:
            engine_kwargs.setdefault("enable_return_routed_experts", True)
        self.max_context = 0
        self._args = AsyncEngineArgs(
            model=str(model), dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len, seed=seed, tensor_parallel_size=tensor_parallel_size,
            enforce_eager=enforce_eager, enable_prefix_caching=enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            structured_outputs_config={"backend": "guidance"},  # llguidance, the torch engine's grammars
            worker_extension_cls=f"{WeightSync.__module__}.{WeightSync.__qualname__}",
            disable_log_stats=True,
            hf_overrides=head_overrides(dtype, lm_head_fp32, engine_kwargs.pop("hf_overrides", None)), **engine_kwargs)
        self._ids = itertools.count()
        self._inflight: dict[asyncio.Task, str] = {}  # admitted requests (task -> vLLM request id); engine loop only
        self._paused = False
        self._loading = False
        self._vllm_paused = False
        self._llm = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rlonce-vllm-engine", daemon=True)
        self._thread.start()
        try:
            self._call(self._start())
        except BaseException:
            self._stop_loop()
            raise

    # ---- contract ------------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, watch: Watch | None = None) -> Generation:
        check_prompt(prompt_ids, sampling, self.max_context)
        fut = asyncio.run_coroutine_threadsafe(self._generate(list(prompt_ids), sampling, watch), self._loop)
        return await asyncio.wrap_future(fut)

    def load_weights(self, state, version: int) -> None:
        """Load ``state`` (a state dict, a folder of ``*.safetensors`` files, or under LoRA an
        ``AdapterWeights``) into every worker, reset the prefix cache and stamp later tokens
        ``version``. Raises while requests are in flight and the engine is not paused: no request
        may mix two versions."""
        from rlonce.model import lora

        if isinstance(state, lora.AdapterWeights):
            if self._lora_dir is None:
                raise ValueError("an adapter was published to a vLLM engine started without LoRA (lora_rank 0)")
            folder = lora.save_peft(state, self._lora_dir / f"v{version}", self.base)
            payload: tuple[str, object] = ("lora", str(folder))
        elif isinstance(state, (str, os.PathLike)):
            path = Path(state).resolve()
            if not any(path.glob("*.safetensors")):
                raise FileNotFoundError(f"{path} holds no *.safetensors file")
            payload = ("folder", str(path))
        else:
            payload = ("tensors", pack_tensors(state))
        self._call(self._load(payload, version))

    def pause(self) -> None:
        """Abort every in-flight request ('abort', with the tokens so far) and hold new ones until
        resume(). Returns once every aborted request has come back."""
        self._call(self._pause())

    def resume(self) -> None:
        self._call(self._resume())

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            if self._llm is not None:
                self._call(self._shutdown(), timeout=120)
        finally:
            self._stop_loop()
            if self._lora_dir is not None:
                shutil.rmtree(self._lora_dir, ignore_errors=True)

    # ---- on the engine loop --------------------------------------------------------------------
    def _call(self, coro, timeout: float | None = None):
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("VLLMEngine's synchronous methods cannot be called from its own event loop")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self._loop.close()

    async def _start(self) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        self._open = asyncio.Event()
        self._open.set()
        self._llm = AsyncLLM.from_engine_args(self._args)
        await self._llm.update_weight_version(str(self.version))
        self.max_context = self._llm.model_config.max_model_len

    async def _shutdown(self) -> None:
        self._llm.shutdown()

    def _gate(self) -> None:
        if self._paused or self._loading:
            self._open.clear()
        else:
            self._open.set()

    async def _generate(self, prompt_ids: list[int], sampling: SamplingParams, watch: Watch | None) -> Generation:
        while not self._open.is_set():
            await self._open.wait()
        task, rid = asyncio.current_task(), f"rlonce-{next(self._ids)}"
        self._inflight[task] = rid  # no await between the gate and here: pause() and _load() see it
        try:
            return await self._stream(rid, prompt_ids, sampling, self.version, watch)
        finally:
            del self._inflight[task]

    def _params(self, s: SamplingParams):
        from vllm.sampling_params import RequestOutputKind
        from vllm.sampling_params import SamplingParams as VSamplingParams

        return VSamplingParams(n=1, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, seed=s.seed,
                               max_tokens=s.max_tokens, logprobs=CANDIDATE_LOGPROBS if s.records_candidates else 0,
                               stop_token_ids=self.eos_token_ids, detokenize=False,
                               output_kind=RequestOutputKind.DELTA, **structured(s.constraint))

    async def _stream(self, rid: str, prompt_ids: list[int], s: SamplingParams, version: int,
                      watch: Watch | None = None) -> Generation:
        from vllm.exceptions import RetryableRequestError
        from vllm.inputs import TokensPrompt

        t0 = time.perf_counter()
        tokens: list[int] = []
        logps: list[float] = []
        sizes: list[int] | None = [] if s.records_candidates else None
        reason: str | None = None
        cached, run, run_thr = 0, 0, math.log(s.confident_p)
        prompt_routes, gen_routes = None, []
        stream = self._llm.generate(TokensPrompt(prompt_token_ids=prompt_ids), self._params(s), rid,
                                    lora_request=self._lora)
        try:
            async with contextlib.aclosing(stream):  # leaving early aborts the request in vLLM
                async for out in stream:
                    cached = max(cached, out.num_cached_tokens or 0)
                    c = out.outputs[0]
                    if self.route_dtype is not None:
                        if getattr(out, "prompt_routed_experts", None) is not None:
                            prompt_routes = out.prompt_routed_experts
                        if getattr(c, "routed_experts", None) is not None:  # per delta: the new tokens'
                            gen_routes.append(c.routed_experts)
                    if reason is None:  # after the stop rule fired, the rest of the stream is dropped
                        ids, lps = list(c.token_ids), c.logprobs or []
                        if len(lps) != len(ids):
                            raise EngineError(f"vLLM returned {len(lps)} log-probs for {len(ids)} tokens")
                        for i, (t, pos) in enumerate(zip(ids, lps)):
                            tokens.append(t)
                            logps.append(float(pos[t].logprob))
                            if sizes is not None:
                                sizes.append(candidate_size([p.logprob for p in pos.values()], CANDIDATE_LOGPROBS,
                                                            s.top_k))
                            run = run + 1 if logps[-1] > run_thr else 0
                            eos_here = i == len(ids) - 1 and c.finish_reason == "stop"
                            stop_here = watch is not None and watch(t)  # every kept token reaches the watch
                            if s.stop_confident_run and run >= s.stop_confident_run and not eos_here:
                                reason = "repetition"
                                break
                            if stop_here and not eos_here:
                                reason = "stop_sequence"
                                break
                        if reason in ("repetition", "stop_sequence") and not out.finished:
                            await self._llm.abort(rid)
                    if out.finished:
                        reason = reason or c.finish_reason
                        self._check_spans(rid, c.weight_versions, version)
        except RetryableRequestError:  # reached vLLM just after pause(): the caller continues later
            reason = "abort"
        except EngineError:
            raise
        except Exception as e:  # the retry boundary: the caller turns this into engine_error
            raise EngineError(f"vLLM: {type(e).__name__}: {e}") from e
        if reason not in ("stop", "length", "abort", "repetition", "stop_sequence"):
            raise EngineError(f"vLLM ended request {rid} with finish reason {reason!r}")
        return Generation(tokens, logps, [version] * len(tokens), reason,
                          metrics={"prompt_tokens": len(prompt_ids), "cached_prompt_tokens": cached,
                                   "seconds": time.perf_counter() - t0,
                                   "candidate_sets_unknown": float(sizes.count(0) if sizes else 0)},
                          candidates=sizes, routes=self._routes(prompt_routes, gen_routes, len(prompt_ids), tokens))

    def _routes(self, prompt_routes, gen_routes: list, n_prompt: int, tokens: list[int]):
        """The experts of the prompt and of every sampled token but the last, as the torch engine
        gives them (``Generation.routes``); None where vLLM returned none or fewer than that."""
        if self.route_dtype is None or prompt_routes is None:
            return None
        import numpy as np

        prompt = np.asarray(prompt_routes)
        gen = [np.asarray(r).reshape(-1, *prompt.shape[1:]) for r in gen_routes]
        if sum(len(g) for g in gen) > len(tokens) and gen:  # each output held all the tokens so far, not a delta
            gen = gen[-1:]
        routes = np.concatenate([prompt, *gen])
        want = n_prompt + len(tokens) - 1
        return routes[:want].astype(self.route_dtype) if len(routes) >= want else None

    @staticmethod
    def _check_spans(rid: str, spans, version: int) -> None:
        if spans and any(sp.version != str(version) for sp in spans):
            raise EngineError(f"request {rid} was stamped version {version} but vLLM sampled it under "
                              f"{[(sp.version, sp.start, sp.end) for sp in spans]}")

    async def _pause(self) -> None:
        self._paused = True
        self._gate()
        if not self._vllm_paused:
            await self._llm.pause_generation(mode="abort", clear_cache=False)
            self._vllm_paused = True
        # A request admitted just before the gate closed may reach vLLM after the pause (0.33
        # rejects it, 0.32 queues it): abort by id until every admitted request has come back.
        deadline = time.monotonic() + self.pause_timeout_s
        while self._inflight:
            if time.monotonic() > deadline:
                raise EngineError(f"{len(self._inflight)} requests did not stop within {self.pause_timeout_s}s")
            await self._llm.abort(list(self._inflight.values()))
            await asyncio.wait(list(self._inflight), timeout=0.05)

    async def _resume(self) -> None:
        if self._vllm_paused:
            await self._llm.resume_generation()
            self._vllm_paused = False
        self._paused = False
        self._gate()

    async def _load(self, payload: tuple[str, object], version: int) -> None:
        if self._inflight:  # pause() returns only once none is left
            raise RuntimeError(f"load_weights with {len(self._inflight)} requests in flight: call pause() first, "
                               "so that no request mixes two policy versions")
        self._loading = True
        self._gate()
        try:
            kind, data = payload
            if kind == "lora":
                await self._swap_lora(data, version)
            elif kind == "folder":
                await self._llm.collective_rpc("rlonce_load_folder", args=(data,))
            else:
                for chunk in data:
                    await self._llm.collective_rpc("rlonce_load_tensors", args=(chunk,))
            if not await self._llm.reset_prefix_cache():
                raise EngineError("vLLM could not reset its prefix cache after the weight load")
            await self._llm.update_weight_version(str(version))
            self.version = version
        finally:
            self._loading = False
            self._gate()


    async def _swap_lora(self, path: str, version: int) -> None:
        from vllm.lora.request import LoRARequest

        new = LoRARequest(lora_name=f"rlonce-v{version}", lora_int_id=version + 1, lora_path=path)
        if not await self._llm.add_lora(new):
            raise EngineError(f"vLLM did not load the adapter of version {version} from {path}")
        old, self._lora = self._lora, new
        if old is not None and old.lora_int_id != new.lora_int_id:
            await self._llm.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts."""


def vllm_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of ``rank``."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"model.lora.rank {rank} is above vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]})")


def structured(c: Constraint | None) -> dict:
    """vLLM's structured-output request for ``c`` (its ``guidance`` backend is llguidance, so a
    Lark grammar reads as it does in the torch engine). Written to vLLM's ``StructuredOutputsParams``
    (0.12 and later); not run here without a GPU. A ``prefix`` (a resumed turn) is refused: vLLM
    cannot start a grammar part-way."""
    if c is None:
        return {}
    if c.prefix:
        raise ValueError("the vLLM engine cannot resume a constrained turn part-way")
    from vllm.sampling_params import StructuredOutputsParams

    key = {"json_schema": "json", "regex": "regex", "choice": "choice", "lark": "grammar"}[c.kind]
    value = json.loads(c.spec) if c.kind in ("json_schema", "choice") else c.spec
    return {"structured_outputs": StructuredOutputsParams(**{key: value})}
