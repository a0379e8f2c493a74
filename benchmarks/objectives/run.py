"""GRPO vs DAPO vs CISPO on the embedded task: same SFT start, same steps, same seeds.

    python benchmarks/objectives/run.py --out DIR [--steps 40] [--seeds 0,1] [--arms dapo,cispo]

One SFT run (the quickstart's SFT) produces the shared starting checkpoint. Then each arm
trains from it with GRPO for ``--steps`` steps per seed, evaluating held-out success every
``--eval-every`` steps and on ``--final-tasks`` held-out tasks at the end. The arms differ only
in the learning signal (``rlonce.algo``):

* ``grpo``  — PPO clip [0.8, 1.2], no dynamic filtering, seq-mean-token-mean (the GRPO paper);
* ``dapo``  — clip-higher [0.8, 1.28], dynamic filtering of no-contrast groups, token-mean;
* ``cispo`` — clipped IS weight (upper 1.28, no lower bound), dynamic filtering, token-mean
  (MiniMax-M1 §3.1);
* ``dapo-prompt-mean`` — ``dapo`` with seed 001's production reduction: tokens normalised within
  each prompt group, then groups averaged (mini-batches hold whole groups);
* ``dapo-top-p-0.9`` and ``dapo-top-p-0.9-full-vocab`` — ``dapo`` sampling at top_p 0.9, with the
  trainer renormalising over each token's candidate set (seed 000) and without it
  (``harness.candidate_sets=false``: a full-vocabulary log-softmax, whose π/μ < 1 the lower clip bites).

All arms use std-normalised group advantages, as their papers do, and dispatch exactly 8 groups a
step (``rollout.sync_dispatch_cap=1``: no refills), so every arm gets the same rollout budget.
Every update is split into ``--minibatches`` optimizer steps, so later minibatches are off-policy and the clipping rules
actually bind. A run already in ``DIR/runs.json`` (same arm and seed) is not run again, so an
interrupted benchmark resumes. Writes ``results.json``, ``results.md`` (table) and ``objectives.png`` (held-out
success and training reward per step, mean over seeds with each seed drawn thin).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ARMS: dict[str, list[str]] = {
    "grpo": ["algo.objective=ppo", "algo.objective.clip_low=0.2", "algo.objective.clip_high=0.2",
             "algo.objective.clip_c=3.0", "algo.filter_no_contrast=false", "algo.aggregation=seq-mean-token-mean"],
    "dapo": ["algo.objective=ppo", "algo.objective.clip_low=0.2", "algo.objective.clip_high=0.28",
             "algo.objective.clip_c=3.0", "algo.filter_no_contrast=true", "algo.aggregation=token-mean"],
    "cispo": ["algo.objective=cispo", "algo.objective.eps_low=1.0", "algo.objective.eps_high=0.28",
              "algo.filter_no_contrast=true", "algo.aggregation=token-mean"],
}
ARMS["dapo-prompt-mean"] = ARMS["dapo"] + ["algo.aggregation=prompt-mean"]
ARMS["dapo-top-p-0.9"] = ARMS["dapo"] + ["harness.top_p=0.9"]
ARMS["dapo-top-p-0.9-full-vocab"] = ARMS["dapo"] + ["harness.top_p=0.9", "harness.candidate_sets=false"]


ROWS_PER_STEP = 8 * 8  # rl.tasks_per_step × rl.group_size, one context per sequence


def sft_checkpoint(out: Path, args) -> Path:
    from rlonce.config import load_config
    from rlonce.recipes.grpo import Job

    ckpt = out / "sft" / "checkpoints" / "step-0000"
    if (ckpt / "model.safetensors").is_file():
        return ckpt
    job = Job(load_config(None, [f"out={out / 'sft'}", f"sft.demos={args.sft_demos}", f"sft.epochs={args.sft_epochs}"]),
              progress=args.verbose)
    job.start(resume=False)
    job.sft()
    job.close()
    return ckpt


def run_arm(out: Path, ckpt: Path, arm: str, seed: int, args) -> dict:
    from rlonce.config import load_config
    from rlonce.recipes.grpo import run
    from rlonce.telemetry.metrics import read_jsonl

    run_dir = out / f"{arm}-seed{seed}"
    cfg = load_config(None, [f"out={run_dir}", f"model.name={ckpt}", "sft.demos=0", f"runtime.seed={seed}",
                             f"rl.steps={args.steps}", f"rl.minibatches={args.minibatches}",
                             "algo.norm_by_std=true", "rollout.sync_dispatch_cap=1", f"eval.every={args.eval_every}",
                             f"eval.during_tasks={args.eval_tasks}", f"eval.heldout_tasks={args.final_tasks}",
                             f"checkpoint.every={args.steps + 1}", "checkpoint.keep=1", *ARMS[arm]])
    t0 = time.perf_counter()
    summary = run(cfg, progress=args.verbose)
    recs = read_jsonl(run_dir / "metrics.jsonl")
    steps = [r for r in recs if "reward_mean" in r]
    evals = {r["step"]: r["heldout_success"] for r in recs if "heldout_success" in r and not r.get("final")}
    evals[args.steps] = summary["final_success"]
    return {
        "arm": arm, "seed": seed, "wall_seconds": time.perf_counter() - t0,
        "baseline_success": summary["baseline_success"], "final_success": summary["final_success"],
        "reward": [r["reward_mean"] for r in steps],
        "retained_rows": [r["retained_rows"] for r in steps],
        "clipfrac": [r.get("clipfrac", 0.0) for r in steps],
        "entropy": [r.get("entropy", float("nan")) for r in steps],
        "heldout": {str(k): v for k, v in sorted(evals.items())},
    }


def steps_to_reach(curve: dict[str, float], target: float) -> int | None:
    for step, v in sorted(((int(k), v) for k, v in curve.items())):
        if step > 0 and v >= target:
            return step
    return None


def summarise(runs: list[dict], args) -> dict:
    arms: dict[str, dict] = {}
    for arm in dict.fromkeys(r["arm"] for r in runs):
        rs = [r for r in runs if r["arm"] == arm]
        keys = rs[0]["heldout"].keys()
        heldout = {k: statistics.mean(r["heldout"][k] for r in rs) for k in keys}
        arms[arm] = {
            "seeds": [r["seed"] for r in rs],
            "baseline_success": statistics.mean(r["baseline_success"] for r in rs),
            "final_success": statistics.mean(r["final_success"] for r in rs),
            "final_success_per_seed": [r["final_success"] for r in rs],
            "reward_last10": statistics.mean(x for r in rs for x in r["reward"][-10:]),
            "clipfrac_mean": statistics.mean(x for r in rs for x in r["clipfrac"]),
            "heldout_mean": heldout,
            "retained_fraction": statistics.mean(
                sum(r["retained_rows"]) / (args.steps * ROWS_PER_STEP) for r in rs),
            "wall_seconds_mean": statistics.mean(r["wall_seconds"] for r in rs),
        }
    target = arms["dapo"]["final_success"] if "dapo" in arms else None
    for a in arms.values():
        a["steps_to_dapo_final"] = None if target is None else steps_to_reach(a["heldout_mean"], target)
    return arms


def write_table(arms: dict, args, out: Path) -> str:
    lines = [f"Embedded toolfind task, {args.steps} steps × 8 tasks × 8 sequences, seeds {args.seeds}, "
             f"{args.minibatches} minibatches per update; held-out success on {args.final_tasks} tasks "
             f"(intermediate evals: {args.eval_tasks} tasks).", "",
             "| arm | baseline | final held-out (mean) | per seed | train reward, last 10 steps | "
             "clipped tokens (mean per step) | steps to DAPO's final | rows retained | wall s / run |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, a in arms.items():
        reach = a["steps_to_dapo_final"]
        lines.append(f"| {name} | {a['baseline_success']:.3f} | {a['final_success']:.3f} | "
                     f"{', '.join(f'{x:.3f}' for x in a['final_success_per_seed'])} | {a['reward_last10']:.3f} | "
                     f"{a['clipfrac_mean']:.4f} | "
                     f"{reach if reach is not None else 'not reached'} | {a['retained_fraction']:.2f} | "
                     f"{a['wall_seconds_mean']:.0f} |")
    table = "\n".join(lines)
    (out / "results.md").write_text(table + "\n")
    return table


def plot(runs: list[dict], arms: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8), dpi=100)
    for i, arm in enumerate(arms):
        c = f"C{i}"
        for r in (r for r in runs if r["arm"] == arm):
            xs = [int(k) for k in r["heldout"]]
            ax1.plot(xs, list(r["heldout"].values()), color=c, alpha=0.25, lw=1)
            ax2.plot(range(1, len(r["reward"]) + 1), r["reward"], color=c, alpha=0.2, lw=1)
        m = arms[arm]["heldout_mean"]
        ax1.plot([int(k) for k in m], list(m.values()), color=c, lw=2, marker="o", ms=3, label=arm)
        rs = [r["reward"] for r in runs if r["arm"] == arm]
        mean = [statistics.mean(v) for v in zip(*rs)]
        smooth = [statistics.mean(mean[max(0, k - 4):k + 1]) for k in range(len(mean))]
        ax2.plot(range(1, len(smooth) + 1), smooth, color=c, lw=2, label=f"{arm} (5-step mean)")
    ax1.set(xlabel="RL step", ylabel="held-out success", title="Held-out success (mean over seeds)")
    ax2.set(xlabel="RL step", ylabel="mean reward of the step's rollouts", title="Training reward")
    ax1.legend()
    ax2.legend()
    fig.tight_layout()
    fig.savefig(out / "objectives.png")


def main() -> None:
    ap = argparse.ArgumentParser(description="GRPO vs DAPO vs CISPO on the embedded task")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seeds", default="0,1", help="comma-separated rollout seeds, the same for every arm")
    ap.add_argument("--minibatches", type=int, default=4)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--eval-tasks", type=int, default=100)
    ap.add_argument("--final-tasks", type=int, default=200)
    ap.add_argument("--sft-demos", type=int, default=1000, help="the quickstart's SFT by default")
    ap.add_argument("--sft-epochs", type=int, default=5)
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated arms (default all: {', '.join(ARMS)})")
    ap.add_argument("--verbose", action="store_true", help="show each run's progress bars")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tqdm.auto import tqdm

    seeds = [int(s) for s in args.seeds.split(",")]
    chosen = [a for a in args.arms.split(",") if a]
    unknown = [a for a in chosen if a not in ARMS]
    if unknown:
        ap.error(f"unknown arm(s) {', '.join(unknown)}; known: {', '.join(ARMS)}")
    ckpt = sft_checkpoint(out, args)
    done = json.loads((out / "runs.json").read_text()) if (out / "runs.json").is_file() else []
    runs = [r for r in done if r["arm"] in chosen and r["seed"] in seeds]
    todo = [(a, s) for s in seeds for a in chosen if not any(r["arm"] == a and r["seed"] == s for r in runs)]
    bar = tqdm(todo, desc="objectives", unit="run")
    for arm, seed in bar:
        bar.set_postfix(arm=arm, seed=seed)
        runs.append(run_arm(out, ckpt, arm, seed, args))
        done.append(runs[-1])
        (out / "runs.json").write_text(json.dumps(done, indent=1) + "\n")
    arms = summarise(runs, args)
    (out / "results.json").write_text(json.dumps({"settings": vars(args), "arms": arms, "runs": runs}, indent=1) + "\n")
    print(write_table(arms, args, out))
    plot(runs, arms, out)


if __name__ == "__main__":
    main()
