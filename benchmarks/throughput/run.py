"""Throughput of the torch engine and the trainer, each next to the raw model measured in the same run.

    python benchmarks/throughput/run.py --out DIR

* decode: ``TorchEngine.generate`` with 1 and 16 concurrent sessions vs a bare
  ``model(...)`` + ``DynamicCache`` greedy loop at the same batch size (the floor any engine
  built on this model pays);
* train: ``Trainer.rl_step`` (PPO-clip, token-mean) vs a bare forward + backward + AdamW step
  on the same padded batch.

Each pair runs interleaved, ``--repeats`` times, and the table reports medians and the ratio
(engine / raw, trainer / raw): this machine is shared and noisy, so only side-by-side ratios
mean anything. Writes ``results.json``, ``results.md`` and ``throughput.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path


def raw_decode(model, prompt_len: int, batch: int, new_tokens: int) -> float:
    import torch
    from transformers import DynamicCache

    ids = torch.randint(10, 700, (batch, prompt_len))
    t0 = time.perf_counter()
    with torch.inference_mode():
        cache = DynamicCache()
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        for _ in range(new_tokens):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
    return batch * new_tokens / (time.perf_counter() - t0)


def engine_decode(engine, prompt_len: int, batch: int, new_tokens: int) -> float:
    import torch

    from rlonce.engine.base import SamplingParams

    prompts = [torch.randint(10, 700, (prompt_len,)).tolist() for _ in range(batch)]

    async def go():
        return await asyncio.gather(*(engine.generate(p, SamplingParams(max_tokens=new_tokens)) for p in prompts))

    t0 = time.perf_counter()
    gens = asyncio.run(go())
    wall = time.perf_counter() - t0
    return sum(len(g.token_ids) for g in gens) / wall


def _rows(batch: int, length: int):
    import random

    from rlonce.core.records import TrainingRow

    rng = random.Random(0)
    rows = []
    for b in range(batch):
        n = length - rng.randint(0, length // 4)
        mask = [0] * (n // 3) + [1] * (n - n // 3)
        rows.append(TrainingRow([rng.randint(10, 700) for _ in range(n)], mask, [-1.0 * m for m in mask],
                                [(1.0 if b % 2 else -1.0) * m for m in mask], [0 if m else -1 for m in mask],
                                group_id=str(b // 4)))
    return rows


def raw_train(model, opt, rows) -> float:
    import torch

    from rlonce.train.trainer import pad_rows

    b = pad_rows(rows)
    t0 = time.perf_counter()
    logits = model(input_ids=b.ids_BT, attention_mask=b.attn_BT).logits[:, :-1]
    lp = logits.float().log_softmax(-1).gather(-1, b.ids_BT[:, 1:, None])[..., 0]
    (-(lp * b.mask_BT).sum() / b.mask_BT.sum()).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return sum(len(r) for r in rows) / (time.perf_counter() - t0)


def trainer_train(trainer, rows) -> float:
    from rlonce.config import load_config
    from rlonce.train.builders import rl_step_kwargs

    kw = rl_step_kwargs(load_config(None, ["rl.minibatches=1"]), len(rows), step=0, version=0)
    t0 = time.perf_counter()
    trainer.rl_step(rows, **kw)
    return sum(len(r) for r in rows) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description="engine and trainer throughput vs the raw model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=120)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--train-rows", type=int, default=32)
    ap.add_argument("--train-len", type=int, default=256)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import copy
    import tempfile

    import torch

    from rlonce.engine.torch_engine import TorchEngine
    from rlonce.model.loader import load, materialize_embedded
    from rlonce.train.trainer import OptimSettings, Trainer

    lm = load(materialize_embedded(Path(tempfile.mkdtemp()) / "embedded"))
    raw_model = copy.deepcopy(lm.model).eval()
    engine = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=[], pad_token_id=0, max_batch_size=64,
                         batch_wait_s=0.002)
    results: dict[str, dict] = {}
    torch.set_num_threads(1)
    for batch in (1, 16):
        raw, eng = [], []
        raw_decode(raw_model, args.prompt_len, batch, 8)  # warm-up
        engine_decode(engine, args.prompt_len, batch, 8)
        for _ in range(args.repeats):
            raw.append(raw_decode(raw_model, args.prompt_len, batch, args.new_tokens))
            eng.append(engine_decode(engine, args.prompt_len, batch, args.new_tokens))
        results[f"decode_{batch}"] = {"what": f"decode, {batch} concurrent session(s), tokens/s", "threads": 1,
                                      "raw": statistics.median(raw), "rlonce": statistics.median(eng)}
    engine.close()

    torch.set_num_threads(2)
    rows = _rows(args.train_rows, args.train_len)
    model_a, model_b = copy.deepcopy(lm.model), copy.deepcopy(lm.model)
    opt = torch.optim.AdamW(model_a.parameters(), lr=1e-5)
    trainer = Trainer(model_b, OptimSettings(lr=1e-5), micro_batch_tokens=1 << 20)
    raw_train(model_a, opt, rows)
    trainer_train(trainer, rows)
    raw, tr = [], []
    for _ in range(args.repeats):
        raw.append(raw_train(model_a, opt, rows))
        tr.append(trainer_train(trainer, rows))
    results["train"] = {"what": f"train step, {args.train_rows}x{args.train_len} tokens, tokens/s", "threads": 2,
                        "raw": statistics.median(raw), "rlonce": statistics.median(tr)}
    for r in results.values():
        r["ratio"] = r["rlonce"] / r["raw"]
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    from rlonce.telemetry.bench import paired_bars, write_table

    table = write_table(out / "results.md", ["measurement", "torch threads", "raw model", "rlonce", "rlonce / raw"],
                        [[r["what"], str(r["threads"]), f"{r['raw']:.0f}", f"{r['rlonce']:.0f}", f"{r['ratio']:.2f}"]
                         for r in results.values()])
    print(table)
    names = list(results)
    paired_bars(out / "throughput.png", names, {"raw model": [results[n]["raw"] for n in names],
                                                "rlonce": [results[n]["rlonce"] for n in names]},
                ylabel="tokens / s", title="Embedded model throughput (median of repeats)")

if __name__ == "__main__":
    main()
