"""How close decoding and training come to this machine's matmul peak: achieved FLOP/s over peak.

docs/performance.md ("Roofline") quotes its numbers.

    python benchmarks/roofline/run.py --out DIR [--model smollm2|embedded|FOLDER] [--threads 2]
                                      [--sessions 1 16 64] [--precisions float32 autocast bfloat16]
                                      [--prompt-tokens 64] [--max-tokens 64] [--train-shape 8x256]
                                      [--repeats 3] [--bf16-repeats N] [--against REV] [--quick]

``--against REV`` measures git revision REV's ``src`` (exported with ``git archive``) and then this
tree's, each in a child process with the same arguments, one after the other on the same machine:
``DIR/before`` and ``DIR/after`` hold each one's files, ``DIR`` the two side by side with the ratio
after / before of each row's achieved FLOP/s (``results.json``, ``results.md``, ``roofline.png``).

Every part runs with ``torch.set_num_threads(--threads)``, the thread count the engine's worker and
the trainer are given (``runtime.rollout_threads`` / ``train_threads``).

- Peak: square products (1024, 1536, 2048) in the layout of every linear layer, ``x·Wᵀ`` with ``W``
  stored (out, in) (``F.linear``), float32 and bfloat16, one warm-up and ``--repeats`` + 2 timed
  products each; 2·n³ FLOPs per product; the best over sizes and repeats. (On an AVX2 CPU without
  bfloat16 units ``torch.matmul`` of two row-major bfloat16 matrices took another path, 20× slower
  than ``F.linear``: that would be no peak.)
- Decode: the torch engine as ``EngineSpec.build`` builds it (spec defaults, the model loaded as it
  loads it), at each ``--sessions`` count: that many ``engine.generate`` calls at once
  (``asyncio.gather``), one fixed ``--prompt-tokens`` prompt, per-session seeds, temperature 1,
  exactly ``--max-tokens`` each (``SamplingParams`` has no ignore-EOS switch, so the engine is
  handed no end-of-turn ids). Tokens/s: generated tokens over the wall time of the whole call,
  prefill included; a warm-up call at each count leaves the prompt in the engine's prefix store, so
  the timed calls prefill only what the store does not hold (the engine's counter says how much).
- Training: ``Trainer.rl_step`` (the default RL request: PPO, no rollout correction, no KL term)
  on ``--train-shape`` random rows, the last three quarters of each row trained.

Precisions: ``float32``; ``autocast`` (``model.autocast = "bfloat16"``: products in bfloat16, weights
float32, the LM head float32); ``bfloat16`` (``model.dtype = "bfloat16"``: weights and activations
bfloat16, the LM head float32). The last two are set against the bfloat16 peak.

FLOPs are the model's (what the tokens need, not what the kernels happened to run), in the
notation of Kaplan et al. (2020) §2.1: N_body = the weights of the decoder's linear layers (the
embedding lookup and norms excluded), N_head = vocab·d_model (the LM head, tied or not),
d_attn = heads·head_dim, L = layers. One token's forward at context c (the positions its query
attends to, itself included) is 2·N_body + 4·L·d_attn·c, plus 2·N_head where its logits are needed.

- decode: each token the engine prefilled (its own counter; equal prompts are prefilled once) at
  the prompt's mean c, (prompt + 1) / 2, no head; each generated token with the head at c = prompt + its index.
- training: 3× the forward (forward + backward): every row token with c = its position + 1, the
  head on the trained tokens only (the trainer computes logits only where the loss mask is 1).

Peak and throughput are both the best of their repeats: on a shared machine the fastest run is the
least disturbed. Writes ``results.json``, ``results.md`` and ``roofline.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

PRECISIONS = {"float32": ("float32", False), "autocast": ("float32", True), "bfloat16": ("bfloat16", False)}
"""Name → (``model.dtype``, ``model.autocast`` on)."""
PEAK_OF = {"float32": "float32", "autocast": "bfloat16", "bfloat16": "bfloat16"}


def peak(sizes: list[int], repeats: int) -> dict:
    """Best GFLOP/s of ``F.linear`` per dtype, and each size's best."""
    import torch
    import torch.nn.functional as F

    out = {}
    for dtype in ("float32", "bfloat16"):
        per = {}
        for n in sizes:
            gen = torch.Generator().manual_seed(n)
            a = torch.randn(n, n, generator=gen).to(getattr(torch, dtype))
            b = torch.randn(n, n, generator=gen).to(getattr(torch, dtype))
            F.linear(a, b)
            best = float("inf")
            for _ in range(repeats):
                t = time.perf_counter()
                F.linear(a, b)
                best = min(best, time.perf_counter() - t)
            per[str(n)] = 2 * n**3 / best / 1e9
        out[dtype] = {"gflops": max(per.values()), "by_size": per}
        print(f"peak {dtype}: {out[dtype]['gflops']:.1f} GFLOP/s (by size: "
              + ", ".join(f"{k} {v:.1f}" for k, v in per.items()) + ")", flush=True)
    return out


def shape_of(model) -> dict:
    """N_body, N_head, L and d_attn of a Hugging Face causal LM (see the module docstring)."""
    import torch

    head = model.get_output_embeddings()
    body = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return {"n_body": body, "n_head": head.weight.numel(), "layers": c.num_hidden_layers,
            "d_attn": c.num_attention_heads * head_dim,
            "parameters": sum(p.numel() for p in model.parameters())}


def forward_flops(s: dict, tokens: int, context_sum: float, head_tokens: int) -> float:
    """FLOPs of ``tokens`` forward tokens whose contexts sum to ``context_sum``, ``head_tokens`` of
    them with logits."""
    return 2 * s["n_body"] * tokens + 4 * s["layers"] * s["d_attn"] * context_sum + 2 * s["n_head"] * head_tokens


def _load(path: Path, precision: str):
    from rlonce.model import loader

    dtype, autocast = PRECISIONS[precision]
    return loader.load(path, dtype=dtype, autocast=autocast)


class _NoEos:
    """A loaded model that names no end-of-turn token: every session decodes exactly ``max_tokens``."""

    eos_token_ids: list[int] = []

    def __init__(self, lm):
        self.model, self.tokenizer = lm.model, lm.tokenizer


def _prompt(lm, n: int) -> list[int]:
    text = ("The committee met on a grey Tuesday to review the harbour accounts, the ferry timetable, "
            "the repairs to the north pier and the winter lighting of the old market square. ")
    ids = lm.encode(text * (1 + n // 8))
    assert len(ids) >= n, len(ids)
    return ids[:n]


def decode(path: Path, precision: str, args) -> list[dict]:
    from rlonce.engine.base import SamplingParams
    from rlonce.engine.factory import EngineSpec

    sessions, prompt_tokens, max_tokens = args.sessions, args.prompt_tokens, args.max_tokens
    dtype, autocast = PRECISIONS[precision]
    lm = _load(path, precision)
    spec = EngineSpec(backend="torch", model_dir=str(path), dtype=dtype, autocast=autocast, threads=args.threads,
                      max_batch_size=max(128, max(sessions)))
    engine = spec.build(lm=_NoEos(lm))
    s = shape_of(lm.model)
    prompt = _prompt(lm, prompt_tokens)

    def run(n: int, tokens: int) -> tuple[float, int]:
        async def go():
            return await asyncio.gather(*(engine.generate(prompt, SamplingParams(max_tokens=tokens, seed=i))
                                          for i in range(n)))

        before = engine.stats["prefill_tokens"]
        t = time.perf_counter()
        gens = asyncio.run(go())
        took = time.perf_counter() - t
        assert all(len(g.token_ids) == tokens for g in gens), [len(g.token_ids) for g in gens]
        return took, engine.stats["prefill_tokens"] - before

    rows = []
    try:
        for n in sessions:
            run(n, max(2, max_tokens // 4))  # warm-up at this batch size
            runs = [run(n, max_tokens) for _ in range(_repeats(args, precision))]
            took, prefilled = min(runs)
            generated = n * max_tokens
            prefill_ctx = prefilled * (prompt_tokens + 1) / 2
            decode_ctx = n * (max_tokens * prompt_tokens + max_tokens * (max_tokens - 1) / 2)
            flops = forward_flops(s, prefilled, prefill_ctx, 0) + forward_flops(s, generated, decode_ctx, generated)
            rows.append({"what": "decode", "precision": precision, "size": n, "tokens": generated,
                         "prefilled": prefilled, "seconds": took, "all_seconds": [r[0] for r in runs],
                         "tokens_per_s": generated / took, "flops": flops, "gflops": flops / took / 1e9})
            print(f"decode {precision} {n} sessions: {generated / took:.0f} tok/s, {flops / took / 1e9:.2f} GFLOP/s "
                  f"({prefilled} prompt tokens prefilled)", flush=True)
    finally:
        engine.close()
    return rows


def _rows(vocab: int, n: int, tokens: int):
    """``n`` rows of ``tokens`` random ids, the last three quarters trained, advantages of
    alternating sign, rollout log-probs -2."""
    import torch

    from rlonce.core.records import TrainingRow

    gen = torch.Generator().manual_seed(1)
    prompt = tokens // 4
    rows = []
    for i in range(n):
        ids = torch.randint(10, vocab, (tokens,), generator=gen).tolist()
        mask = [0] * prompt + [1] * (tokens - prompt)
        lp = [0.0] * prompt + [-2.0] * (tokens - prompt)
        adv = [0.0] * prompt + [1.0 if i % 2 else -1.0] * (tokens - prompt)
        rows.append(TrainingRow(ids, mask, lp, adv, [-1] * prompt + [0] * (tokens - prompt), group_id=f"g{i // 2}"))
    return rows


def train(path: Path, precision: str, n_rows: int, tokens: int, repeats: int) -> dict:
    from rlonce.config import load_config
    from rlonce.train.builders import rl_request
    from rlonce.train.trainer import OptimSettings, Trainer

    lm = _load(path, precision)
    s = shape_of(lm.model)
    cfg = load_config(None, [])
    assert cfg.algo.rollout_correction == "none" and cfg.algo.kl_coef == 0, "one forward and backward per step"
    trainer = Trainer(lm.model, OptimSettings(lr=1e-6))
    rows = _rows(lm.model.config.vocab_size, n_rows, tokens)
    trained = sum(sum(r.loss_mask[1:]) for r in rows)
    flops = 3 * forward_flops(s, n_rows * tokens, n_rows * tokens * (tokens + 1) / 2, trained)
    steps = []
    for step in range(repeats + 1):  # the first is a warm-up
        t = time.perf_counter()
        trainer.rl_step(rows, rl_request(cfg, len(rows), step, version=None))
        steps.append(time.perf_counter() - t)
    took = min(steps[1:])
    print(f"train {precision} {n_rows}x{tokens}: {n_rows * tokens / took:.0f} tok/s, {flops / took / 1e9:.2f} GFLOP/s",
          flush=True)
    return {"what": "RL step", "precision": precision, "size": n_rows, "tokens": n_rows * tokens,
            "row_tokens": tokens, "trained": trained, "seconds": took, "all_seconds": steps[1:],
            "tokens_per_s": n_rows * tokens / took, "flops": flops, "gflops": flops / took / 1e9}


def _repeats(args, precision: str) -> int:
    """Timed repeats of a row: ``--bf16-repeats`` for the bfloat16 ones where given."""
    return args.repeats if precision == "float32" or args.bf16_repeats is None else args.bf16_repeats


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def measure(args) -> dict:
    import torch

    from rlonce.model import loader
    from rlonce.model.precision import bf16_units

    torch.set_num_threads(args.threads)
    path = loader.resolve(args.model, Path("runs/bench/roofline-cache").resolve())
    results: dict = {"model": args.model, "threads": args.threads, "cpu": _cpu(), "bf16_units": bf16_units(),
                     "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens, "repeats": args.repeats}
    results["shape"] = shape_of(_load(path, "float32").model)
    results["peak"] = peak(args.peak_sizes, args.repeats + 2)
    decoded = []
    for precision in args.precisions:
        decoded += decode(path, precision, args)
    n_rows, tokens = (int(x) for x in args.train_shape.lower().split("x"))
    order = list(PRECISIONS)
    rows = sorted(decoded, key=lambda r: (r["size"], order.index(r["precision"])))
    for precision in args.precisions:
        rows.append(train(path, precision, n_rows, tokens, _repeats(args, precision)))
    for r in rows:
        r["peak_gflops"] = results["peak"][PEAK_OF[r["precision"]]]["gflops"]
        r["fraction"] = r["gflops"] / r["peak_gflops"]
    results["rows"] = rows
    results["ratios"] = ratios(results)
    return results


def ratios(results: dict) -> dict:
    """bfloat16 / float32 peak, and each bfloat16 row's tokens/s over its float32 row's."""
    out = {"peak bfloat16 / float32": results["peak"]["bfloat16"]["gflops"] / results["peak"]["float32"]["gflops"]}
    base = {(r["what"], r["size"]): r for r in results["rows"] if r["precision"] == "float32"}
    for r in results["rows"]:
        b = base.get((r["what"], r["size"]))
        if r["precision"] != "float32" and b is not None:
            out[f"{_label(r)} tok/s {r['precision']} / float32"] = r["tokens_per_s"] / b["tokens_per_s"]
    return out


def _label(r: dict) -> str:
    if r["what"] == "decode":
        return f"decode ×{r['size']}"
    return f"RL step {r['size']}×{r['row_tokens']}"


def table(results: dict, out: Path) -> str:
    from rlonce.telemetry.bench import write_table

    head = ["what", "precision", "sessions / rows", "tokens/s", "achieved GFLOP/s", "peak GFLOP/s", "fraction"]
    rows = []
    for r in results["rows"]:
        size = (f"{r['size']} session{'s' * (r['size'] > 1)} × {r['tokens'] // r['size']} tokens"
                if r["what"] == "decode" else f"{r['size']} rows × {r['row_tokens']} ({r['trained']} trained)")
        rows.append([r["what"], r["precision"], size, f"{r['tokens_per_s']:.0f}", f"{r['gflops']:.2f}",
                     f"{r['peak_gflops']:.1f} ({PEAK_OF[r['precision']]})", f"{100 * r['fraction']:.1f}%"])
    s = results["shape"]
    note = (f"\n\n{results['model']}: N_body {s['n_body']:,}, N_head {s['n_head']:,}, L {s['layers']}, d_attn "
            f"{s['d_attn']}; {results['threads']} torch threads; {results['cpu']}. Forward FLOPs per token: "
            "2·N_body + 4·L·d_attn·c (+ 2·N_head where logits are needed); decode counts the prefilled prompt "
            "tokens and the generated ones (tokens/s: generated), the RL step 3× the forward of every row token, "
            "the head on the trained ones only (tokens/s: row tokens).")
    text = write_table(out / "results.md", head, rows) + note
    (out / "results.md").write_text(text + "\n")
    return text


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"float32": "tab:blue", "autocast": "tab:orange", "bfloat16": "tab:green"}
    rows = results["rows"]
    fig, ax = plt.subplots(figsize=(max(7.0, 0.55 * len(rows) + 2), 4), dpi=100)
    bars = ax.bar(range(len(rows)), [100 * r["fraction"] for r in rows],
                  color=[colors[r["precision"]] for r in rows])
    ax.bar_label(bars, labels=[f"{100 * r['fraction']:.1f}%\n{r['gflops']:.3g}" for r in rows], fontsize=7)
    ax.set_xticks(range(len(rows)), [_label(r) for r in rows], rotation=35, ha="right", fontsize=8)
    for name, c in colors.items():
        ax.bar([0], [0], color=c, label=f"{name} (of the {PEAK_OF[name]} peak, "
                                        f"{results['peak'][PEAK_OF[name]]['gflops']:.0f} GFLOP/s)")
    ax.set_ylabel("achieved / matmul peak (%)")
    ax.set_ylim(0, max(100 * r["fraction"] for r in rows) * 1.25)
    ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False)
    fig.suptitle(f"{results['model']}, {results['threads']} threads: fraction of the matmul peak "
                 "(labels: %, achieved GFLOP/s)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "roofline.png")
    plt.close(fig)


def compare(args, out: Path) -> None:
    """``--against REV``: REV's ``src`` and then this tree's, each measured by this script in a child
    process with the same arguments; the two tables side by side with each row's ratio."""
    import os
    import shutil
    import subprocess
    import sys

    from rlonce.telemetry.bench import source_of

    passed = _without(sys.argv[1:], ("--against", "--out"))
    before, commit = source_of(args.against)
    here_src = Path(__file__).resolve().parents[2] / "src"
    try:
        for arm, src in (("before", before / "src"), ("after", here_src)):
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
            print(f"--- {arm}: {'revision ' + commit[:10] if arm == 'before' else 'this tree'} ({src})", flush=True)
            subprocess.run([sys.executable, __file__, *passed, "--out", str(out / arm)], env=env, check=True)
    finally:
        shutil.rmtree(before, ignore_errors=True)
    both = {arm: json.loads((out / arm / "results.json").read_text()) for arm in ("before", "after")}
    both["against"] = commit
    (out / "results.json").write_text(json.dumps(both, indent=1))
    print(compared_table(both, out))
    compared_plot(both, out)


def _without(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """``argv`` less each of ``options`` and its value (``--opt VALUE`` or ``--opt=VALUE``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif not a.startswith(tuple(o + "=" for o in options)):
            out.append(a)
    return out


def _key(r: dict) -> tuple:
    return r["what"], r["precision"], r["size"]


def compared_table(both: dict, out: Path) -> str:
    from rlonce.telemetry.bench import write_table

    before = {_key(r): r for r in both["before"]["rows"]}
    head = ["what", "precision", "sessions / rows", "tokens/s before → after", "fraction of peak before → after",
            "after / before"]
    rows = []
    for r in both["after"]["rows"]:
        b = before.get(_key(r))
        if b is None:
            continue
        rows.append([r["what"], r["precision"], str(r["size"]), f"{b['tokens_per_s']:.0f} → {r['tokens_per_s']:.0f}",
                     f"{100 * b['fraction']:.1f}% → {100 * r['fraction']:.1f}%",
                     f"{r['tokens_per_s'] / b['tokens_per_s']:.2f}×"])
    pk = {arm: both[arm]["peak"] for arm in ("before", "after")}
    note = (f"\n\nBefore: revision {both['against'][:10]}; after: this tree; {both['after']['model']}, "
            f"{both['after']['threads']} threads, {both['after']['cpu']}. Each arm's fraction is of the peak it "
            "measured itself: float32 " + " / ".join(f"{pk[a]['float32']['gflops']:.0f}" for a in pk)
            + ", bfloat16 " + " / ".join(f"{pk[a]['bfloat16']['gflops']:.0f}" for a in pk)
            + " GFLOP/s (before / after).")
    text = write_table(out / "results.md", head, rows) + note
    (out / "results.md").write_text(text + "\n")
    return text


def compared_plot(both: dict, out: Path) -> None:
    from rlonce.telemetry.bench import paired_bars

    before = {_key(r): r for r in both["before"]["rows"]}
    rows = [r for r in both["after"]["rows"] if _key(r) in before]
    names = [f"{_label(r)}\n{r['precision']}" for r in rows]
    paired_bars(out / "roofline.png", names,
                {"before": [100 * before[_key(r)]["fraction"] for r in rows],
                 "after": [100 * r["fraction"] for r in rows]},
                ylabel="achieved / matmul peak (%)", log=False,
                title=f"{both['after']['model']}: fraction of the matmul peak, {both['against'][:10]} → this tree")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2", help="smollm2, embedded or a model folder")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sessions", nargs="+", type=int, default=[1, 16, 64])
    ap.add_argument("--precisions", nargs="+", choices=list(PRECISIONS), default=list(PRECISIONS))
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--train-shape", default="8x256", help="the RL step's rows, ROWSxTOKENS")
    ap.add_argument("--peak-sizes", nargs="+", type=int, default=[1024, 1536, 2048])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bf16-repeats", type=int, default=None,
                    help="timed repeats of the autocast and bfloat16 rows (default --repeats): on a CPU without "
                         "bfloat16 units they take ~10x as long")
    ap.add_argument("--against", metavar="REV", help="measure git revision REV's src first, then this tree's, "
                                                       "and write the two side by side")
    ap.add_argument("--quick", action="store_true", help="a smoke run: everything small")
    args = ap.parse_args()
    if args.quick:
        args.sessions = [min(s, 4) for s in args.sessions[:2]]
        args.prompt_tokens, args.max_tokens, args.train_shape = 16, 8, "2x32"
        args.peak_sizes, args.repeats = [256, 512], 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.against:
        return compare(args, out)
    results = measure(args)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results, out))
    plot(results, out)
    print("ratios: " + ", ".join(f"{k} {v:.2f}×" for k, v in results["ratios"].items()))


if __name__ == "__main__":
    main()
