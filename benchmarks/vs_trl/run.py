"""rlonce vs TRL ``GRPOTrainer``: the same GRPO steps side by side, per model, in one invocation.

    python benchmarks/vs_trl/run.py --out DIR [--models embedded,smollm2] [--steps 6]

For each model both frameworks start from the same weights and train on the same rule-verified
reasoning tasks (reasoning-gym ``chain_sum``, two terms of 1–2 digits, rlonce's reasoning
domain: same prompts, same reward = correctness + 0.1 format), the same seed, group size,
prompts per step, max new tokens, sampling temperature, learning rate, AdamW (β 0.9/0.95,
ε 1e-8, constant rate, clip 1.0), PPO clip 0.2/0.28 with dual clip 3, token-mean loss, no KL,
mean-centred advantages, one optimizer step per generation batch, and the same torch thread
count. rlonce runs its real job (sync mode: engine, gateway, single-turn harness, grader,
orchestrator, trainer, weight reload) with dynamic filtering off, so both sides train on every
completion; TRL's settings and what cannot be matched are listed in ``trl_side.py``.

Held-out accuracy is measured for both by one evaluator — rlonce's held-out evaluation (the
same tasks, seeded sampling at the training temperature) on a copy of each side's weights — at
step 0, every ``--eval-every`` steps and at the end; it is outside the timed steps.

Writes ``results.json`` (per model: ``rlonce_step_seconds``, ``trl_step_seconds``, ``speedup``,
rollout/update split, generated tokens/s, per-step rewards and held-out accuracy of both),
``results.md`` and ``vs_trl.png``. Step times are means over the steps after the first (which
pays one-time costs); the first step is reported separately.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TASK_OPTIONS = {"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}}


def base_overrides(a, model: str, out: Path) -> list[str]:
    return [
        f"out={out}", f"model.name={model}", "task.name=reasoning", "task.datasets=[chain_sum]",
        "harness.arms=[single-turn]", "sft.demos=0", f"rl.steps={a.steps}", f"rl.tasks_per_step={a.prompts}",
        f"rl.group_size={a.group_size}", f"rl.lr={a.lr}", "rl.minibatches=1", "rl.optimizer=adamw-gpt3",
        "algo.filter_no_contrast=false", "algo.aggregation=token-mean",
        f"harness.max_tokens_per_turn={a.max_new_tokens}", f"harness.temperature={a.temperature}",
        "harness.max_context=512", f"runtime.seed={a.seed}",
        f"runtime.rollout_threads={a.threads}", f"runtime.train_threads={a.threads}", "eval.every=0",
        "checkpoint.every=1000000",
    ]


def make_config(a, model: str, out: Path, extra: tuple[str, ...] = ()):
    from rlonce.config import RunConfig, load_config

    cfg = load_config(None, [*base_overrides(a, model, out), *extra])
    task = cfg.task.model_copy(update={"options": TASK_OPTIONS})
    return RunConfig.model_validate({**cfg.model_dump(), "task": task.model_dump()})


class Evaluator:
    """rlonce's held-out evaluation on its own engine; weights are copied in from either side."""

    def __init__(self, cfg, model_dir: Path, n: int):
        from rlonce.recipes.grpo import Job

        self.job = Job.for_model(cfg, str(model_dir), progress=False)
        self.n = n

    async def evaluate(self, model) -> float:
        import torch

        self.job.engine.load_weights({k: v.detach().to(torch.float32) for k, v in model.state_dict().items()}, 0)
        return (await self.job.evaluate_async("eval", n=self.n))["success"]

    def __call__(self, model) -> float:
        return asyncio.run(self.evaluate(model))

    def close(self) -> None:
        self.job.close()


def run_rlonce(a, cfg, evaluate: Evaluator) -> dict:
    from rlonce.recipes.grpo import Job
    from rlonce.recipes.rl import rl_step

    job = Job(cfg, progress=not a.quiet)
    job.start(resume=False)
    heldout = {"0": evaluate(job.ctx.lm.model)}
    steps = []

    async def loop():
        orch = job.orchestrator()
        try:
            for s in range(1, a.steps + 1):
                rec = await rl_step(job, orch)
                steps.append({"step": s, "rollout_seconds": rec["rollout_seconds"],
                              "update_seconds": rec["train_seconds"], "step_seconds": rec["step_seconds"],
                              "generated_tokens": rec["response_tokens_mean"] * a.prompts * a.group_size,
                              "reward_mean": rec["reward_mean"], "peak_rss_mb": rec["peak_rss_mb"],
                              "mismatch_kl": rec.get("mismatch_kl")})
                if s % a.eval_every == 0 or s == a.steps:
                    heldout[str(s)] = await evaluate.evaluate(job.ctx.lm.model)
                if not a.quiet:
                    print(f"  rlonce step {s}: {rec['step_seconds']:.1f}s (rollout {rec['rollout_seconds']:.1f}, "
                          f"update {rec['train_seconds']:.1f}) reward {rec['reward_mean']:.3f}", flush=True)
        finally:
            await orch.close()

    asyncio.run(loop())
    job.close()
    return {"steps": steps, "heldout": heldout}


def run_trl_side(a, cfg, model_dir: Path, evaluate, work: Path, bf16: bool = False) -> dict:
    from benchmarks.vs_trl.trl_side import run_trl
    from rlonce.envs.domains import domain_for
    from rlonce.envs.reasoning import verify

    domain = domain_for(cfg.task)
    env = domain.env_factory(domain.task("train", 0))
    tasks = [domain.task("train", i) for i in range(a.steps * a.prompts)]
    prompts = [[{"role": "system", "content": env.system_prompt()}, {"role": "user", "content": t.question}]
               for t in tasks]

    def reward_fn(text: str, i: int) -> float:
        return verify.reward(tasks[i], text, cfg.task.format_weight)[0]

    return run_trl(str(model_dir), prompts, reward_fn, group_size=a.group_size, prompts_per_step=a.prompts,
                   max_new_tokens=a.max_new_tokens, lr=a.lr, steps=a.steps, seed=a.seed, temperature=a.temperature,
                   eval_fn=lambda model, step: evaluate(model), eval_every=a.eval_every, threads=a.threads,
                   work_dir=str(work), progress=not a.quiet, bf16=bf16)


def summarize(r: dict) -> dict:
    later = r["steps"][1:] or r["steps"]
    mean = lambda k: statistics.fmean(s[k] for s in later)  # noqa: E731
    return {"step_seconds": mean("step_seconds"), "rollout_seconds": mean("rollout_seconds"),
            "update_seconds": mean("update_seconds"), "first_step_seconds": r["steps"][0]["step_seconds"],
            "generated_tokens_per_s": (sum(s["generated_tokens"] for s in later)
                                       / sum(s["rollout_seconds"] for s in later)),
            "rewards": [s["reward_mean"] for s in r["steps"]], "heldout": r["heldout"],
            "elapsed": _elapsed(r["steps"]),
            "peak_rss_mb": max((s.get("peak_rss_mb") or 0.0 for s in r["steps"]), default=0.0),
            "mismatch_kl": [s.get("mismatch_kl") for s in r["steps"]]}


def _elapsed(steps: list[dict]) -> dict[str, float]:
    """Training seconds spent by the end of each step (evaluations excluded), keyed as ``heldout``."""
    out, t = {"0": 0.0}, 0.0
    for s in steps:
        t += s["step_seconds"]
        out[str(s["step"])] = t
    return out


def time_to(x: dict, target: float) -> float | None:
    """Training seconds until ``x``'s held-out accuracy first reached ``target`` (None: never)."""
    for step, acc in sorted(x["heldout"].items(), key=lambda kv: int(kv[0])):
        if acc >= target:
            return x["elapsed"][step]
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="embedded,smollm2")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=8, help="prompts (tasks) per step")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-tasks", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=3)
    ap.add_argument("--with-filtering", action="store_true",
                    help="also run rlonce with its default dynamic filtering on (skips the update on groups whose "
                         "rewards are all equal; not equal work, reported separately)")
    ap.add_argument("--fast", action="store_true",
                    help="also report each side in its fastest CPU configuration: the faster per step of its "
                         "float32 run and a bfloat16 one (rlonce with bfloat16 autocast and one rollout thread, its "
                         "defaults otherwise; TRL with bf16 mixed precision); on a CPU without bfloat16 units "
                         "(avx512_bf16, amx_bf16), where emulated bfloat16 is many times slower, no bfloat16 run: "
                         "the float32 runs are reported again")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    if a.eval_every < 1:
        ap.error("--eval-every must be at least 1: the tables compare held-out accuracy")
    if importlib.util.find_spec("trl") is None:  # before minutes of rlonce runs, not after
        sys.exit("benchmarks/vs_trl: TRL is not installed; run `make bench-trl` (it installs the bench extra) "
                 "or `pip install -e '.[bench]'`")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    from rlonce.model import loader
    from rlonce.model.precision import bf16_units

    results = {"settings": {k: v for k, v in vars(a).items() if k not in ("out", "quiet")}, "models": {}}
    for model in a.models.split(","):
        cfg = make_config(a, model, out / model / "rlonce")
        model_dir = loader.resolve(model, out / "cache")
        evaluator = Evaluator(make_config(a, model, out / model / "eval"), model_dir, a.eval_tasks)
        print(f"[vs_trl] {model}: rlonce", flush=True)
        t0 = time.perf_counter()
        ours = run_rlonce(a, cfg, evaluator)
        t1 = time.perf_counter()
        print(f"[vs_trl] {model}: TRL", flush=True)
        theirs = run_trl_side(a, cfg, model_dir, evaluator, out / model / "trl")
        t2 = time.perf_counter()
        filtered = None
        if a.with_filtering:
            print(f"[vs_trl] {model}: rlonce with dynamic filtering", flush=True)
            filtered = summarize(run_rlonce(a, make_config(a, model, out / model / "rlonce-filter",
                                                           ("algo.filter_no_contrast=true",)), evaluator))
        fast = None
        if a.fast and not bf16_units():  # emulated bfloat16 is many times slower than float32
            print(f"[vs_trl] {model}: this CPU has no bfloat16 units (avx512_bf16, amx_bf16): float32 is each "
                  "side's fastest configuration", flush=True)
            fast = faster_of({"rlonce": [(summarize(ours), FP32)], "trl": [(summarize(theirs), FP32)]})
        elif a.fast:
            print(f"[vs_trl] {model}: rlonce fastest (bfloat16 autocast, 1 rollout thread)", flush=True)
            fast_o = summarize(run_rlonce(a, make_config(a, model, out / model / "rlonce-fast",
                                                         ("model.autocast=bfloat16", "runtime.rollout_threads=1")),
                                          evaluator))
            print(f"[vs_trl] {model}: TRL fastest (bf16)", flush=True)
            fast_t = summarize(run_trl_side(a, cfg, model_dir, evaluator, out / model / "trl-fast", bf16=True))
            fast = faster_of({"rlonce": [(summarize(ours), FP32), (fast_o, RLONCE_BF16)],
                              "trl": [(summarize(theirs), FP32), (fast_t, TRL_BF16)]})
        evaluator.close()
        o, t = summarize(ours), summarize(theirs)
        results["models"][model] = {
            "rlonce_step_seconds": o["step_seconds"], "trl_step_seconds": t["step_seconds"],
            "speedup": t["step_seconds"] / o["step_seconds"],
            "rlonce_rewards": o["rewards"], "trl_rewards": t["rewards"],
            "rlonce_heldout": o["heldout"], "trl_heldout": t["heldout"],
            "rollout_speedup": t["rollout_seconds"] / o["rollout_seconds"],
            "update_speedup": t["update_seconds"] / o["update_seconds"],
            "rlonce": o, "trl": t, "rlonce_steps": ours["steps"], "trl_steps": theirs["steps"],
            "trl_version": theirs.get("trl_version"), "trl_settings": theirs.get("settings"),
            "wall_seconds": {"rlonce": t1 - t0, "trl": t2 - t1},
        }
        target = list(t["heldout"].values())[-1]
        results["models"][model]["time_to_trl_final"] = {
            "target": target, "rlonce": time_to(o, target), "trl": time_to(t, target),
            **({"rlonce_fastest": time_to(fast["rlonce"], target), "trl_fastest": time_to(fast["trl"], target)}
               if fast else {})}
        if fast is not None:
            results["models"][model]["fastest"] = fast
        if filtered is not None:
            results["models"][model]["rlonce_filtering"] = filtered
            results["models"][model]["speedup_with_filtering"] = t["step_seconds"] / filtered["step_seconds"]
        print(f"[vs_trl] {model}: rlonce {o['step_seconds']:.2f}s/step, TRL {t['step_seconds']:.2f}s/step, "
              f"speedup {t['step_seconds'] / o['step_seconds']:.2f}x", flush=True)
        (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    write_table(results, out)
    plot(results, out)


FP32 = "float32 (the run above)"
RLONCE_BF16 = "bfloat16 autocast, 1 rollout thread"
TRL_BF16 = "bf16"


def faster_of(runs: dict[str, list[tuple[dict, str]]]) -> dict:
    """Each side's fastest configuration: of its runs (summary, configuration), the one with the
    fewest seconds per step, its configuration under ``config``; and the speedup between them."""
    fast = {side: {**x, "config": how} for side, options in runs.items()
            for x, how in [min(options, key=lambda o: o[0]["step_seconds"])]}
    fast["speedup"] = fast["trl"]["step_seconds"] / fast["rlonce"]["step_seconds"]
    return fast


def write_table(results: dict, out: Path) -> None:
    lines = ["| model | side | s/step | rollout s | update s | first step s | gen tok/s | reward (first→last) | "
             "held-out (0→end) | speedup (TRL s / rlonce s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for model, r in results["models"].items():
        for side in ("rlonce", "trl", "rlonce_filtering"):
            if side not in r:
                continue
            x = r[side]
            h = list(x["heldout"].values())
            sp = {"rlonce": f"{r['speedup']:.2f}× (rollout {r['rollout_speedup']:.2f}×, update "
                            f"{r['update_speedup']:.2f}×)",
                  "rlonce_filtering": f"{r.get('speedup_with_filtering', 0):.2f}× (not equal work)"}.get(side, "")
            lines.append(f"| {model} | {side} | {x['step_seconds']:.2f} | {x['rollout_seconds']:.2f} | "
                         f"{x['update_seconds']:.2f} | {x['first_step_seconds']:.2f} | "
                         f"{x['generated_tokens_per_s']:.0f} | "
                         f"{x['rewards'][0]:.3f}→{x['rewards'][-1]:.3f} | {h[0]:.3f}→{h[-1]:.3f} | {sp} |")
    fastest = {m: r["fastest"] for m, r in results["models"].items() if "fastest" in r}
    if fastest:
        lines += ["", "Each side in its fastest CPU configuration (the faster per step of its float32 run and, "
                  "where the CPU has bfloat16 units, a bfloat16 one):", "",
                  "| model | side | configuration | s/step | rollout s | update s | held-out (0→end) | "
                  "speedup (TRL s / rlonce s) |", "|---|---|---|---|---|---|---|---|"]
        for model, f in fastest.items():
            for side in ("rlonce", "trl"):
                x, h = f[side], list(f[side]["heldout"].values())
                sp = f"{f['speedup']:.2f}×" if side == "rlonce" else ""
                lines.append(f"| {model} | {side} | {x['config']} | {x['step_seconds']:.2f} | "
                             f"{x['rollout_seconds']:.2f} | {x['update_seconds']:.2f} | {h[0]:.3f}→{h[-1]:.3f} | "
                             f"{sp} |")
    lines += ["", "Training seconds (evaluations excluded) until the held-out accuracy first reached TRL's final "
              "fp32 one:", "", "| model | TRL's final | rlonce | TRL | rlonce fastest | TRL fastest |",
              "|---|---|---|---|---|---|"]
    for model, r in results["models"].items():
        tt = r["time_to_trl_final"]
        cell = lambda v: "not reached" if v is None else f"{v:.0f} s"  # noqa: E731
        lines.append(f"| {model} | {tt['target']:.3f} | {cell(tt['rlonce'])} | {cell(tt['trl'])} | "
                     f"{cell(tt['rlonce_fastest']) if 'rlonce_fastest' in tt else '-'} | "
                     f"{cell(tt['trl_fastest']) if 'trl_fastest' in tt else '-'} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(results["models"])
    fig, axes = plt.subplots(len(models), 3, figsize=(13, 3.4 * len(models)), squeeze=False)
    for row, model in zip(axes, models):
        r = results["models"][model]
        ax = row[0]
        for k, side in enumerate(("rlonce", "trl")):
            x = r[side]
            ax.bar(k, x["rollout_seconds"], color="tab:blue", label="rollout" if k == 0 else None)
            ax.bar(k, x["update_seconds"], bottom=x["rollout_seconds"], color="tab:orange",
                   label="update" if k == 0 else None)
        ax.set_xticks([0, 1], ["rlonce", "TRL"])
        ax.set_ylabel("seconds / step")
        ax.set_title(f"{model}: step time ({r['speedup']:.2f}× faster)", fontsize=10)
        ax.legend(fontsize=8)
        for side, style in (("rlonce", "-o"), ("trl", "--s")):
            row[1].plot(range(1, len(r[side]["rewards"]) + 1), r[side]["rewards"], style, ms=3, label=side)
            h = r[side]["heldout"]
            row[2].plot([int(k) for k in h], list(h.values()), style, ms=3, label=side)
        row[1].set_title(f"{model}: training reward", fontsize=10)
        row[2].set_title(f"{model}: held-out accuracy", fontsize=10)
        for ax in row[1:]:
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "vs_trl.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
