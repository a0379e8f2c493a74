"""Scale-out on Ray: retained groups per minute with 1, 2, 4, 8 harness-pool actors, and the
overhead of the Ray executor against the local one on the quickstart.

    python benchmarks/ray_scaling/run.py --out DIR [--pools 1,2,4,8] [--latency 0.5]
                                         [--pool-sessions 16] [--steps 5] [--quickstart-steps N]
                                         [--skip-quickstart]

**Scaling.** A simulated-latency workload through the real orchestrator: real toolfind tasks,
real bubblewrap sandboxes, the real gateway, harness loop, grader and ``learning_signal``; only
the model is simulated. ``SimEngine`` waits ``--latency`` seconds per turn (log-normal jitter,
σ 0.3: a remote GPU engine's turn latency) and then replies as the scripted expert would for
the task it recognises in the prompt, except that its final answer is right with probability
1/2 — so groups have contrast and filtering is the real one. Each harness pool hosts at most
``--pool-sessions`` sequences (the orchestrator's session cap is pools × that); for each pool
count the same workload also runs on the local executor with the same session cap, side by
side. Measured over ``--steps`` synchronous steps after one warm-up step.

**Quickstart.** ``rlonce quickstart`` with ``--executor local`` and ``--executor ray`` (the
embedded model, SFT then GRPO; ``--quickstart-steps`` shortens the RL phase): wall time, mean RL
step time and held-out success of each, and their ratios.

Writes ``results.json``, ``results.md`` and ``ray_scaling.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from rlonce.config import load_config
from rlonce.engine.base import Generation, SamplingParams
from rlonce.engine.scripted import ScriptedEngine
from rlonce.telemetry.bench import write_table

REPO = Path(__file__).resolve().parents[2]


class SimEngine(ScriptedEngine):
    """An Engine whose turns take ``latency`` seconds and follow the toolfind expert (weights,
    pause and resume as the scripted engine's: there are none to load)."""

    def __init__(self, model_dir: str, arm: str, latency: float, seed: int):
        from rlonce.config import TaskConfig
        from rlonce.envs.domains import domain_for
        from rlonce.harness.arms import get_arm
        from rlonce.model import loader
        from rlonce.model.chat import get_format

        lm = loader.load(model_dir, weights=False)
        super().__init__([], lm.encode)
        self.encode, self.decode = lm.encode, lm.decode
        self.fmt = get_format(lm.chat_format)
        self.translate = get_arm(arm).translate
        self.latency = latency
        self.rng = random.Random(seed)
        self.version = 0
        self.tasks: dict[str, object] = {}
        domain = domain_for(TaskConfig())
        for i in range(4000):  # the training tasks the benchmark dispatches, by their question
            t = domain.task("train", i)
            self.tasks.setdefault(t.question, t)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        from rlonce.envs.toolfind.expert import expert_turns

        await asyncio.sleep(self.latency * math.exp(self.rng.gauss(0.0, 0.3)))
        text = self.decode(prompt_ids)
        task = next((t for q, t in self.tasks.items() if q in text), None)
        if task is None:
            raise ValueError("the simulated engine saw a task it does not know")
        turn = text.count("<|im_start|>assistant") - 1
        calls = expert_turns(task, random.Random(task.task_id), self.fmt, translate=self.translate)
        if turn >= len(calls) - 1 and self.rng.random() < 0.5:  # the final answer is wrong half the time
            calls = expert_turns(replace(task, answer="unknown"), random.Random(task.task_id), self.fmt,
                                 translate=self.translate)
        ids = self.encode(calls[min(turn, len(calls) - 1)])[: sampling.max_tokens]
        return Generation(ids, [-0.5] * len(ids), [self.version] * len(ids), "stop")

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class SimEngineFactory:
    model_dir: str
    arm: str
    latency: float
    seed: int = 0

    def __call__(self, index: int) -> SimEngine:
        return SimEngine(self.model_dir, self.arm, self.latency, self.seed + index)


async def _steps(orch, steps: int) -> dict:
    await orch.collect(1)  # warm-up
    t0 = time.perf_counter()
    groups = infra = 0
    for s in range(2, steps + 2):
        res = await orch.collect(s)
        groups += len(res.samples)
        infra += sum(e.infra_failed for e in res.ledger.values())
        for e in res.ledger.values():
            e.check()
    dt = time.perf_counter() - t0
    await orch.close()
    return {"retained_groups": groups, "seconds": dt, "seconds_per_step": dt / steps,
            "groups_per_min": 60.0 * groups / dt, "infra_failed": infra}


def scaling_point(args, pools: int, executor: str, out: Path) -> dict:
    from rlonce.recipes.grpo import Job

    sessions = pools * args.pool_sessions
    quota = max(1, 2 * sessions // args.group_size)  # two waves of work per step
    cfg = load_config(None, [f"out={out}", f"executor={executor}", "sft.demos=0", f"rl.group_size={args.group_size}",
                             f"rl.tasks_per_step={quota}", f"rl.concurrency={sessions}", f"ray.harness_pools={pools}",
                             f"ray.pool_sessions={args.pool_sessions}", "harness.max_turns=8"])
    job = Job(cfg, progress=False)
    job.start(False)
    factory = SimEngineFactory(str(job.ctx.model_dir), cfg.harness.arms[0], args.latency)
    t0 = time.perf_counter()
    job.ensure_engine(engine_factory=factory)  # this workload's model is simulated
    start = time.perf_counter() - t0
    try:
        r = asyncio.run(_steps(job.orchestrator(), args.steps))
    finally:
        job.close()
    r.update(executor=executor, pools=pools, sessions=sessions, groups_per_step=quota, start_seconds=start)
    print(f"  {executor:5s} pools={pools} sessions={sessions}: {r['groups_per_min']:.1f} retained groups/min "
          f"({r['retained_groups']} in {r['seconds']:.1f} s, infra {r['infra_failed']})", flush=True)
    return r


def quickstart(executor: str, out: Path, steps: int | None) -> dict:
    cmd = [sys.executable, "-m", "rlonce.cli", "quickstart", "--out", str(out), "--executor", executor, "--quiet"]
    if steps:
        cmd.append(f"rl.steps={steps}")
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=REPO)
    wall = time.perf_counter() - t0
    summary = json.loads((out / "summary.json").read_text())
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps_s = [r["step_seconds"] for r in recs if "step_seconds" in r]
    ledger = [json.loads(x) for x in (out / "ledger.jsonl").read_text().splitlines()]
    balanced = all(e["carried_in"] + e["dispatched"] == e["infra_failed"] + e["no_contrast_filtered"]
                   + e["penalty_rejected"] + e.get("unfinished_dropped", 0) + e["stale_dropped"] + e["retained"]
                   + e["carried_over"] for e in ledger)
    r = {"executor": executor, "process_seconds": wall, "job_seconds": summary["wall_seconds"],
         "rl_step_seconds_mean": sum(steps_s) / len(steps_s), "rl_steps": summary["rl_steps"],
         "baseline_success": summary["baseline_success"], "final_success": summary["final_success"],
         "heldout_tasks": summary["heldout_tasks"], "ledger_balanced": balanced,
         "infra_failed": sum(e["infra_failed"] for e in ledger)}
    print(f"  quickstart {executor}: {r['baseline_success']:.3f} -> {r['final_success']:.3f}, "
          f"{wall:.0f} s, {r['rl_step_seconds_mean']:.2f} s/step", flush=True)
    return r


def plot(path: Path, scaling: list[dict], quick: dict | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 if quick else 1, figsize=(11 if quick else 6.5, 3.8), dpi=100, squeeze=False)
    ax = axes[0][0]
    for executor, marker in (("local", "s"), ("ray", "o")):
        pts = [r for r in scaling if r["executor"] == executor]
        label = "Ray: N harness-pool actors" if executor == "ray" else "local executor, same session cap"
        ax.plot([r["pools"] for r in pts], [r["groups_per_min"] for r in pts], marker=marker, label=label)
    one = next((r["groups_per_min"] for r in scaling if r["executor"] == "ray" and r["pools"] == 1), None)
    if one:
        xs = sorted({r["pools"] for r in scaling})
        ax.plot(xs, [one * x for x in xs], ls=":", color="grey", label="linear from 1 pool")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("harness pools (× sessions per pool = session cap)")
    ax.set_ylabel("retained groups / minute")
    ax.set_title("simulated-latency workload, real orchestrator", fontsize=10)
    ax.legend(fontsize=8)
    if quick:
        ax = axes[0][1]
        names = ["local", "ray"]
        x = range(len(names))
        ax.bar([i - 0.2 for i in x], [quick[n]["baseline_success"] for n in names], 0.4, label="baseline (SFT)")
        ax.bar([i + 0.2 for i in x], [quick[n]["final_success"] for n in names], 0.4, label="after GRPO")
        for i, n in enumerate(names):
            ax.text(i + 0.2, quick[n]["final_success"] + 0.01, f"{quick[n]['process_seconds']:.0f} s", ha="center",
                    fontsize=8)
        ax.set_xticks(list(x), [f"--executor {n}" for n in names])
        ax.set_ylim(0, 1.1)
        ax.set_ylabel("held-out success")
        ax.set_title("quickstart: local vs Ray (wall time above the bars)", fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--pools", default="1,2,4,8")
    ap.add_argument("--latency", type=float, default=0.5, help="seconds per simulated model turn (default 0.5)")
    ap.add_argument("--pool-sessions", type=int, default=16, help="concurrent sequences per harness pool (default 16)")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5, help="measured steps after one warm-up (default 5)")
    ap.add_argument("--quickstart-steps", type=int, help="RL steps of each quickstart run (default: the quickstart's)")
    ap.add_argument("--skip-quickstart", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import ray

    from rlonce.dist.cluster import ray_temp_dir

    print("scaling (simulated latency):", flush=True)
    ray.init(num_cpus=64, include_dashboard=False, log_to_driver=False, _temp_dir=str(ray_temp_dir(out / "ray")))
    scaling = []
    try:
        for n in [int(x) for x in args.pools.split(",")]:
            for executor in ("local", "ray"):
                scaling.append(scaling_point(args, n, executor, out / f"sim-{executor}-{n}"))
    finally:
        ray.shutdown()
    ray_pts = {r["pools"]: r for r in scaling if r["executor"] == "ray"}
    local_pts = {r["pools"]: r for r in scaling if r["executor"] == "local"}
    base = ray_pts[min(ray_pts)]["groups_per_min"]
    results: dict = {"settings": vars(args), "scaling": scaling,
                     "ray_speedup_over_1_pool": {n: r["groups_per_min"] / base for n, r in ray_pts.items()},
                     "ray_over_local": {n: ray_pts[n]["groups_per_min"] / local_pts[n]["groups_per_min"]
                                        for n in ray_pts},
                     "ray_over_local_step_seconds": {
                         n: ray_pts[n]["seconds_per_step"] / local_pts[n]["seconds_per_step"] for n in ray_pts}}
    if not args.skip_quickstart:
        print("quickstart, local vs Ray:", flush=True)
        qs = {e: quickstart(e, out / f"quickstart-{e}", args.quickstart_steps) for e in ("local", "ray")}
        results["quickstart"] = qs
        results["quickstart_ray_over_local"] = {
            "process_seconds": qs["ray"]["process_seconds"] / qs["local"]["process_seconds"],
            "rl_step_seconds": qs["ray"]["rl_step_seconds_mean"] / qs["local"]["rl_step_seconds_mean"],
            "final_success_difference": qs["ray"]["final_success"] - qs["local"]["final_success"]}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")

    rows = [[str(n), str(ray_pts[n]["groups_per_step"]), f"{local_pts[n]['groups_per_min']:.1f}",
             f"{ray_pts[n]['groups_per_min']:.1f}", f"{results['ray_speedup_over_1_pool'][n]:.2f}×",
             f"{results['ray_over_local'][n]:.2f}", f"{results['ray_over_local_step_seconds'][n]:.2f}",
             f"{ray_pts[n]['start_seconds']:.0f}"] for n in sorted(ray_pts)]
    table = write_table(out / "results.md", ["harness pools", "groups / step", "local retained / min",
                                             "Ray retained / min", "Ray vs 1 pool", "Ray / local (retained)",
                                             "Ray / local (s per step)", "Ray actor start (s)"], rows)
    if "quickstart" in results:
        q, r = results["quickstart"], results["quickstart_ray_over_local"]
        qrows = [[e, f"{q[e]['baseline_success']:.3f} → {q[e]['final_success']:.3f}", f"{q[e]['process_seconds']:.0f}",
                  f"{q[e]['rl_step_seconds_mean']:.2f}", str(q[e]["ledger_balanced"])] for e in ("local", "ray")]
        qrows.append(["Ray / local", f"{r['final_success_difference']:+.3f}", f"{r['process_seconds']:.2f}",
                      f"{r['rl_step_seconds']:.2f}", ""])
        qtable = write_table(out / "quickstart.md", ["quickstart", "held-out success", "wall s", "s / RL step",
                                                     "ledger balanced"], qrows)
        (out / "results.md").write_text(table + "\n\n" + qtable + "\n")
        table += "\n\n" + qtable
    plot(out / "ray_scaling.png", scaling, results.get("quickstart"))
    print(table)


if __name__ == "__main__":
    main()
