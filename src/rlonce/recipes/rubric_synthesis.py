"""GRS offline: rubric synthesis from rollouts (``rlonce grade synthesize-rubrics --pack DIR``).

Seed 001 (GRS): several rollouts per task the agent already passes often are given, with the task
statement and the repository, to a rubric-writing agent, which writes the solution rubric (the
change itself) and the behaviour rubric (how the agent worked) that passing attempts are later
scored against. Only tasks at or above a pass rate get rubrics: rubrics learned from a task no
attempt solves would describe failures.

The rollouts are real (``rlonce.recipes.task_audit.run_attempt``: the pack's domain's environment
in a sandbox, graded by its grader) by the domain's scripted agents (``PackAudit.rollout_agents``;
the code domain's: the expert under K-1 seeds and one flawed attempt, an early exit appended to
the package), so the writer sees passing attempts that differ in how they worked and one that
does not pass. The writer is a judge asked the ``rubrics`` question; the rubrics are stored per
task in ``DIR/rubrics.json`` (merged with what is there) and read back by
``rlonce.grading.rubrics.load_rubrics`` for the training grader.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from rlonce.envs.base import JudgeBinding
from rlonce.envs.pack_audit import PackAudit
from rlonce.grading.rubrics import RUBRICS_FILE
from rlonce.grading.verdicts import Rubrics, rubrics_prompt
from rlonce.recipes import task_audit


async def rubric_task(tools: PackAudit, task, judge: JudgeBinding, sem: asyncio.Semaphore, *, rollouts: int,
                      min_pass_rate: float) -> dict:
    """One task's rollouts and, when their pass rate reaches ``min_pass_rate``, its rubrics."""
    attempts = [a for a in await task_audit.run_attempts(tools, task, tools.rollout_agents(rollouts), sem)
                if not a.infra]
    rate = sum(a.passed for a in attempts) / len(attempts) if attempts else 0.0
    entry: dict = {"pass_rate": rate, "graded": len(attempts), "eligible": bool(attempts) and rate >= min_pass_rate,
                   "outcome": "ok", "rubrics": None}
    if not entry["eligible"]:
        return entry
    statement = tools.brief(task).statement
    prompt = rubrics_prompt(statement, tools.repository(task), [(a.index, a.outcome, a.body()) for a in attempts])
    v = await judge.ask(prompt, Rubrics, kind="rubrics", task=task,
                        files=task_audit.attempt_files(statement, attempts))
    if getattr(v, "structured", None) is not None:  # an endpoint judge's: asked for the schema, or refused it
        entry["structured"] = v.structured  # type: ignore[attr-defined]
    if not v.ok:
        return {**entry, "outcome": v.outcome}
    return {**entry, "rubrics": v.value.model_dump()}  # type: ignore[union-attr]


def synthesize_rubrics(pack: Path, judge: JudgeBinding, *, limit: int | None = None, rollouts: int = 4,
                       min_pass_rate: float = 0.5, concurrency: int = 2, progress: bool = True) -> dict:
    """Rubrics for the validated tasks of ``pack`` (the first ``limit``) that pass often enough,
    merged into ``rubrics.json``. The summary of this run."""
    pack = Path(pack)
    tools, tasks = task_audit.pack_tasks(pack, limit)

    async def job(t, sem: asyncio.Semaphore) -> dict:
        return await rubric_task(tools, t, judge, sem, rollouts=rollouts, min_pass_rate=min_pass_rate)

    entries = task_audit.run_tasks(tasks, job, concurrency=concurrency, progress=progress, desc="rubrics")
    written = {i: e["rubrics"] for i, e in entries.items() if e["rubrics"] is not None}
    if written:
        task_audit.write_json(pack / RUBRICS_FILE, {**task_audit.read_json(pack / RUBRICS_FILE), **written})
    eligible = {i: e for i, e in entries.items() if e["eligible"]}
    return {"pack": str(pack), "judge": judge.model, "tasks": len(entries), "rollouts": rollouts,
            "min_pass_rate": min_pass_rate, "eligible": len(eligible), "written": len(written),
            "failures": task_audit.failures(eligible), "unstructured": task_audit.unstructured(eligible),
            "pass_rates": {i: e["pass_rate"] for i, e in entries.items()},
            "graded": {i: e["graded"] for i, e in entries.items()}}


def format_rubrics(report: dict) -> str:
    fails = ", ".join(f"{k} {v}" for k, v in report["failures"].items()) or "none"
    return (f"rubrics: {report['tasks']} tasks, {report['rollouts']} rollouts each; {report['eligible']} eligible "
            f"(pass rate >= {report['min_pass_rate']:g}); {report['written']} written to "
            f"{Path(report['pack']) / RUBRICS_FILE}; judge failures: {fails}; asked without structure "
            f"(refused): {report.get('unstructured', 0)}")
