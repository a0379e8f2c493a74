"""Difficulty filtering by measured pass rate (MiniMax-M1 §4.1): ``rlonce tasks filter``.

Every task of the domain's train stream ``0 … n-1`` is sampled ``k`` times under the current
model, at the configured sampling settings, through the same harness and grader as training.
A task is kept when its pass rate is strictly between 0 (no signal: every sibling fails) and
``max_pass`` (0.9: almost always solved, little to learn). Infrastructure failures are not
attempts; a task with no scored attempt is neither kept nor counted as hard.

Writes ``filter.jsonl`` (one line per task: id, index, dataset, successes, attempts, pass rate,
kept) and ``filter.json`` (the settings, the domain's options the tasks were drawn with as
``task_options``, the kept train indices, a pass-rate histogram). A domain whose options have a
``pack`` reads the folder back (``rlonce.envs.packs.read_pack``) to draw only the kept tasks, and
checks them against ``task_options``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from rlonce.config import ConfigError, RunConfig
from rlonce.rollout.runner import collect
from rlonce.telemetry.metrics import JsonlWriter

FILTER_SEED = 4242


def pass_rates(counts: list[tuple[int, int]], max_pass: float) -> tuple[list[float | None], list[int]]:
    """Per task (successes, scored attempts) → pass rates (None: nothing scored) and the kept
    positions, those with 0 < rate < ``max_pass``."""
    rates = [wins / n if n else None for wins, n in counts]
    return rates, [i for i, r in enumerate(rates) if r is not None and 0 < r < max_pass]


def filter_tasks(cfg: RunConfig, model: str, n: int, k: int, out: Path, *, max_pass: float = 0.9,
                 progress: bool = True) -> dict:
    from rlonce.recipes.grpo import Job

    if n < 1 or k < 1:
        raise ValueError("--tasks and --k must be at least 1")
    if not 0 < max_pass <= 1:
        raise ValueError("--max-pass must be in (0, 1]")
    if cfg.sources:
        raise ConfigError("rlonce tasks filter works on one domain: give it a [task] config, not [[sources]] "
                          "(filter each source's tasks separately and set its pack)")
    options = cfg.task.domain_options()
    if "pack" in type(options).model_fields:  # every train task is measured, not an earlier pack's
        cfg = cfg.model_copy(update={"task": cfg.task.model_copy(update={"pack": None})})
    job = Job.for_model(cfg, model, progress=progress)
    job.threads("rollout")
    try:
        (src,) = job.sources.values()
        tasks = [src.domain.task("train", i) for i in range(n)]
        samples = asyncio.run(collect(tasks, k, src.domain.env_factory, job.engine, src.spec, seed=FILTER_SEED,
                                      concurrency=cfg.eval.concurrency, desc="filter", progress=progress))
    finally:
        job.close()
    out.mkdir(parents=True, exist_ok=True)
    counts = [(sum(s.passed for s in x.sequences if not s.infra_failed),
               sum(not s.infra_failed for s in x.sequences)) for x in samples]
    rates, kept = pass_rates(counts, max_pass)
    w = JsonlWriter(out / "filter.jsonl")
    for i, (task, (wins, attempts), rate) in enumerate(zip(tasks, counts, rates)):
        w.write({"task_id": task.task_id, "index": i, "dataset": getattr(task, "dataset", task.source),
                 "successes": wins, "attempts": attempts, "pass_rate": rate, "kept": i in kept})
    w.close()
    hist = [0] * 11
    for r in rates:
        if r is not None:
            hist[min(10, int(r * 10))] += 1
    unscored = rates.count(None)
    report = {"model": model, "tasks": n, "k": k, "max_pass": max_pass, "task": cfg.task.name,
              "task_options": options.model_dump(mode="json", exclude={"pack"}),
              "temperature": src.plan.temperature, "max_tokens_per_turn": src.plan.max_tokens_per_turn,
              "kept_count": len(kept), "unscored": unscored,
              "pass_rate_histogram": {f"{b / 10:.1f}": c for b, c in enumerate(hist)}, "kept": kept}
    (out / "filter.json").write_text(json.dumps(report, indent=1) + "\n")
    return report
