"""What deterministic sync runs cost: the same job with ``runtime.deterministic`` on and off.

    python benchmarks/determinism/run.py --out DIR [--config configs/tiny_mixed.toml] [--steps 3] [--pairs 2]

Each pair runs the job twice at once with lockstep waves (``runtime.deterministic = true``, the
default) and twice at once without (waves by arrival time), so the two settings meet the same
machine load; the order of the settings alternates between pairs. Reported per setting: the RL
steps' rollout seconds and the whole run's wall seconds (medians over runs), and whether the two
runs of a pair ended with identical weights. ``results.json``, ``results.md`` and
``determinism.png`` go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_pair(out: Path, config: str, steps: int, deterministic: bool) -> list[dict]:
    """Two runs of the job at once; each one's rollout seconds, wall seconds and final weights digest."""
    procs, dirs = [], []
    for k in range(2):
        d = out / f"{'on' if deterministic else 'off'}-{time.monotonic_ns()}-{k}"
        dirs.append(d)
        procs.append((time.perf_counter(), subprocess.Popen(
            [sys.executable, "-m", "rlonce.cli", "train", config, f"out={d}", f"rl.steps={steps}", "eval.every=0",
             f"runtime.deterministic={str(deterministic).lower()}", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
    res = []
    for (t0, p), d in zip(procs, dirs):
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"run {d} failed: {err[-2000:]}")
        wall = time.perf_counter() - t0
        steps_m = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        steps_m = [m for m in steps_m if "rollout_seconds" in m]
        ckpt = sorted((d / "checkpoints").glob("step-*"))[-1] / "model.safetensors"
        res.append({"wall_seconds": wall, "rollout_seconds": sum(m["rollout_seconds"] for m in steps_m),
                    "weights": ckpt.read_bytes()})
    same = res[0].pop("weights") == res[1].pop("weights")
    for r in res:
        r["pair_identical"] = same
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", default=str(REPO / "configs" / "tiny_mixed.toml"))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=2)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for i in range(args.pairs):
        for setting in ((True, False) if i % 2 == 0 else (False, True)):
            runs["on" if setting else "off"] += run_pair(out / "runs", args.config, args.steps, setting)
            print(f"pair {i + 1}, deterministic={setting}: {runs['on' if setting else 'off'][-2:]}", flush=True)
    summary = {}
    for k, rs in runs.items():
        summary[k] = {"wall_seconds": statistics.median(r["wall_seconds"] for r in rs),
                      "rollout_seconds": statistics.median(r["rollout_seconds"] for r in rs),
                      "pairs_identical": sum(r["pair_identical"] for r in rs[::2]), "pairs": len(rs) // 2}
    ratio = {m: summary["on"][m] / summary["off"][m] for m in ("wall_seconds", "rollout_seconds")}
    (out / "results.json").write_text(json.dumps({"config": args.config, "steps": args.steps, "runs": runs,
                                                  "summary": summary, "on_over_off": ratio}, indent=2) + "\n")
    lines = ["| runtime.deterministic | wall s (median) | rollout s (median) | pairs with identical weights |",
             "|---|---|---|---|"]
    for k in ("on", "off"):
        s = summary[k]
        lines.append(f"| {'true' if k == 'on' else 'false'} | {s['wall_seconds']:.1f} | {s['rollout_seconds']:.1f} "
                     f"| {s['pairs_identical']} / {s['pairs']} |")
    lines.append(f"\non / off: wall {ratio['wall_seconds']:.2f}×, rollout {ratio['rollout_seconds']:.2f}×")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, k in enumerate(("on", "off")):
        ax.scatter([i] * len(runs[k]), [r["rollout_seconds"] for r in runs[k]], label=f"deterministic={k}")
    ax.set_xticks([0, 1], ["deterministic", "arrival-time waves"])
    ax.set_ylabel("rollout seconds per run")
    ax.set_title("Lockstep waves: the cost of determinism")
    fig.tight_layout()
    fig.savefig(out / "determinism.png", dpi=120)


if __name__ == "__main__":
    main()
