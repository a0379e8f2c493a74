"""Held-out harness transfer, fairly (issue 58, item 4): does training under several harness arms
help under a harness never trained on, when every trained arm gets as much training as the one arm
of the control?

    python benchmarks/harness_transfer/run.py --out DIR [--config CONFIG.toml] [--arms multi-s0,one-s0]
                                              [--accept-changes] [KEY=VALUE ...]

For each seed of ``[benchmark] seeds`` two arms, each a ``rlonce train`` job in a child process:

* ``multi-s<seed>`` — the config's ``harness.arms`` (three by default), with ``sft.demos`` and
  ``rl.tasks_per_step`` multiplied by their number: the config's counts are per trained arm.
* ``one-s<seed>`` — the first of those arms alone, at the config's counts.

Both arms of a seed run ``runtime.seed = seed``. After training, each arm's SFT checkpoint
(``step-0000``) is evaluated under the held-out arm (``[benchmark] heldout_arm``, mini-codex:
the Responses API with ``exec_command``/``apply_patch``) and its final checkpoint under the held-out
arm and under mini-swe-agent (an outside agent, ``python -m rlonce.harness.mswea``, served over
HTTP by the gateway), ``heldout_tasks`` and ``outside_tasks`` held-out tasks each — the same tasks
and seeded attempts in every arm, so every comparison is paired (``rlonce.recipes.evaluate.
paired_change``): multi − one per seed, and over both seeds the mean of the seeds' differences with
the standard error √(SE₀² + SE₁²)/2; GRPO's part (final − SFT) per arm.

Restartable (``rlonce.telemetry.restartable``): the config is copied to ``DIR/config.toml``; a
trained arm resumes from its checkpoint, an evaluation that finished is kept
(``DIR/<arm>/heldout/<name>/result.json``). Whatever has finished is written after every arm:
``results.json``, ``results.md`` and ``harness_transfer.png``.

``KEY=VALUE`` overrides apply to every arm; ``benchmark.KEY=VALUE`` ones to the ``[benchmark]``
table (``model.name=embedded rl.steps=1 benchmark.seeds=[0] benchmark.heldout_tasks=4`` for a
smoke run).
"""

from __future__ import annotations

import json
import math
import sys
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from rlonce.telemetry import restartable

HERE = Path(__file__).resolve().parent
DEFAULT_CONFIG = HERE / "smollm2.toml"


@dataclass(frozen=True)
class Bench:
    """The ``[benchmark]`` table: what is evaluated, and how."""

    seeds: tuple[int, ...] = (0, 1)
    heldout_arm: str = "mini-codex"
    heldout_tasks: int = 100
    outside_tasks: int = 100
    """Held-out tasks of mini-swe-agent (0: not evaluated)."""
    outside_concurrency: int = 6
    outside_timeout: float = 300.0


def split(data: dict, overrides: list[str]) -> tuple[dict, Bench, list[str]]:
    """The run config's table, the ``[benchmark]`` settings (with ``benchmark.*`` overrides) and the
    run overrides."""
    data = dict(data)
    table = dict(data.pop("benchmark", {}))
    run = []
    for o in overrides:
        key, eq, value = o.partition("=")
        if not key.startswith("benchmark."):
            run.append(o)
            continue
        try:
            table[key.removeprefix("benchmark.")] = tomllib.loads(f"v = {value}")["v"] if eq else None
        except tomllib.TOMLDecodeError:
            raise SystemExit(f"error: {o}: the value is not TOML (e.g. benchmark.seeds=[0,1])") from None
    known = {f.name for f in fields(Bench)}
    if unknown := sorted(set(table) - known):
        raise SystemExit(f"error: unknown [benchmark] key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    try:
        bench = Bench(**{k: tuple(v) if k == "seeds" else v for k, v in table.items()})
    except TypeError as e:
        raise SystemExit(f"error: [benchmark]: {e}") from None
    if not bench.seeds or len(set(bench.seeds)) != len(bench.seeds):
        raise SystemExit("error: [benchmark] seeds must name one seed or more, each once")
    return data, bench, run


def trained_arms(data: dict, overrides: list[str]) -> list[str]:
    from rlonce.config.load import validate

    arms = list(validate(data, overrides).harness.arms)
    if len(arms) < 2:
        raise SystemExit(f"error: a transfer comparison needs two or more harness.arms to train under; "
                         f"the config has {arms}")
    return arms


def arm_names(bench: Bench) -> list[str]:
    return [f"{kind}-s{s}" for s in bench.seeds for kind in ("multi", "one")]


def arm_config(arm: str, data: dict, overrides: list[str], out: Path):
    """The training config of ``multi-s<seed>`` or ``one-s<seed>``."""
    from rlonce.config.load import validate

    kind, seed = arm.rsplit("-s", 1)
    base = validate(data, overrides)
    arms = trained_arms(data, overrides)
    arms = arms if kind == "multi" else arms[:1]
    n = len(arms)
    return validate(data, [*overrides, f"out={out / arm}", f"runtime.seed={seed}", f"harness.arms={json.dumps(arms)}",
                           f"sft.demos={base.sft.demos * n}", f"rl.tasks_per_step={base.rl.tasks_per_step * n}",
                           "checkpoint.keep=0"])


def evaluations(bench: Bench) -> list[tuple[str, bool]]:
    """(checkpoint, with mini-swe-agent): the SFT model under the held-out arm, the final one under both."""
    return [("sft", False), ("final", bench.outside_tasks > 0)]


def arm_state(out: Path, arm: str) -> str:
    if (out / arm / "heldout.json").is_file():
        return "done"
    return "resumable" if restartable.run_state(out / arm) != "new" else "new"


# ---- one arm, in its own process ------------------------------------------------------------
def child(arm: str, args) -> None:
    """Trains the arm (resuming it), then runs each evaluation that has not finished."""
    from rlonce.config.load import validate
    from rlonce.recipes.grpo import evaluate_model, run

    data, bench, overrides = split(restartable.read_config(args.config), args.overrides)
    cfg = arm_config(arm, data, overrides, args.out)
    run_dir = args.out / arm
    if (state := restartable.run_state(run_dir)) != "done":
        run(cfg, resume=state == "resumable", progress=not args.quiet, accept_changes=args.accept_changes)
    steps = json.loads((run_dir / "summary.json").read_text())["rl_steps"]
    done = {}
    for name, outside in evaluations(bench):
        where = run_dir / "heldout" / name
        if not (where / "result.json").is_file():
            ckpt = run_dir / "checkpoints" / f"step-{0 if name == 'sft' else steps:04d}"
            ecfg = validate(data, [*overrides, f"out={where}", f'harness.arms=["{bench.heldout_arm}"]'])
            res = evaluate_model(ecfg, str(ckpt), bench.heldout_tasks, progress=not args.quiet,
                                 harness_cmd="python -m rlonce.harness.mswea" if outside else None,
                                 harness_name="mini-swe-agent", harness_tasks=bench.outside_tasks,
                                 harness_timeout=bench.outside_timeout, harness_concurrency=bench.outside_concurrency)
            (where / "result.json").write_text(json.dumps({"checkpoint": str(ckpt), **res}, indent=2) + "\n")
        done[name] = json.loads((where / "result.json").read_text())
    (run_dir / "heldout.json").write_text(json.dumps(done, indent=2) + "\n")


# ---- results --------------------------------------------------------------------------------
def _eval_file(out: Path, arm: str, name: str, harness: str) -> Path:
    return out / arm / "heldout" / name / "eval" / ("eval.jsonl" if harness != "mini-swe-agent" else
                                                    "mini-swe-agent.jsonl")


def _success(path: Path) -> dict | None:
    if not path.is_file():
        return None
    every = [json.loads(line) for line in path.read_text().splitlines()]
    rows = [r for r in every if not r["infra_failed"]]
    n = len(rows)
    s = sum(r["passed"] for r in rows) / n if n else 0.0
    return {"success": s, "tasks": n, "success_se": math.sqrt(s * (1 - s) / n) if n else 0.0,
            "infra_failed": len(every) - n}


def _paired(a: Path, b: Path) -> dict | None:
    from rlonce.recipes.evaluate import paired_change

    return paired_change(a, b)


COLUMNS = [("sft", "heldout"), ("final", "heldout"), ("final", "mini-swe-agent")]


def results(out: Path, bench: Bench, data: dict, overrides: list[str]) -> dict:
    """Per seed and arm: in-run success per trained arm and held-out success per column; per seed the
    paired multi − one and GRPO's part; over the seeds, the mean difference and its SE."""
    per_seed, compare = {}, {}
    for seed in bench.seeds:
        arms = {}
        for kind in ("multi", "one"):
            arm = f"{kind}-s{seed}"
            summary = out / arm / "summary.json"
            row = {"state": arm_state(out, arm)}
            if summary.is_file():
                row["trained_arms"] = json.loads(summary.read_text())["final_success_per_arm"]
            for name, harness in COLUMNS:
                row[f"{name}/{harness}"] = _success(_eval_file(out, arm, name, harness))
            row["grpo_part"] = _paired(_eval_file(out, arm, "sft", "heldout"), _eval_file(out, arm, "final", "heldout"))
            arms[kind] = row
        per_seed[seed] = arms
        compare[seed] = {f"{name}/{harness}": _paired(_eval_file(out, f"one-s{seed}", name, harness),
                                                      _eval_file(out, f"multi-s{seed}", name, harness))
                         for name, harness in COLUMNS}
    pooled = {}
    for name, harness in COLUMNS:
        got = [c[f"{name}/{harness}"] for c in compare.values() if c[f"{name}/{harness}"]]
        if len(got) == len(bench.seeds):
            pooled[f"{name}/{harness}"] = {
                "passed_change": sum(g["passed_change"] for g in got) / len(got),
                "passed_change_se": math.sqrt(sum(g["passed_change_se"] ** 2 for g in got)) / len(got),
                "seeds": len(got)}
    return {"heldout_arm": bench.heldout_arm, "trained_arms": trained_arms(data, overrides),
            "per_seed": per_seed, "multi_minus_one": compare, "multi_minus_one_over_seeds": pooled}


def _pm(c: dict | None) -> str:
    if not c:
        return "—"
    mean, se = c["passed_change"], c["passed_change_se"]
    return f"{mean:+.3f} ± {se:.3f}" + (" **≥ 2 SE**" if se > 0 and abs(mean) >= 2 * se else "")


def _cell(v: dict | None) -> str:
    return "—" if v is None else f"{v['success']:.3f} ({v['tasks']})"


def table(res: dict) -> str:
    h = res["heldout_arm"]
    names = {"sft/heldout": f"{h} after SFT", "final/heldout": f"{h} final", "final/mini-swe-agent":
             "mini-swe-agent final"}
    lines = [f"| seed | arm | trained arms, in-run | {' | '.join(names.values())} | GRPO's part on {h} (final − SFT) |",
             "|---|---|---|---|---|---|---|"]
    for seed, arms in res["per_seed"].items():
        for kind, row in arms.items():
            trained = ", ".join(f"{a} {v:.2f}" for a, v in row.get("trained_arms", {}).items()) or row["state"]
            lines.append(f"| {seed} | {kind} | {trained} | " + " | ".join(_cell(row[k]) for k in names)
                         + f" | {_pm(row['grpo_part'])} |")
    lines += ["", "Paired, multi − one (same tasks and seeded attempts; ± one standard error):", "",
              "| held-out | " + " | ".join(f"seed {s}" for s in res["per_seed"]) + " | over the seeds |",
              "|---|" + "---|" * (len(res["per_seed"]) + 1)]
    for k, name in names.items():
        per = [_pm(c[k]) for c in res["multi_minus_one"].values()]
        lines.append(f"| {name} | " + " | ".join(per) + f" | {_pm(res['multi_minus_one_over_seeds'].get(k))} |")
    trained = ", ".join(res["trained_arms"])
    return "\n".join(lines) + f"\n\nHeld-out success (passed share, tasks). Trained arms: {trained}.\n"


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [f"{n}/{h}" for n, h in COLUMNS]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for i, (kind, colour) in enumerate((("one", "#4c72b0"), ("multi", "#dd8452"))):
        for j, k in enumerate(keys):
            vals = [arms[kind][k]["success"] for arms in res["per_seed"].values() if arms[kind][k]]
            if not vals:
                continue
            x = j + (i - 0.5) * 0.35
            ax.bar(x, sum(vals) / len(vals), width=0.35, color=colour, label=kind if j == 0 else None)
            ax.scatter([x] * len(vals), vals, color="black", s=8, zorder=3)
    h = res["heldout_arm"]
    ax.set_xticks(range(len(keys)), [f"{h}\nafter SFT", f"{h}\nfinal", "mini-swe-agent\nfinal"])
    ax.set_ylabel("held-out success")
    ax.set_ylim(0, 1)
    ax.legend(frameon=False, fontsize=8, title="trained arms", title_fontsize=8)
    ax.set_title("Harness never trained on: three arms vs one (bars: mean over seeds; dots: seeds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(out: Path, bench: Bench, data: dict, overrides: list[str]) -> dict:
    res = results(out, bench, data, overrides)
    (out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / "results.md").write_text(table(res))
    plot(res, out / "harness_transfer.png")
    return res


# ---- the driver -----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    args = restartable.parser(__doc__, DEFAULT_CONFIG, "multi-sS and one-sS of every seed").parse_args(argv)
    if args.child:
        child(args.child, args)
        return 0
    args.config = restartable.recorded_config(args.out, args.config)
    data, bench, overrides = split(restartable.read_config(args.config), args.overrides)
    trained_arms(data, overrides)
    arms = restartable.chosen_arms(args.arms, arm_names(bench))
    rc = restartable.drive(args.out, arms, state=lambda a: arm_state(args.out, a),
                           launch=restartable.launch_child(Path(__file__), args),
                           write=lambda: write(args.out, bench, data, overrides))
    if rc:
        return rc
    res = write(args.out, bench, data, overrides)
    print(table(res))
    print(f"wrote {args.out / 'results.json'}, {args.out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
