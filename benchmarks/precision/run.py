"""Train/inference mismatch by policy precision: float32, bfloat16 with an fp32 LM head, bfloat16.

    python benchmarks/precision/run.py --out DIR [--model smollm2] [--prompts 32] [--samples 4]

MiniMax-M1 (§3.2) found the probabilities its training and inference kernels gave the same
tokens diverging, and traced it to the LM head's precision. This measures the same quantity on
rlonce's own stack: for each precision the torch engine (batched, KV-cached decoding, left
padding) samples completions of reasoning prompts and returns each token's log-prob; the
trainer's code path (``token_logprobs``: one right-padded forward) recomputes them with the same
weights; ``mismatch_metrics`` compares the two on the same tokens — KL(μ‖π), the correlation of
the token probabilities, the largest log-prob gap. Variants run side by side in one invocation
on the same prompts and seeds. Writes ``results.json``, ``results.md`` and ``precision.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

VARIANTS = [("float32", True, "float32"), ("bfloat16", True, "bfloat16 + fp32 head"),
            ("bfloat16", False, "bfloat16")]
OPTIONS = {"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}}


def measure(model_dir: Path, dtype: str, head32: bool, prompts: list[list[int]], samples: int, max_tokens: int):
    import torch

    from rlonce.engine.base import SamplingParams
    from rlonce.engine.torch_engine import TorchEngine
    from rlonce.model import loader
    from rlonce.train.trainer import mismatch_metrics, token_logprobs

    lm = loader.load(model_dir, dtype=dtype, lm_head_fp32=head32)
    engine = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=lm.eos_token_ids, pad_token_id=0, seed=0)

    async def sample():
        return await asyncio.gather(*(
            engine.generate(p, SamplingParams(max_tokens=max_tokens, temperature=0.7, seed=1000 * i + k))
            for i, p in enumerate(prompts) for k in range(samples)))

    t0 = time.perf_counter()
    gens = asyncio.run(sample())
    t_gen = time.perf_counter() - t0
    engine.close()
    rollout, train = [], []
    t0 = time.perf_counter()
    with torch.no_grad():
        for j, g in enumerate(gens):
            p = prompts[j // samples]
            ids = torch.tensor([p + g.token_ids])
            mask = torch.zeros(1, ids.shape[1] - 1)
            mask[0, len(p) - 1:] = 1
            lp, _ = token_logprobs(lm.model, ids, torch.ones_like(ids), 0.7, mask_BT=mask)
            train.append(lp[0, len(p) - 1:].float())
            rollout.append(torch.tensor(g.logprobs))
    t_train = time.perf_counter() - t0
    m = mismatch_metrics(torch.cat(rollout), torch.cat(train))
    return {**m, "generate_seconds": t_gen, "recompute_seconds": t_train,
            "probs": [torch.cat(rollout).exp()[:4000].tolist(), torch.cat(train).exp()[:4000].tolist()]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    torch.set_num_threads(a.threads)
    from rlonce.envs.reasoning.env import SYSTEM_PROMPT
    from rlonce.envs.reasoning.tasks import make_task
    from rlonce.model import loader
    from rlonce.model.chat import get_format

    model_dir = loader.resolve(a.model, out / "cache")
    fmt = get_format(loader.load(model_dir).chat_format)
    tok = loader.load(model_dir).tokenizer
    prompts = [tok.encode(fmt.opening(SYSTEM_PROMPT, make_task("train", i, ["chain_sum"], OPTIONS).question, []),
                          add_special_tokens=False) for i in range(a.prompts)]
    results = {"model": a.model, "prompts": a.prompts, "samples": a.samples, "variants": {}}
    for dtype, head32, label in VARIANTS:
        r = measure(model_dir, dtype, head32, prompts, a.samples, a.max_tokens)
        results["variants"][label] = r
        print(f"{label:<22} KL {r['mismatch_kl']:.3e}  corr {r['mismatch_corr']:.6f}  "
              f"max|Δlogp| {r['mismatch_max_abs']:.3f}  tokens {int(r['mismatch_tokens'])}  "
              f"generate {r['generate_seconds']:.1f}s", flush=True)
    base = results["variants"]["bfloat16"]["mismatch_kl"]
    results["kl_bf16_over_bf16_fp32_head"] = base / max(results["variants"]["bfloat16 + fp32 head"]["mismatch_kl"],
                                                        1e-30)
    (out / "results.json").write_text(json.dumps(
        {**results, "variants": {k: {kk: vv for kk, vv in v.items() if kk != "probs"}
                                 for k, v in results["variants"].items()}}, indent=1) + "\n")
    lines = ["| precision | KL(rollout ‖ trainer) / token | prob. correlation | max abs Δ log-prob | tokens | "
             "generate s |", "|---|---|---|---|---|---|"]
    for label, r in results["variants"].items():
        lines.append(f"| {label} | {r['mismatch_kl']:.3e} | {r['mismatch_corr']:.6f} | {r['mismatch_max_abs']:.4f} | "
                     f"{int(r['mismatch_tokens'])} | {r['generate_seconds']:.1f} |")
    lines.append(f"\nKL ratio bfloat16 / (bfloat16 + fp32 head): {results['kl_bf16_over_bf16_fp32_head']:.2f}")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(VARIANTS), figsize=(4.2 * len(VARIANTS), 4), squeeze=False)
    for ax, (label, r) in zip(axes[0], results["variants"].items()):
        ax.scatter(r["probs"][0], r["probs"][1], s=2, alpha=0.4)
        ax.plot([0, 1], [0, 1], color="gray", lw=0.8)
        ax.set_title(f"{label}\ncorr {r['mismatch_corr']:.5f}, KL {r['mismatch_kl']:.1e}", fontsize=9)
        ax.set_xlabel("rollout (engine) probability")
        ax.set_ylabel("trainer probability")
    fig.tight_layout()
    fig.savefig(out / "precision.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
