"""A training config's GRPO step time, a git revision against this tree, side by side on one machine.

    python benchmarks/steptime/run.py --out DIR --against REV [--config CONFIG.toml ...] [--steps 3]
                                      [--set KEY=VALUE ...]

For each ``--config`` (default: ``configs/smollm2_reasoning.toml`` and the toolfind transfer config
``configs/transfer_smollm2.toml``): when the config fine-tunes first (``sft.demos`` > 0), SFT runs
once, with this tree (``rlonce train CONFIG rl.steps=0``), and both arms start from its checkpoint
(``sft.demos=0``), so both train the same weights; then revision REV's ``src`` (exported with
``git archive``) and this tree's each run ``rlonce train CONFIG`` — this tree's config in both, so
what differs is the code — for ``--steps`` GRPO steps in a child process, one after the other,
one held-out task (the fewest a run takes) and no checkpoint before the end. Each arm's figures are
the means over its steps after the first (the first warms caches and compiles): ``step_seconds``
(the whole step), ``rollout_seconds``, ``train_seconds`` and generated tokens per step, from its
``metrics.jsonl``. An arm whose folder holds a finished run (``summary.json``) is read, not rerun.

Writes ``results.json``, ``results.md`` and ``steptime.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

CONFIGS = ["configs/smollm2_reasoning.toml", "configs/transfer_smollm2.toml"]
OFF = ["eval.heldout_tasks=1", "eval.every=0", "checkpoint.every=1000"]  # the fewest held-out tasks a run takes


def train(run_dir: Path, config: str, overrides: list[str], src: Path) -> None:
    """``rlonce train CONFIG --out run_dir OVERRIDES`` with ``src`` first on the path, unless done."""
    if (run_dir / "summary.json").is_file():
        return
    if run_dir.exists():
        shutil.rmtree(run_dir)  # an interrupted arm starts again
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "rlonce.cli", "train", config, "--out", str(run_dir), "--quiet", *overrides]
    print("$", " ".join(cmd[2:]), f"(src: {src})", flush=True)
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)


def figures(run_dir: Path) -> dict:
    """Means over the steps after the first of ``run_dir``'s step, rollout and train seconds."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "step_seconds" in r]
    timed = steps[1:] or steps

    def mean(key):
        vals = [r[key] for r in timed if key in r]
        return sum(vals) / len(vals) if vals else None

    gen = [r["generated_tokens_per_s"] * r["rollout_seconds"] for r in timed
           if "generated_tokens_per_s" in r and "rollout_seconds" in r]
    return {"run_dir": str(run_dir), "steps": len(steps), "timed_steps": len(timed),
            "step_seconds": mean("step_seconds"), "rollout_seconds": mean("rollout_seconds"),
            "train_seconds": mean("train_seconds"), "trained_tokens": mean("trained_tokens"),
            "generated_tokens": sum(gen) / len(gen) if gen else None,
            "all_step_seconds": [r["step_seconds"] for r in steps]}


def measure(args, out: Path, before: Path) -> dict:
    here = ROOT / "src"
    results = {}
    for config in args.config:
        name = Path(config).stem
        start = []
        cfg = _config(config, args.set)
        if cfg.sft.demos > 0:
            sft = out / name / "sft"
            train(sft, config, ["rl.steps=0", *OFF, *args.set], here)
            start = [f"model.name={sft / 'checkpoints' / 'step-0000'}", "sft.demos=0"]
        arms = {}
        for arm, src in (("before", before / "src"), ("after", here)):
            run_dir = out / name / arm
            train(run_dir, config, [*start, f"rl.steps={args.steps}", *OFF, *args.set], src)
            arms[arm] = figures(run_dir)
        results[name] = {"config": config, "overrides": [*start, *args.set], **arms}
    return results


def _config(path: str, overrides: list[str]):
    from rlonce.config import load_config

    return load_config(path, [o for o in overrides if "=" in o])


def fmt(x, spec=".1f") -> str:
    return "–" if x is None else format(x, spec)


def table(results: dict, out: Path, commit: str) -> str:
    from rlonce.telemetry.bench import write_table

    head = ["config", "s/step before → after", "after / before", "rollout s", "train s", "generated tokens/step",
            "trained tokens/step"]
    rows = []
    for name, r in results.items():
        b, a = r["before"], r["after"]
        rows.append([name, f"{fmt(b['step_seconds'])} → {fmt(a['step_seconds'])}",
                     f"{a['step_seconds'] / b['step_seconds']:.2f}×",
                     f"{fmt(b['rollout_seconds'])} → {fmt(a['rollout_seconds'])}",
                     f"{fmt(b['train_seconds'])} → {fmt(a['train_seconds'])}",
                     f"{fmt(b['generated_tokens'], '.0f')} → {fmt(a['generated_tokens'], '.0f')}",
                     f"{fmt(b['trained_tokens'], '.0f')} → {fmt(a['trained_tokens'], '.0f')}"])
    note = (f"\n\nBefore: revision {commit[:10]}; after: this tree. Means over each arm's steps after the first "
            f"({', '.join(str(r['after']['timed_steps']) for r in results.values())} steps).")
    text = write_table(out / "results.md", head, rows) + note
    (out / "results.md").write_text(text + "\n")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--against", required=True, metavar="REV", help="the git revision measured as 'before'")
    ap.add_argument("--config", nargs="+", default=CONFIGS)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every run")
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be at least 2: the first step is not timed")
    from rlonce.telemetry.bench import paired_bars, source_of

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    before, commit = source_of(args.against)
    try:
        results = measure(args, out, before)
    finally:
        shutil.rmtree(before, ignore_errors=True)
    (out / "results.json").write_text(json.dumps({"against": commit, "steps": args.steps, "configs": results},
                                                 indent=1))
    print(table(results, out, commit))
    paired_bars(out / "steptime.png", list(results),
                {"before": [r["before"]["step_seconds"] for r in results.values()],
                 "after": [r["after"]["step_seconds"] for r in results.values()]},
                ylabel="seconds per GRPO step", log=False, title=f"GRPO step time, {commit[:10]} → this tree")


if __name__ == "__main__":
    main()
