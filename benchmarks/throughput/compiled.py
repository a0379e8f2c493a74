"""``--parts compile``: would ``torch.compile`` pay for decoding on this CPU? ``--parts solo``: what the
engine's compiled one-row decoding (``engine.compile_solo``) buys.

Greedy decoding of one model, three ways at the same batch size: the eager model over a growing
``DynamicCache`` (the raw baseline of the decode part), the eager model over a transformers
``StaticCache`` (fixed-size buffers, so every step has the same shapes), and
``torch.compile(model, dynamic=False)`` over that ``StaticCache``. The compiled model's first
calls at each batch size (compilation) are timed apart and reported, not hidden in the rate.

Then the engine's own decode path: a ``TorchEngine`` whose model is ``torch.compile(...,
dynamic=True)`` (its caches grow by a column each step, so static shapes would recompile at every
token). Whether that compiles, and its tokens/s when it does, are reported next to the eager
engine. Every loop's time includes its prompt's prefill, as the raw loop's does.

``train_compile``: a training forward + backward (full-vocabulary cross-entropy, padded rows of
80–128 tokens, two threads, as the trainer runs) eager vs ``torch.compile(..., dynamic=True)``,
compile time apart — whether compiling the training step would pay.

``solo_pair``: the engine with ``compile_solo`` (a batch down to one row decodes compiled over a
static cache) vs the raw loop and the eager engine at one session, and vs the eager engine on a
ragged wave — 16 sessions of 16 to 256 new tokens, whose tail runs one row at a time. The first
calls (compiling each static cache size) are timed apart. ``solo_mismatch``: how far the engine's
log-probs are from the trainer's recomputation, eager and compiled, in float32 and under bfloat16
autocast (the gap a run's ``mismatch_*`` metrics report).
"""

from __future__ import annotations

import time


def static_decode(model, fwd, prompt_len: int, batch: int, new_tokens: int) -> float:
    """Tokens/s of a greedy loop over a ``StaticCache`` sized for the prompt and the new tokens."""
    import torch
    from transformers import StaticCache

    ids = torch.randint(10, 700, (batch, prompt_len))
    t0 = time.perf_counter()
    with torch.inference_mode():
        cache = StaticCache(config=model.config, max_batch_size=batch, max_cache_len=prompt_len + new_tokens,
                            dtype=next(model.parameters()).dtype)
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, cache_position=torch.arange(prompt_len))
        for i in range(new_tokens):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            p = prompt_len + i
            out = fwd(input_ids=nxt, position_ids=torch.full((batch, 1), p), past_key_values=cache, use_cache=True,
                      cache_position=torch.tensor([p]))
    return batch * new_tokens / (time.perf_counter() - t0)


def compile_pair(results: dict, raw_model, make_engine, args, raw_decode, engine_decode) -> None:
    import copy

    import torch

    model = copy.deepcopy(raw_model).eval()
    compiled = torch.compile(model, dynamic=False)
    for batch in (1, 16):
        t0 = time.perf_counter()
        static_decode(model, compiled, args.prompt_len, batch, 4)
        compile_s = time.perf_counter() - t0
        runs = []
        for _ in range(args.repeats):
            raw = raw_decode(raw_model, args.prompt_len, batch, args.new_tokens)
            eager_static = static_decode(model, model, args.prompt_len, batch, args.new_tokens)
            comp = static_decode(model, compiled, args.prompt_len, batch, args.new_tokens)
            runs.append((raw, eager_static, comp))
        med = [sorted(r[i] for r in runs)[len(runs) // 2] for i in range(3)]
        results[f"compile_{batch}"] = {
            "what": f"decode, batch {batch}, torch.compile + StaticCache, tokens/s", "baseline": "raw model",
            "raw": med[0], "rlonce": med[2],
            "detail": {"eager_static_tps": med[1], "compile_s": compile_s, "runs": runs}}
    eager, dyn = make_engine(), make_engine()
    dyn.model = torch.compile(dyn.model, dynamic=True)
    t0 = time.perf_counter()
    try:
        engine_decode(dyn, args.prompt_len, 1, 8)
        error = None
    except Exception as e:  # what inductor says is the result
        said = [line.strip() for line in str(e).splitlines() if "Error:" in line] or [str(e)]
        error = f"{type(e).__name__}: {said[-1][:240]}"
    detail = {"compile_s": time.perf_counter() - t0, "error": error}
    if error is None:
        engine_decode(dyn, args.prompt_len, 16, 8)
        detail["engine_tps"] = {b: (engine_decode(eager, args.prompt_len, b, args.new_tokens),
                                    engine_decode(dyn, args.prompt_len, b, args.new_tokens)) for b in (1, 16)}
    results["compile_engine"] = {"what": "TorchEngine, torch.compile(dynamic=True)", "detail": detail}
    eager.close()
    dyn.close()


def ragged_decode(engine, prompt_len: int, sessions: int = 16, longest: int = 256) -> float:
    """Tokens/s of ``sessions`` concurrent requests asking for 16 to ``longest`` new tokens."""
    import asyncio

    import torch

    from rlonce.engine.base import SamplingParams

    lengths = [16 + (longest - 16) * i // max(1, sessions - 1) for i in range(sessions)]
    prompts = [torch.randint(10, 700, (prompt_len,)).tolist() for _ in lengths]

    async def go():
        return await asyncio.gather(*(engine.generate(p, SamplingParams(max_tokens=n))
                                      for p, n in zip(prompts, lengths)))

    t0 = time.perf_counter()
    gens = asyncio.run(go())
    return sum(len(g.token_ids) for g in gens) / (time.perf_counter() - t0)


def solo_pair(results: dict, raw_model, make_engine, args, raw_decode, engine_decode) -> None:
    eager, solo = make_engine(), make_engine(compile_solo=True)
    t0 = time.perf_counter()
    engine_decode(solo, args.prompt_len, 1, 8)  # the static cache size of one session of this benchmark
    ragged_decode(solo, args.prompt_len)  # and of the ragged wave's longest rows
    compile_s = time.perf_counter() - t0
    if solo.solo.failed:
        results["solo_failed"] = {"what": "engine.compile_solo", "detail": {"error": solo.solo.failed}}
        return
    engine_decode(eager, args.prompt_len, 1, 8)
    ragged_decode(eager, args.prompt_len)
    one, ragged = [], []
    for _ in range(3 * args.repeats):  # short measurements, and noisy ones
        one.append((raw_decode(raw_model, args.prompt_len, 1, args.new_tokens),
                    engine_decode(eager, args.prompt_len, 1, args.new_tokens),
                    engine_decode(solo, args.prompt_len, 1, args.new_tokens)))
        ragged.append((ragged_decode(eager, args.prompt_len), ragged_decode(solo, args.prompt_len)))
    med = [sorted(r[i] for r in one)[len(one) // 2] for i in range(3)]
    results["solo_1"] = {
        "what": "decode, 1 session, engine.compile_solo, tokens/s", "baseline": "raw model", "raw": med[0],
        "rlonce": med[2], "detail": {"eager_engine_tps": med[1], "compile_s": compile_s, "runs": one,
                                     "stats": solo.stats}}
    rmed = [sorted(r[i] for r in ragged)[len(ragged) // 2] for i in range(2)]
    results["solo_ragged"] = {
        "what": "decode, 16 sessions of 16-256 new tokens, engine.compile_solo, tokens/s", "baseline": "eager engine",
        "raw": rmed[0], "rlonce": rmed[1], "detail": {"runs": ragged}}
    eager.close()
    solo.close()


def train_compile(results: dict, raw_model, args) -> None:
    import copy

    import torch

    shapes = [(16, 96), (16, 128), (16, 112), (16, 80)]

    def run(fwd, model) -> float:
        t0 = time.perf_counter()
        for B, T in shapes:
            ids = torch.randint(10, 700, (B, T))
            logits = fwd(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, :-1]
            torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                              ids[:, 1:].reshape(-1)).backward()
            model.zero_grad(set_to_none=True)
        return sum(B * T for B, T in shapes) / (time.perf_counter() - t0)

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    eager, other = copy.deepcopy(raw_model).train(), copy.deepcopy(raw_model).train()
    compiled = torch.compile(other, dynamic=True)
    t0 = time.perf_counter()
    run(compiled, other)
    compile_s = time.perf_counter() - t0
    runs = [(run(eager, eager), run(compiled, other)) for _ in range(args.repeats)]
    torch.set_num_threads(threads)
    med = [sorted(r[i] for r in runs)[len(runs) // 2] for i in range(2)]
    results["compile_train"] = {
        "what": "train forward+backward, 64 padded rows of 80-128 tokens, torch.compile(dynamic=True), tokens/s",
        "baseline": "eager", "raw": med[0], "rlonce": med[1], "detail": {"compile_s": compile_s, "runs": runs}}


def solo_mismatch(results: dict, model_dir: str, prompts: int = 4, new_tokens: int = 64) -> None:
    """Largest and mean |engine log-prob - trainer log-prob| over ``prompts`` generations, per mode."""
    import asyncio
    import copy

    import torch

    from rlonce.engine.base import SamplingParams
    from rlonce.engine.torch_engine import TorchEngine
    from rlonce.model.loader import load
    from rlonce.train.trainer import token_logprobs

    detail = {}
    for autocast in (False, True):
        lm = load(model_dir, autocast=autocast)
        for compiled in (False, True):
            eng = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=[], pad_token_id=0, compile_solo=compiled)
            gaps = []
            for i in range(prompts):
                prompt = [1] + torch.randint(10, 700, (40,), generator=torch.Generator().manual_seed(i)).tolist()
                g = asyncio.run(eng.generate(prompt, SamplingParams(max_tokens=new_tokens, seed=i)))
                ids = torch.tensor([prompt + g.token_ids])
                with torch.no_grad():
                    lp, _ = token_logprobs(lm.model, ids, torch.ones_like(ids))
                gaps.append((lp[0, len(prompt) - 1:] - torch.tensor(g.logprobs)).abs())
            gap = torch.cat(gaps)
            detail[f"{'bfloat16' if autocast else 'float32'}, {'compiled' if compiled else 'eager'}"] = {
                "max_abs": gap.max().item(), "mean_abs": gap.mean().item(),
                "compiled_steps": eng.stats.get("compiled_steps", 0)}
            eng.close()
    results["solo_mismatch"] = {"what": "engine vs trainer log-probs, |difference|", "detail": detail}
