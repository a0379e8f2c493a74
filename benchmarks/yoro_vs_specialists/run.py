"""You Only RL Once against specialists (issue 58): one mixed RL stage over every source of a
config, against one specialist RL stage per source, against SFT alone, at equal RL samples.

    python benchmarks/yoro_vs_specialists/run.py --out DIR [--config CONFIG.toml] [--arms mixed,spec-arith]
                                                 [--accept-changes] [KEY=VALUE ...]

The arms (each a ``rlonce train`` job, run in a child process of its own):

* ``mixed`` — the config as it is: SFT on every source's demonstrations, a baseline evaluation,
  then ``rl.steps`` steps of ``rl.tasks_per_step`` groups mixed by the sources' shares, and the
  final evaluation. Its checkpoints are all kept; ``checkpoints/step-0000`` is the SFT model.
* ``sft`` — SFT alone: the mixed run's baseline evaluation (the SFT model, before any RL step).
  It costs nothing beyond the mixed run's first phase.
* ``spec-<label>`` — one source alone, from the mixed run's SFT checkpoint (no SFT of its own), for
  the same ``rl.steps`` steps with the source's part of ``rl.tasks_per_step`` (``tasks_per_step ×
  share / Σ shares``, at least 1): the specialists' RL samples add up to the mixed stage's.

Every held-out comparison is paired on the same tasks and attempts (``rlonce.recipes.evaluate.
paired_change``): mixed − SFT and specialist − SFT against the mixed run's baseline, mixed −
specialist between the two final evaluations, each with the standard error of the mean paired
difference. The specialist's own baseline is the same SFT model evaluated again on its source's
tasks; it is kept beside the mixed run's as a check that the two evaluations agree.

Restartable across sessions: the config is copied to ``DIR/config.toml`` on the first run, and
every arm and every later run reads that copy (another config for the same ``DIR`` is refused).
An arm whose ``summary.json`` exists is done and never run again; an arm with a checkpoint
resumes from it (``--accept-changes`` when the code changed since it started: recorded in the
arm's ``provenance.json``); the others start. ``DIR/arms.json`` records each arm's sessions and
wall time. Whatever has finished is written out after every arm: ``results.json``, ``results.md``
(the table) and ``yoro_vs_specialists.png``.

``KEY=VALUE`` overrides apply to every arm (``model.name=embedded rl.steps=2`` for a smoke run).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from rlonce.telemetry import restartable

HERE = Path(__file__).resolve().parent
DEFAULT_CONFIG = HERE / "smollm2.toml"


# ---- the plan: which arms, and each arm's config ---------------------------------------------
def labels(data: dict) -> list[str]:
    """The config's source labels, in order (a source's label defaults to its domain's name)."""
    from rlonce.config.load import validate

    sources = validate(data).sources
    if len(sources) < 2:
        raise SystemExit(f"error: a YORO comparison needs a config with two or more [[sources]]; it has {len(sources)}")
    return [s.source_label for s in sources]


def specialist_tasks(data: dict, overrides: list[str]) -> dict[str, int]:
    """Each source's groups a step when it trains alone: its part of the mixed stage's
    ``rl.tasks_per_step`` by share (at least 1), from the config as the overrides leave it."""
    from rlonce.config.load import validate

    cfg = validate(data, overrides)
    total = cfg.rl.tasks_per_step
    shares = {s.source_label: s.share for s in cfg.sources}
    whole = sum(shares.values())
    return {k: max(1, round(total * v / whole)) for k, v in shares.items()}


def arm_names(data: dict) -> list[str]:
    return ["mixed", *(f"spec-{k}" for k in labels(data))]


def arm_config(arm: str, data: dict, overrides: list[str], out: Path):
    """The run config of one arm (``mixed`` or ``spec-<label>``)."""
    from rlonce.config.load import validate

    run_dir = out / arm
    if arm == "mixed":
        return validate(data, [*overrides, f"out={run_dir}", "checkpoint.keep=0"])
    label = arm.removeprefix("spec-")
    one = {k: v for k, v in data.items() if k != "sources"}
    source = data["sources"][labels(data).index(label)]
    # the SFT model is the mixed run's: a specialist trains no demonstrations of its own
    one["sources"] = [{k: v for k, v in source.items() if k not in ("sft_demos", "sft_epochs")}]
    tasks = specialist_tasks(data, overrides)[label]
    return validate(one, [*overrides, f"out={run_dir}", f"model.name={sft_checkpoint(out)}", "sft.demos=0",
                          f"rl.tasks_per_step={tasks}", "checkpoint.keep=1"])


def sft_checkpoint(out: Path) -> Path:
    return out / "mixed" / "checkpoints" / "step-0000"


def waits_for(out: Path, arm: str) -> str | None:
    """What a specialist waits for before it can start: the mixed run's SFT model."""
    if arm.startswith("spec-") and not (sft_checkpoint(out) / "model.safetensors").is_file():
        return f"the mixed run's SFT checkpoint ({sft_checkpoint(out)}); run arm mixed first"
    return None


def arm_state(out: Path, arm: str) -> str:
    return restartable.run_state(out / arm)


# ---- one arm, in its own process ------------------------------------------------------------
def child(arm: str, args) -> None:
    """Runs one arm to its end (resuming it when it has a checkpoint)."""
    from rlonce.recipes.grpo import run

    data = restartable.read_config(args.config)
    cfg = arm_config(arm, data, args.overrides, args.out)
    run(cfg, resume=arm_state(args.out, arm) == "resumable", progress=not args.quiet,
        accept_changes=args.accept_changes)


# ---- results --------------------------------------------------------------------------------
def _summary(out: Path, arm: str) -> dict | None:
    p = out / arm / "summary.json"
    return json.loads(p.read_text()) if p.is_file() else None


def _change(before: Path, after: Path, label: str) -> dict | None:
    from rlonce.recipes.evaluate import paired_change

    return paired_change(before, after, source=label)


def results(out: Path, data: dict, overrides: list[str]) -> dict:
    """Everything finished so far, per source: SFT, mixed and specialist held-out success (and
    mean reward) with the paired changes; the RL sequences each arm trained."""
    mixed = _summary(out, "mixed")
    base = out / "mixed" / "eval" / "baseline.jsonl"
    tasks = specialist_tasks(data, overrides)
    rows = {}
    for label in labels(data):
        row: dict = {"specialist_tasks_per_step": tasks[label]}
        if base.is_file() and (sft := _rows(base, label)):
            row["sft"] = _score(sft)
        if mixed is not None:
            src = mixed["sources"][label]
            row["mixed"] = {"success": src["final_success"], "reward": src["final_reward"],
                            "tasks": src["heldout_tasks"], "sequences_retained": src.get("sequences_retained"),
                            "sequences_dispatched": src.get("sequences_dispatched")}
            row["mixed_minus_sft"] = src["heldout_change"]
        spec = _summary(out, f"spec-{label}")
        if spec is not None:
            src = spec["sources"][label]
            row["specialist"] = {"success": src["final_success"], "reward": src["final_reward"],
                                 "tasks": src["heldout_tasks"], "sequences_retained": src.get("sequences_retained"),
                                 "sequences_dispatched": src.get("sequences_dispatched"),
                                 "own_baseline_success": src["baseline_success"]}
            row["specialist_minus_sft"] = _change(base, out / f"spec-{label}" / "eval" / "final.jsonl", label)
            if mixed is not None:
                row["mixed_minus_specialist"] = _change(out / f"spec-{label}" / "eval" / "final.jsonl",
                                                        out / "mixed" / "eval" / "final.jsonl", label)
        rows[label] = row
    return {"sources": rows, "arms": {a: arm_state(out, a) for a in arm_names(data)},
            "mixed_wall_seconds": mixed and mixed["wall_seconds"],
            "specialists_wall_seconds": sum(s["wall_seconds"] for a in arm_names(data)[1:]
                                            if (s := _summary(out, a)) is not None)}


def _rows(path: Path, label: str) -> list[dict]:
    return [r for line in path.read_text().splitlines() if (r := json.loads(line)).get("source") == label
            and not r["infra_failed"]]


def _score(rows: list[dict]) -> dict:
    n = len(rows)
    success = sum(r["passed"] for r in rows) / n
    return {"success": success, "reward": sum(r["reward"] or 0.0 for r in rows) / n, "tasks": n,
            "success_se": math.sqrt(success * (1 - success) / n)}


def _pm(change: dict | None, key: str = "passed") -> str:
    if not change:
        return "—"
    mean, se = change[f"{key}_change"], change[f"{key}_change_se"]
    mark = " **≥ 2 SE**" if se > 0 and abs(mean) >= 2 * se else ""
    return f"{mean:+.3f} ± {se:.3f}{mark}"


def _trained(arm: dict) -> str:
    n = arm.get("sequences_retained")
    return "—" if n is None else "**0: trained nothing**" if n == 0 else str(n)


def _val(row: dict, arm: str) -> str:
    return f"{row[arm]['success']:.3f}" if arm in row else "—"


def table(res: dict) -> str:
    lines = ["| source | held-out tasks | SFT only | mixed (YORO) | specialist | mixed − SFT | specialist − SFT | "
             "mixed − specialist | sequences trained: mixed / specialist |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, row in res["sources"].items():
        n = row.get("sft", {}).get("tasks", "—")
        trained = " / ".join(_trained(row[a]) if a in row else "—" for a in ("mixed", "specialist"))
        lines.append(f"| {label} | {n} | {_val(row, 'sft')} | {_val(row, 'mixed')} | {_val(row, 'specialist')} | "
                     f"{_pm(row.get('mixed_minus_sft'))} | {_pm(row.get('specialist_minus_sft'))} | "
                     f"{_pm(row.get('mixed_minus_specialist'))} | {trained} |")
    states = ", ".join(f"{a}: {s}" for a, s in res["arms"].items())
    return "\n".join(lines) + f"\n\nHeld-out success (passed share). Arms: {states}.\n"


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res["sources"])
    fig, ax = plt.subplots(figsize=(1.6 * len(names) + 2, 3.6))
    for i, (arm, colour) in enumerate((("sft", "#999999"), ("specialist", "#4c72b0"), ("mixed", "#dd8452"))):
        xs = [j + (i - 1) * 0.27 for j in range(len(names))]
        vals = [res["sources"][k].get(arm, {}).get("success", float("nan")) for k in names]
        ses = [math.sqrt(v * (1 - v) / res["sources"][k][arm]["tasks"]) if arm in res["sources"][k] else 0.0
               for k, v in zip(names, vals)]
        ax.bar(xs, vals, width=0.27, yerr=ses, color=colour, label={"sft": "SFT only", "specialist": "specialist",
                                                                     "mixed": "mixed (YORO)"}[arm], capsize=2)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("held-out success")
    ax.set_ylim(0, 1)
    ax.legend(frameon=False, fontsize=8)
    ax.set_title("One mixed RL stage vs a specialist per source (bars: binomial SE)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(out: Path, data: dict, overrides: list[str]) -> dict:
    res = results(out, data, overrides)
    (out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / "results.md").write_text(table(res))
    if any("sft" in r for r in res["sources"].values()):
        plot(res, out / "yoro_vs_specialists.png")
    return res


# ---- the driver -----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    args = restartable.parser(__doc__, DEFAULT_CONFIG, "mixed, then every spec-<label>").parse_args(argv)
    if args.child:
        child(args.child, args)
        return 0
    args.config = restartable.recorded_config(args.out, args.config)
    data = restartable.read_config(args.config)
    arms = restartable.chosen_arms(args.arms, arm_names(data))
    rc = restartable.drive(args.out, arms, state=lambda a: arm_state(args.out, a),
                           launch=restartable.launch_child(Path(__file__), args),
                           write=lambda: write(args.out, data, args.overrides), waits=lambda a: waits_for(args.out, a))
    if rc:
        return rc
    res = write(args.out, data, args.overrides)
    print(table(res))
    print(f"wrote {args.out / 'results.json'}, {args.out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
