"""``--parts compile``: would ``torch.compile`` pay for decoding on this CPU?

Greedy decoding of one model, three ways at the same batch size: the eager model over a growing
``DynamicCache`` (the raw baseline of the decode part), the eager model over a transformers
``StaticCache`` (fixed-size buffers, so every step has the same shapes), and
``torch.compile(model, dynamic=False)`` over that ``StaticCache``. The compiled model's first
calls at each batch size (compilation) are timed apart and reported, not hidden in the rate.

Then the engine's own decode path: a ``TorchEngine`` whose model is ``torch.compile(...,
dynamic=True)`` (its caches grow by a column each step, so static shapes would recompile at every
token). Whether that compiles, and its tokens/s when it does, are reported next to the eager
engine. Nothing here is used by the product: it is the measurement that decides whether to build it.
"""

from __future__ import annotations

import time


def static_decode(model, fwd, prompt_len: int, batch: int, new_tokens: int) -> float:
    """Tokens/s of a greedy loop over a ``StaticCache`` sized for the prompt and the new tokens."""
    import torch
    from transformers import StaticCache

    ids = torch.randint(10, 700, (batch, prompt_len))
    with torch.inference_mode():
        cache = StaticCache(config=model.config, max_batch_size=batch, max_cache_len=prompt_len + new_tokens,
                            dtype=next(model.parameters()).dtype)
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, cache_position=torch.arange(prompt_len))
        t0 = time.perf_counter()
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
