"""Throughput of the torch engine and the trainer, each next to its baseline measured in the same run.

    python benchmarks/throughput/run.py --out DIR [--model embedded|smollm2] [--code-pack DIR]

* decode: ``TorchEngine.generate`` with 1 and 16 concurrent sessions vs a bare
  ``model(...)`` + ``DynamicCache`` greedy loop at the same batch size (the floor any engine
  built on this model pays);
* prefix reuse: multi-turn agent sessions (``sessions.py``: the scripted expert's toolfind
  sessions — and code-repair ones with ``--code-pack`` — replayed with the engine's own replies),
  all at once, with the engine keeping finished turns' caches vs prefilling every prompt whole;
  prompt tokens run per turn, and generated tokens/s;
* continuous batching: the toolfind sessions staggered, a tool call of 30–90 ms between turns,
  16 of them (the engine partly idle) and ``--sessions`` (saturated), with requests joining the
  running batch vs waiting for its wave to end: tokens/s and p50/p95 turn latency;
* train: ``Trainer.rl_step`` (PPO-clip, token-mean) vs a bare forward + backward + AdamW step
  on the same padded batch;
* packing: ``Trainer.rl_step`` with packed rows (``model.packing``, the default) vs right-padded
  micro-batches, on rows whose lengths spread like the reasoning workload's.
* prefix: ``Trainer.rl_step`` on a GRPO batch (8 prompts × 8 completions) with each prompt held
  once in the training forward (``model.share_prefix``, the default) vs every row run whole.
* microbatch: ``Trainer.rl_step`` on the same rows in micro-batches of
  ``runtime.micro_batch_tokens`` (2048, the default) vs all of them in one 16384-token
  micro-batch (the earlier fixed size): seconds, minor page faults and the resident-memory peak
  of each (measured in a child process of its own, so one's peak does not hide the other's).
* solo: the engine with ``engine.compile_solo`` (a batch down to one row decodes compiled over
  a static cache) at one session vs the raw loop (and the eager engine), and on a ragged wave of
  16 sessions (16–256 new tokens: the tail runs one row at a time) vs the eager engine; compile
  time apart; and the engine's log-prob gap to the trainer, eager and compiled, float32 and
  bfloat16 autocast (``compiled.py``).
* fastdecode, native, omp: the written-out Llama decode step vs transformers' forward; its work
  besides the matrix products in C loops (``TorchEngine(native_kernels=...)``, on with
  ``engine.fast_path``) vs torch's operations; and a local run's two compute threads handing back
  their OpenMP teams vs keeping them (``hotpath.py``).
* adamw: an AdamW step, torch's default per-tensor loop vs the fused kernel the trainer uses
  (``hotpath.py``).
* gqa: masked attention keeping grouped key/value heads (the model's attention route) vs
  transformers' ``sdpa``, which copies them per query head: engine prefill and a training step
  (``hotpath.py``).
* compile (only when asked: ``--parts compile``): ``torch.compile`` of the model over a
  transformers ``StaticCache`` vs the raw loop, compile time apart, whether the engine's
  growing-cache path compiles, and a compiled training forward + backward vs the eager one
  (``compiled.py``).

Each pair runs interleaved, ``--repeats`` times, and the table reports medians and the ratio
(rlonce / baseline): this machine is shared and noisy, so only side-by-side ratios mean
anything. The process's peak resident memory is reported too. Writes ``results.json``,
``results.md`` and ``throughput.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
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


def _rows(batch: int, length: int, spread: float = 0.25):
    """Rows of ``length·(1-spread)``–``length`` tokens, the first third prompt."""
    import random

    from rlonce.core.records import TrainingRow

    rng = random.Random(0)
    rows = []
    for b in range(batch):
        n = length - rng.randint(0, int(length * spread))
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
    from rlonce.train.builders import rl_request

    request = rl_request(load_config(None, ["rl.minibatches=1"]), len(rows), step=0, version=0)
    t0 = time.perf_counter()
    trainer.rl_step(rows, request)
    return sum(len(r) for r in rows) / (time.perf_counter() - t0)


def _pair(results: dict, key: str, what: str, base_name: str, runs: list[tuple[dict, dict]], metric: str,
          extra: tuple[str, ...] = ()) -> None:
    """Medians of a side-by-side measurement (baseline, rlonce) over its repeats, and each repeat's
    own ratio (its two sides measured next to each other)."""
    med = {side: {k: statistics.median(r[i][k] for r in runs) for k in (metric, *extra)} for i, side in
           enumerate(("base", "rlonce"))}
    results[key] = {"what": what, "baseline": base_name, "raw": med["base"][metric], "rlonce": med["rlonce"][metric],
                    "detail": {**med, "last": runs[-1], "pairs": [b[metric] / a[metric] for a, b in runs]}}


def sessions_pair(results, key, what, base_name, make, shapes, repeats, **replay_kw) -> None:
    """Replay ``shapes`` on a baseline engine and an rlonce one (``make(False)``, ``make(True)``), interleaved."""
    from sessions import replay

    runs = []
    for _ in range(repeats):
        pair = []
        for on in (False, True):
            engine = make(on)
            pair.append(asyncio.run(replay(engine, shapes, **replay_kw)))
            engine.close()
        runs.append(tuple(pair))
    _pair(results, key, what, base_name, runs, "tokens_per_s", ("turn_p50_s", "turn_p95_s"))


def train_pair(results: dict, lm, args) -> None:
    import copy

    import torch

    from rlonce.train.trainer import OptimSettings, Trainer

    torch.set_num_threads(2)
    rows = _rows(args.train_rows, args.train_len)
    model_a, model_b = copy.deepcopy(lm.model), copy.deepcopy(lm.model)
    opt = torch.optim.AdamW(model_a.parameters(), lr=1e-5)
    trainer = Trainer(model_b, OptimSettings(lr=1e-5), micro_batch_tokens=1 << 20)
    raw_train(model_a, opt, rows)
    trainer_train(trainer, rows)
    runs = [({"tps": raw_train(model_a, opt, rows)}, {"tps": trainer_train(trainer, rows)})
            for _ in range(args.repeats)]
    _pair(results, "train", f"train step, {args.train_rows}x{args.train_len} tokens, tokens/s", "raw model", runs,
          "tps")


def packing_pair(results: dict, lm, args) -> None:
    """``Trainer.rl_step`` with right-padded micro-batches vs packed rows, on rows whose lengths
    spread like the reasoning workload's (51–115 tokens: about a third of a padded batch is padding)."""
    import copy

    import torch

    from rlonce.train.trainer import OptimSettings, Trainer

    torch.set_num_threads(2)
    rows = _rows(args.train_rows * 2, args.train_len // 2, spread=0.55)
    padded, packed = copy.deepcopy(lm.model), copy.deepcopy(lm.model)
    padded.rlonce_packing = False
    trainers = [Trainer(m, OptimSettings(lr=1e-5), micro_batch_tokens=1 << 20) for m in (padded, packed)]
    for t in trainers:
        trainer_train(t, rows)
    runs = [tuple({"tps": trainer_train(t, rows)} for t in trainers) for _ in range(args.repeats)]
    waste = 1 - sum(len(r) for r in rows) / (len(rows) * max(len(r) for r in rows))
    _pair(results, "packing", f"train step, {len(rows)} rows of {min(len(r) for r in rows)}-"
          f"{max(len(r) for r in rows)} tokens ({waste:.0%} padding), tokens/s", "padded", runs, "tps")


def group_rows(prompt_len: int, new_tokens: int):
    """A GRPO batch: 8 prompts of ``prompt_len`` tokens × 8 completions of ``new_tokens``/2–``new_tokens``."""
    import random

    from rlonce.core.records import TrainingRow

    rng = random.Random(0)
    rows = []
    for g in range(8):
        prompt = [rng.randint(10, 700) for _ in range(prompt_len)]
        for s in range(8):
            n = rng.randint(new_tokens // 2, new_tokens)
            mask = [0] * len(prompt) + [1] * n
            rows.append(TrainingRow(prompt + [rng.randint(10, 700) for _ in range(n)], mask, [-1.0 * m for m in mask],
                                    [(1.0 if s % 2 else -1.0) * m for m in mask], [0 if m else -1 for m in mask],
                                    group_id=str(g)))
    return rows


def prefix_pair(results: dict, lm, args) -> None:
    """``Trainer.rl_step`` on a GRPO batch (8 prompts × 8 completions; prompts of ``--prompt-len``
    tokens, completions of up to ``--new-tokens``) with a group's prompt held once in the
    training forward (``model.share_prefix``, the default) vs every row run whole; the default
    micro-batch budget on both."""
    import copy

    import torch

    from rlonce.train.trainer import OptimSettings, Trainer

    torch.set_num_threads(2)
    rows = group_rows(args.prompt_len, args.new_tokens)
    whole, shared = copy.deepcopy(lm.model), copy.deepcopy(lm.model)
    whole.rlonce_share_prefix = False
    trainers = [Trainer(m, OptimSettings(lr=1e-5)) for m in (whole, shared)]
    for t in trainers:
        trainer_train(t, rows)
    runs = [tuple({"tps": trainer_train(t, rows)} for t in trainers) for _ in range(args.repeats)]
    _pair(results, "prefix", f"train step, 8 prompts of {args.prompt_len} tokens x 8 completions of "
          f"{args.new_tokens // 2}-{args.new_tokens}, row tokens/s", "every row whole", runs, "tps")


def _microbatch_child(model_dir: str, tokens: int, repeats: int, out) -> None:
    """One trainer, ``repeats`` + 1 ``rl_step``s (the first warms up): per step tokens/s and minor
    page faults, and the process's peak resident memory, put on ``out``."""
    import resource

    import torch

    from rlonce.model.loader import load
    from rlonce.train.trainer import OptimSettings, Trainer

    torch.set_num_threads(2)
    trainer = Trainer(load(model_dir).model, OptimSettings(lr=1e-5), micro_batch_tokens=tokens)
    rows = _rows(64, 128, spread=0.55)
    steps = []
    for _ in range(repeats + 1):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        tps = trainer_train(trainer, rows)
        steps.append({"tps": tps, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0})
    out.put({"steps": steps[1:], "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


MICRO_BATCHES = (16384, 2048)
"""The earlier fixed micro-batch size, and ``runtime.micro_batch_tokens``' default."""


def microbatch_pair(results: dict, model_dir: str, args) -> None:
    """``Trainer.rl_step`` in 2048-token micro-batches vs one 16384-token one, each in a process of its own."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    runs = {}
    for tokens in MICRO_BATCHES:
        q = ctx.Queue()
        p = ctx.Process(target=_microbatch_child, args=(model_dir, tokens, args.repeats, q))
        p.start()
        runs[tokens] = q.get()
        p.join()
    med = {t: {k: statistics.median(s[k] for s in r["steps"]) for k in ("tps", "faults")} for t, r in runs.items()}
    big, small = MICRO_BATCHES
    results["microbatch"] = {
        "what": f"train step, 64 rows of 58-128 tokens, {small}-token micro-batches, tokens/s",
        "baseline": f"one {big}-token micro-batch", "raw": med[big]["tps"], "rlonce": med[small]["tps"],
        "detail": {str(t): {**med[t], "peak_mb": runs[t]["peak_mb"], "steps": runs[t]["steps"]} for t in runs}}


def main() -> None:
    ap = argparse.ArgumentParser(description="engine and trainer throughput vs their baselines")
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="embedded", help="embedded (default) or smollm2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=120)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--sessions", type=int, default=48, help="agent sessions per replay")
    ap.add_argument("--code-pack", default=None, help="a validated code pack: replay code-repair sessions too")
    ap.add_argument("--parts", default="decode,fastdecode,native,omp,solo,reuse,continuous,train,packing,prefix,"
                                       "microbatch,adamw,gqa",
                    help="which measurements (comma-separated; default all)")
    ap.add_argument("--train-rows", type=int, default=32)
    ap.add_argument("--train-len", type=int, default=256)
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import copy
    import resource
    import tempfile

    import torch

    from rlonce.engine.torch_engine import TorchEngine
    from rlonce.model.loader import load, resolve

    sys.path.insert(0, str(Path(__file__).parent))
    from sessions import record_shapes

    model_dir = resolve(args.model, tempfile.mkdtemp())
    lm = load(model_dir)
    raw_model = copy.deepcopy(lm.model).eval()
    pad = lm.tokenizer.pad_token_id or 0

    def engine(**kw):
        return TorchEngine(copy.deepcopy(lm.model), eos_token_ids=[], pad_token_id=pad, max_batch_size=64,
                           batch_wait_s=0.002, **kw)

    results: dict[str, dict] = {}
    torch.set_num_threads(1)
    eng = engine()
    for batch in (1, 16) if "decode" in parts else ():
        runs = []
        raw_decode(raw_model, args.prompt_len, batch, 8)  # warm-up
        engine_decode(eng, args.prompt_len, batch, 8)
        for _ in range(args.repeats):
            runs.append(({"tps": raw_decode(raw_model, args.prompt_len, batch, args.new_tokens)},
                         {"tps": engine_decode(eng, args.prompt_len, batch, args.new_tokens)}))
        _pair(results, f"decode_{batch}", f"decode, {batch} concurrent session(s), tokens/s", "raw model", runs, "tps")
    eng.close()
    if "fastdecode" in parts:
        from hotpath import fastdecode_pair

        fastdecode_pair(results, lm, args, engine_decode, _pair)
    if "native" in parts:
        from hotpath import native_pair

        native_pair(results, lm, args, engine_decode, _pair)
    if "omp" in parts:
        from hotpath import omp_pair

        omp_pair(results, lm, args, engine_decode, raw_train, _rows(args.train_rows, args.train_len), _pair)
    if "solo" in parts:
        from compiled import solo_mismatch, solo_pair

        solo_pair(results, raw_model, engine, args, raw_decode, engine_decode)
        solo_mismatch(results, str(model_dir))
    if "compile" in parts:
        from compiled import compile_pair, train_compile

        compile_pair(results, raw_model, engine, args, raw_decode, engine_decode)
        train_compile(results, raw_model, args)

    workloads = {"toolfind": record_shapes("toolfind", args.model, args.sessions, tempfile.mkdtemp())} \
        if parts & {"reuse", "continuous"} else {}
    if args.code_pack and "reuse" in parts:
        workloads["code"] = record_shapes("code", args.model, args.sessions, tempfile.mkdtemp(), (
            f"task.pack={args.code_pack}", "harness.max_context=1024", "harness.max_turns=8",
            "harness.max_tokens_per_turn=256"))
    if workloads:  # the sessions replay as an RL run's rollouts do: after setup leaves the collector's sight
        from rlonce.recipes.rl import settle

        settle()
    for name, shapes in workloads.items() if "reuse" in parts else ():
        turns = max(len(s.replies) for s in shapes)
        sessions_pair(results, f"reuse_{name}", f"{name}: {len(shapes)} sessions of up to {turns} turns, tokens/s",
                      "no prefix reuse", lambda on: engine(prefix_cache_mb=1024 if on else 0), shapes, args.repeats)
    for n in sorted({16, args.sessions}) if "continuous" in parts else ():  # partly idle, and saturated
        shapes = workloads["toolfind"][:n]
        sessions_pair(results, f"continuous_{n}", f"toolfind, {len(shapes)} sessions staggered 20 ms, tool calls "
                      "30-90 ms, tokens/s", "waves", lambda on: engine(continuous=on), shapes, args.repeats,
                      tool_s=0.06, stagger_s=0.02)

    if "train" in parts:
        train_pair(results, lm, args)
    if "packing" in parts:
        packing_pair(results, lm, args)
    if "prefix" in parts:
        prefix_pair(results, lm, args)
    if "microbatch" in parts:
        microbatch_pair(results, str(model_dir), args)
    if "adamw" in parts:
        from hotpath import adamw_pair

        adamw_pair(results, lm, args, _pair)
    if "gqa" in parts:
        from hotpath import gqa_pair

        rows = group_rows(args.prompt_len, args.new_tokens)
        gqa_pair(results, lm, args, _pair, lambda t: trainer_train(t, rows))
    notes = {k: results.pop(k) for k in [k for k in results if "raw" not in results[k]]}
    for r in results.values():
        r["ratio"] = r["rlonce"] / r["raw"]
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    (out / "results.json").write_text(json.dumps({"model": args.model, "peak_rss_mb": peak_mb, **results, **notes},
                                                 indent=2) + "\n")
    from rlonce.telemetry.bench import paired_bars, write_table

    header = ["measurement", "baseline", "baseline value", "rlonce", "rlonce / baseline"]
    table = write_table(out / "results.md", header,
                        [[r["what"], r["baseline"], f"{r['raw']:.0f}", f"{r['rlonce']:.0f}", f"{r['ratio']:.2f}"]
                         for r in results.values()])
    extra = [f"- {k}: each repeat's ratio " + ", ".join(f"{x:.2f}" for x in r["detail"]["pairs"])
             for k, r in results.items() if len(r.get("detail", {}).get("pairs", ())) > 1]
    extra += [f"- {k}: prompt tokens run per turn {_turns(r['detail']['last'][0])} without reuse, "
             f"{_turns(r['detail']['last'][1])} with" for k, r in results.items() if k.startswith("reuse_")]
    for key in [k for k in results if k.startswith("continuous_")]:
        on, off = results[key]["detail"]["rlonce"], results[key]["detail"]["base"]
        extra.append(f"- {key} vs waves: turn latency p50 {on['turn_p50_s']:.3f} s vs {off['turn_p50_s']:.3f} s, "
                     f"p95 {on['turn_p95_s']:.3f} s vs {off['turn_p95_s']:.3f} s")
    if "omp" in results:
        d = results["omp"]["detail"]
        extra.append(f"- omp: the training step between decodes {d['base']['train_tps']:.0f} tokens/s with teams "
                     f"kept, {d['rlonce']['train_tps']:.0f} handed back")
    if "microbatch" in results:
        d = results["microbatch"]["detail"]
        extra.append("- microbatch: " + "; ".join(f"{t} tokens: {d[str(t)]['faults']:.0f} minor page faults per step, "
                                                  f"peak memory {d[str(t)]['peak_mb']:.0f} MiB" for t in MICRO_BATCHES))
    for key in [k for k in results if k.startswith("compile_") and k != "compile_train"]:
        d = results[key]["detail"]
        extra.append(f"- {key}: eager model over the same StaticCache {d['eager_static_tps']:.0f} tokens/s; "
                     f"compiling took {d['compile_s']:.1f} s")
    if "compile_train" in results:
        extra.append(f"- compile_train: compiling took {results['compile_train']['detail']['compile_s']:.1f} s")
    if "solo_1" in results:
        d = results["solo_1"]["detail"]
        extra.append(f"- solo_1: the eager engine {d['eager_engine_tps']:.0f} tokens/s; compiling the static cache "
                     f"sizes took {d['compile_s']:.1f} s (first calls, not in the rates)")
    if "solo_mismatch" in notes:
        extra.append("- engine vs trainer log-probs, max / mean |difference|: " + "; ".join(
            f"{k} {v['max_abs']:.1e} / {v['mean_abs']:.1e}" for k, v in notes["solo_mismatch"]["detail"].items()))
    if "solo_failed" in notes:
        extra.append(f"- engine.compile_solo did not compile: {notes['solo_failed']['detail']['error']}")
    if "compile_engine" in notes:
        d = notes["compile_engine"]["detail"]
        extra.append("- TorchEngine with torch.compile(dynamic=True): " + (
            f"failed after {d['compile_s']:.1f} s: {d['error']}" if d["error"] else
            "; ".join(f"{b} session(s) {e:.0f} tokens/s eager, {c:.0f} compiled" for b, (e, c) in
                      d["engine_tps"].items())))
    extra.append(f"- model {args.model}; peak resident memory of this process {peak_mb:.0f} MiB")
    with open(out / "results.md", "a") as f:
        f.write("\n" + "\n".join(extra) + "\n")
    print(table + "\n" + "\n".join(extra))
    names = list(results)
    paired_bars(out / "throughput.png", names, {"baseline": [results[n]["raw"] for n in names],
                                                "rlonce": [results[n]["rlonce"] for n in names]},
                ylabel="tokens / s", title=f"{args.model}: throughput (median of repeats)")


def _turns(r: dict) -> str:
    return "/".join(f"{v:.0f}" for v in r["prefill_per_turn"].values())


if __name__ == "__main__":
    main()
