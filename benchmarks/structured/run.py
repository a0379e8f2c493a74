"""Decode throughput with a JSON-schema constraint against without, same batch (docs/gateway.md,
"Structured output"; issue goal: ≥ 0.8×).

    python benchmarks/structured/run.py --out DIR [--models embedded smollm2] [--batches 1 16 64]
                                        [--max-tokens 64] [--repeats 3]

Per model and batch size, the torch engine (one torch thread per ``--threads``) samples
``--max-tokens`` tokens for every row of one batch, twice per repeat and alternating: unconstrained,
then every row under a JSON schema (an object holding a long array of strings: a reply that cannot
close within the budget, so both arms sample exactly the same number of tokens; the engine is built
without end-of-turn tokens for the same reason). Tokens per second of each, and their ratio, from
the medians; the masks' own share of the constrained arm's time is measured too (``Masks.apply`` and
``advance`` timed in place). Writes ``results.json``, ``results.md`` and ``structured.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import time
from pathlib import Path

SCHEMA = {"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "string"}, "minItems": 10000}},
          "required": ["notes"], "additionalProperties": False}


def _run(engine, prompts, sampling) -> float:
    async def go():
        return await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))

    t = time.perf_counter()
    gens = asyncio.run(go())
    took = time.perf_counter() - t
    assert all(len(g.token_ids) == sampling.max_tokens for g in gens), [len(g.token_ids) for g in gens]
    return sum(len(g.token_ids) for g in gens) / took


class _Timed:
    """``Masks`` with its two calls timed (seconds summed into ``spent``)."""

    def __init__(self, masks):
        self.masks, self.spent = masks, 0.0

    def __getattr__(self, name):
        return getattr(self.masks, name)

    def apply(self, *a):
        t = time.perf_counter()
        try:
            return self.masks.apply(*a)
        finally:
            self.spent += time.perf_counter() - t

    def advance(self, *a):
        t = time.perf_counter()
        try:
            return self.masks.advance(*a)
        finally:
            self.spent += time.perf_counter() - t


def measure(model: str, batches: list[int], max_tokens: int, repeats: int) -> list[dict]:
    from rlonce.engine import constrain
    from rlonce.engine.base import SamplingParams
    from rlonce.engine.torch_engine import TorchEngine
    from rlonce.model import loader

    lm = loader.load(loader.resolve(model, "runs/bench/structured-cache"))
    engine = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=[], pad_token_id=lm.tokenizer.pad_token_id or 0,
                         max_batch_size=max(batches), tokenizer=lm.tokenizer, prefix_cache_mb=0)
    engine._masks.eos = lm.eos_token_ids  # the grammar's own end (never reached: the schema cannot close)
    timed = engine._masks = _Timed(engine._masks)
    prompt = lm.encode(lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "List notes about the weather as JSON."}], tokenize=False,
        add_generation_prompt=True))
    plain = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=0)
    shaped = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=0, constraint=constrain.json_schema(SCHEMA))
    _run(engine, [prompt], shaped)  # llguidance's view of the tokenizer is built once, here
    rows = []
    for b in batches:
        prompts = [prompt] * b
        free, held, mask_share = [], [], []
        for _ in range(repeats):
            free.append(_run(engine, prompts, plain))
            timed.spent, t = 0.0, time.perf_counter()
            held.append(_run(engine, prompts, shaped))
            mask_share.append(timed.spent / (time.perf_counter() - t))
        f, h = statistics.median(free), statistics.median(held)
        rows.append({"model": model, "batch": b, "tokens_per_s_free": f, "tokens_per_s_constrained": h,
                     "ratio": h / f, "mask_share": statistics.median(mask_share), "free": free, "constrained": held})
        print(f"{model} batch {b}: {f:.0f} tok/s free, {h:.0f} constrained, ratio {h / f:.2f} "
              f"(masks {100 * statistics.median(mask_share):.0f}% of the constrained time)", flush=True)
    engine.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", nargs="+", default=["embedded", "smollm2"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 16, 64])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    from rlonce.telemetry.bench import paired_bars, write_table

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for m in args.models for r in measure(m, args.batches, args.max_tokens, args.repeats)]
    (out / "results.json").write_text(json.dumps({"max_tokens": args.max_tokens, "repeats": args.repeats,
                                                  "threads": args.threads, "rows": rows}, indent=1))
    table = write_table(out / "results.md", ["model", "batch", "tok/s free", "tok/s JSON schema", "ratio",
                                             "masks' share"],
                        [[r["model"], str(r["batch"]), f"{r['tokens_per_s_free']:.0f}",
                          f"{r['tokens_per_s_constrained']:.0f}", f"{r['ratio']:.2f}", f"{100 * r['mask_share']:.0f}%"]
                         for r in rows])
    paired_bars(out / "structured.png", [f"{r['model']} ×{r['batch']}" for r in rows],
                {"free": [r["tokens_per_s_free"] for r in rows],
                 "JSON schema": [r["tokens_per_s_constrained"] for r in rows]},
                ylabel="tokens / s", title="Decode throughput, constrained vs free (same batch)")
    print(table)


if __name__ == "__main__":
    main()
