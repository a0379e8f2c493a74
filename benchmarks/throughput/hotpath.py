"""Two engine hot-path measurements of ``run.py``:

* fastdecode: the engine with the written-out Llama-family decode step
  (``TorchEngine(fast_decode=...)``, on with ``engine.fast_path``, the default) vs transformers'
  forward, at 1, 16 and 64 concurrent sessions, one torch thread and (at 64) two;
* native: the same, with the decode step's work besides its matrix products in
  ``rlonce.engine.fast.native``'s C loops (``TorchEngine(native_kernels=...)``, on with
  ``engine.fast_path``) vs torch's operations;
* omp: a local run's two compute threads in turn — the engine's worker decoding 64 sessions, the
  main thread running a training step, both with two torch threads — with each handing back its
  OpenMP team when its phase ends (``rlonce.model.omp``, the default) vs without (``release`` made
  a no-op): decode tokens/s, and the training step's tokens/s in the detail;
* adamw: one AdamW step over the model's parameters (random gradients), torch's default
  per-tensor loop vs the fused kernel the trainer builds (``rlonce.train.trainer.Trainer``),
  two torch threads: millions of parameters updated per second.
* gqa: attention with a mask on CPU keeping grouped key/value heads as they are (the model's
  attention route, ``rlonce.model.packing``) vs transformers' ``sdpa``, which copies them out per
  query head whenever a mask is given: the engine prefilling 48 prompts of ragged lengths
  (left-padded: a masked prefill), one thread, and ``Trainer.rl_step`` on a GRPO batch (8 prompts ×
  8 completions: rows reading a shared prompt attend with a mask), two threads.
"""

from __future__ import annotations

import asyncio
import copy
import statistics


def fastdecode_pair(results: dict, lm, args, engine_decode, pair) -> None:
    knob_pair(results, lm, args, engine_decode, pair, "fast_decode", "fastdecode", "transformers' forward")


def native_pair(results: dict, lm, args, engine_decode, pair) -> None:
    knob_pair(results, lm, args, engine_decode, pair, "native_kernels", "native", "torch's operations")


def knob_pair(results: dict, lm, args, engine_decode, pair, knob: str, key: str, base_name: str) -> None:
    """Engine decode tokens/s with the ``TorchEngine`` flag ``knob`` off vs on, at 1, 16 and 64
    concurrent sessions with one torch thread and at 64 with two."""
    import torch

    from rlonce.engine.torch_engine import TorchEngine
    from rlonce.model import omp

    for batch, threads in ((1, 1), (16, 1), (64, 1), (64, 2)):
        torch.set_num_threads(threads)
        engines = [TorchEngine(copy.deepcopy(lm.model), eos_token_ids=[], pad_token_id=0, max_batch_size=64,
                               batch_wait_s=0.002, **{knob: on}) for on in (False, True)]
        omp.release()  # the copies ran here with two threads: as a run does, hand the team back before decoding
        for e in engines:
            engine_decode(e, args.prompt_len, batch, 8)  # warm-up
        runs = [tuple({"tps": engine_decode(e, args.prompt_len, batch, args.new_tokens)} for e in engines)
                for _ in range(args.repeats)]
        for e in engines:
            e.close()
        pair(results, f"{key}_{batch}x{threads}", f"decode, {batch} session(s), {threads} thread(s), tokens/s",
             base_name, runs, "tps")
    torch.set_num_threads(1)


def omp_pair(results: dict, lm, args, engine_decode, raw_train, rows, pair) -> None:
    import torch

    from rlonce.engine.torch_engine import TorchEngine
    from rlonce.model import omp

    real = omp.release
    runs = []
    torch.set_num_threads(2)
    model = copy.deepcopy(lm.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    try:
        for _ in range(args.repeats):
            pair_run = []
            for on in (False, True):
                omp.release = real if on else (lambda: False)
                eng = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=[], pad_token_id=0, max_batch_size=64,
                                  batch_wait_s=0.002, threads=2)
                decode_tps, train_tps = [], []
                for _ in range(3):  # decode, train, decode, train, ...
                    decode_tps.append(engine_decode(eng, args.prompt_len, 64, 32))
                    train_tps.append(raw_train(model, opt, rows))
                    omp.release()  # what the trainer backend does after its step
                eng.close()
                pair_run.append({"tps": sorted(decode_tps)[1], "train_tps": sorted(train_tps)[1]})
            runs.append(tuple(pair_run))
    finally:
        omp.release = real
        torch.set_num_threads(1)
    pair(results, "omp", "decode (64 sessions) alternating with training, 2 threads each, tokens/s",
         "teams kept", runs, "tps", ("train_tps",))


def adamw_pair(results: dict, lm, args, pair) -> None:
    import time

    import torch

    torch.set_num_threads(2)
    model = copy.deepcopy(lm.model)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    n = sum(p.numel() for p in params) / 1e6
    opts = [torch.optim.AdamW(params, lr=1e-5, fused=fused) for fused in (None, True)]

    def rate(opt) -> float:
        opt.step()  # the first step makes the moment buffers
        t0 = time.perf_counter()
        for _ in range(5):
            opt.step()
        return 5 * n / (time.perf_counter() - t0)

    runs = [tuple({"mps": rate(o)} for o in opts) for _ in range(args.repeats)]
    torch.set_num_threads(1)
    pair(results, "adamw", "an AdamW step, millions of parameters updated per second", "per-tensor loop", runs, "mps")


def gqa_pair(results: dict, lm, args, pair, train) -> None:
    import random
    import time

    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from rlonce.engine.base import SamplingParams
    from rlonce.engine.torch_engine import TorchEngine
    from rlonce.model import packing
    from rlonce.train.trainer import OptimSettings, Trainer

    rng = random.Random(0)
    prompts = [[rng.randint(10, 700) for _ in range(rng.randint(args.prompt_len // 2, args.prompt_len))]
               for _ in range(48)]

    def prefill(engine) -> float:
        async def go():
            return await asyncio.gather(*(engine.generate(p, SamplingParams(max_tokens=1)) for p in prompts))

        t0 = time.perf_counter()
        asyncio.run(go())
        return sum(map(len, prompts)) / (time.perf_counter() - t0)

    route = packing._sdpa
    try:
        torch.set_num_threads(1)
        engine = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=[], pad_token_id=0, max_batch_size=64,
                             batch_wait_s=0.01, prefix_cache_mb=0)
        runs = []
        for _ in range(args.repeats + 1):  # the first pair warms up
            side = []
            for on in (False, True):
                packing._sdpa = route if on else sdpa_attention_forward
                side.append({"tps": statistics.median(prefill(engine) for _ in range(3))})
            runs.append(tuple(side))
        engine.close()
        pair(results, "gqa_prefill", f"engine prefill, 48 prompts of {args.prompt_len // 2}-{args.prompt_len} "
             "tokens, prompt tokens/s", "sdpa copying key/value heads", runs[1:], "tps")
        torch.set_num_threads(2)
        trainer = Trainer(copy.deepcopy(lm.model), OptimSettings(lr=1e-5))
        runs = []
        for _ in range(args.repeats + 1):
            side = []
            for on in (False, True):
                packing._sdpa = route if on else sdpa_attention_forward
                side.append({"tps": train(trainer)})
            runs.append(tuple(side))
        pair(results, "gqa_train", f"train step, 8 prompts of {args.prompt_len} tokens x 8 completions, row tokens/s",
             "sdpa copying key/value heads", runs[1:], "tps")
    finally:
        packing._sdpa = route
        torch.set_num_threads(1)
