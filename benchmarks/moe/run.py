"""Sparse-model alignment in real runs: routing replay (R3) and MXFP4 quantize-dequantize, each on
and off, on the embedded mixture-of-experts model.

    python benchmarks/moe/run.py --out DIR [--steps 20] [--top-p 0.7] [--heldout 50] [--only NAME ...]

SFT runs once (``rlonce quickstart … rl.steps=0`` on ``model.name = "embedded-moe"``, float32);
each variant is then one ``rlonce quickstart`` run from that SFT checkpoint (``sft.demos=0``,
``--steps`` synchronous GRPO steps at ``harness.top_p`` = ``--top-p``), differing only in the
settings the table names, so every variant starts from the same weights. From each run's
``metrics.jsonl`` it reads the train/inference mismatch (``mismatch_kl``: KL(rollout ‖ trainer)
per token, measured on the first mini-batch's forward, before the update) at step 1 — engine and
trainer hold identical weights there — and its mean over all steps, the share of recorded
(token, layer) pairs whose experts the trainer's router would change (``moe/route_differ``), the
expert load, and the held-out success before → after.

The variants run one after another, each into its own folder under ``--out``; a variant whose
folder already holds a finished run (``summary.json``) is read, not rerun, so an interrupted
benchmark resumes where it stopped. Writes ``results.json``, ``results.md`` and ``moe.png``
(``mismatch_kl`` per step, one line per variant).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = [
    ("float32, R3 on", []),
    ("float32, R3 off", ["model.routing_replay=false"]),
    ("MXFP4 rollout, aligned", ["model.rollout_quant=mxfp4"]),
    ("MXFP4 rollout, not aligned", ["model.rollout_quant=mxfp4", "model.qdq_align=false"]),
    ("MXFP4 rollout, not aligned, R3 off", ["model.rollout_quant=mxfp4", "model.qdq_align=false",
                                            "model.routing_replay=false"]),
    ("bf16 autocast, R3 on", ["model.autocast=bfloat16"]),
    ("bf16 autocast, R3 off", ["model.autocast=bfloat16", "model.routing_replay=false"]),
    ("float32, R3 on, router frozen", ["model.freeze_router=true"]),
]


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-").replace("--", "-")


def quickstart(run_dir: Path, overrides: list[str]) -> None:
    """``rlonce quickstart --out run_dir OVERRIDES``, unless ``run_dir`` holds a finished run."""
    if (run_dir / "summary.json").is_file():
        return
    cmd = [sys.executable, "-m", "rlonce.cli", "quickstart", "--out", str(run_dir), "--quiet", *overrides]
    print("$", " ".join(cmd[2:]), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    (run_dir / "bench_seconds.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")


def run(out: Path, name: str, overrides: list[str], a) -> dict:
    run_dir = out / slug(name)
    quickstart(run_dir, [f"model.name={out / 'sft' / 'checkpoints' / 'step-0000'}", "sft.demos=0",
                         f"rl.steps={a.steps}", f"harness.top_p={a.top_p}", f"eval.heldout_tasks={a.heldout}",
                         "eval.every=0", *overrides])
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "mismatch_kl" in r]
    summary = json.loads((run_dir / "summary.json").read_text())

    def mean(key):
        vals = [r[key] for r in steps if key in r]
        return sum(vals) / len(vals) if vals else None

    first, last = (steps[0], steps[-1]) if steps else ({}, {})
    return {"overrides": overrides, "run_dir": str(run_dir), "trained_steps": len(steps),
            "step1_mismatch_kl": first.get("mismatch_kl"), "step1_route_differ": first.get("moe/route_differ"),
            "mean_mismatch_kl": mean("mismatch_kl"), "mean_route_differ": mean("moe/route_differ"),
            "load_cv_first": first.get("moe/load_cv"), "load_cv_last": last.get("moe/load_cv"),
            "cold_first": first.get("moe/cold"), "cold_last": last.get("moe/cold"),
            "baseline_success": summary.get("baseline_success"), "final_success": summary.get("final_success"),
            "per_step_kl": [[r["step"], r["mismatch_kl"]] for r in steps]}


def fmt(x, spec=".2e"):
    return "–" if x is None else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top-p", type=float, default=0.7)
    ap.add_argument("--heldout", type=int, default=50, help="held-out tasks of the baseline and final evaluations")
    ap.add_argument("--only", nargs="*", help="run only the variants whose names contain one of these")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = [(n, o) for n, o in VARIANTS if not a.only or any(s in n for s in a.only)]
    quickstart(out / "sft", ["model.name=embedded-moe", "rl.steps=0", f"eval.heldout_tasks={a.heldout}"])
    results = {"steps": a.steps, "top_p": a.top_p, "heldout_tasks": a.heldout,
               "variants": {name: run(out, name, o, a) for name, o in chosen}}
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = ["| variant | step-1 mismatch KL | step-1 routes differing | mean mismatch KL (all steps) | "
             "mean routes differing | expert load CV, step 1 → last | cold experts, step 1 → last | "
             "held-out before → after |", "|---|---|---|---|---|---|---|---|"]
    for name, r in results["variants"].items():
        lines.append(f"| {name} | {fmt(r['step1_mismatch_kl'])} | {fmt(r['step1_route_differ'], '.4f')} | "
                     f"{fmt(r['mean_mismatch_kl'])} | {fmt(r['mean_route_differ'], '.4f')} | "
                     f"{fmt(r['load_cv_first'], '.3f')} → {fmt(r['load_cv_last'], '.3f')} | "
                     f"{fmt(r['cold_first'], '.3f')} → {fmt(r['cold_last'], '.3f')} | "
                     f"{fmt(r['baseline_success'], '.3f')} → {fmt(r['final_success'], '.3f')} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in results["variants"].items():
        if r["per_step_kl"]:
            xs, ys = zip(*r["per_step_kl"])
            ax.plot(xs, [max(y, 1e-16) for y in ys], marker=".", label=name)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("mismatch KL(rollout ‖ trainer) per token")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "moe.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
