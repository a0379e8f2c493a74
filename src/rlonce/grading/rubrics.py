"""GRS offline: rubric synthesis from rollouts (``rlonce grade synthesize-rubrics --pack DIR``).

Seed 001 (GRS): several rollouts per task the agent already passes often are given, with the task
statement and the repository, to a rubric-writing agent, which writes the solution rubric (the
change itself) and the behaviour rubric (how the agent worked) that passing attempts are later
scored against. Only tasks at or above a pass rate get rubrics: rubrics learned from a task no
attempt solves would describe failures.

The rollouts are real (``rlonce.grading.audit.run_attempt``: a sandboxed ``CodeEnv``, grading in
a fresh sandbox) by scripted agents: the expert under K-1 seeds and one flawed attempt (appending
an early exit to the package), so the writer sees passing attempts that differ in how they worked
and one that does not pass. The writer is a judge asked the ``rubrics`` question; the rubrics are
stored per task in ``DIR/rubrics.json`` (merged with what is there) and read back by
``load_rubrics`` for the training grader.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic import ValidationError

from rlonce.envs.code.expert import buggy_text
from rlonce.envs.code.routes import ROUTES
from rlonce.envs.code.tasks import CodeTask
from rlonce.errors import PackError
from rlonce.grading import audit
from rlonce.grading.audit import Agent, expert_agent, run_attempts
from rlonce.grading.judge import Judge
from rlonce.grading.verdicts import Rubrics, rubrics_prompt

RUBRICS_FILE = "rubrics.json"
LISTING_FILES = 80
"""Repository files listed for the rubric writer."""
WINDOW_LINES = 40
"""Lines of the buggy file shown on each side of the bug."""
FLAWED: Agent = ("exit_early_status_0", ROUTES["exit_early_status_0"])


def rollout_agents(k: int) -> list[Agent]:
    """The ``k`` rollouts of a task: the expert under seeds 0..k-2, then one flawed attempt."""
    return [expert_agent(0)] if k == 1 else [*(expert_agent(i) for i in range(k - 1)), FLAWED]


def repository_text(task: CodeTask) -> str:
    """The repository as the rubric writer reads it: its files, then the buggy file around the bug."""
    tree, m = task.tree(), task.mut
    files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file())
    files = [f for f in files if f not in task.hidden_files and "__pycache__" not in f]
    more = f"\n[... {len(files) - LISTING_FILES} more files]" if len(files) > LISTING_FILES else ""
    lines = buggy_text(task).splitlines()
    lo, hi = max(0, m.line - 1 - WINDOW_LINES), m.line + WINDOW_LINES
    window = "\n".join(f"{n:5} {ln}" for n, ln in enumerate(lines[lo:hi], lo + 1))
    return (f"### {m.path} (lines {lo + 1}-{min(hi, len(lines))} of {len(lines)})\n{window}\n\n"
            f"### Files\n" + "\n".join(files[:LISTING_FILES]) + more)


async def rubric_task(task: CodeTask, judge: Judge, sem: asyncio.Semaphore, *, rollouts: int,
                      min_pass_rate: float) -> dict:
    """One task's rollouts and, when their pass rate reaches ``min_pass_rate``, its rubrics."""
    attempts = [a for a in await run_attempts(task, rollout_agents(rollouts), sem) if not a.infra]
    rate = sum(a.passed for a in attempts) / len(attempts) if attempts else 0.0
    entry: dict = {"pass_rate": rate, "graded": len(attempts), "eligible": bool(attempts) and rate >= min_pass_rate,
                   "outcome": "ok", "rubrics": None}
    if not entry["eligible"]:
        return entry
    prompt = rubrics_prompt(task.problem, repository_text(task), [(a.index, a.outcome, a.body()) for a in attempts])
    v = await judge.ask(prompt, Rubrics, kind="rubrics", task=task, files=audit.attempt_files(task, attempts))
    if not v.ok:
        return {**entry, "outcome": v.outcome}
    return {**entry, "rubrics": v.value.model_dump()}  # type: ignore[union-attr]


def synthesize_rubrics(pack: Path, judge: Judge, *, limit: int | None = None, rollouts: int = 4,
                       min_pass_rate: float = 0.5, concurrency: int = 2, progress: bool = True) -> dict:
    """Rubrics for the validated tasks of ``pack`` (the first ``limit``) that pass often enough,
    merged into ``rubrics.json``. The summary of this run."""
    pack = Path(pack)
    tasks = audit.pack_tasks(pack, limit)

    async def job(t: CodeTask, sem: asyncio.Semaphore) -> dict:
        return await rubric_task(t, judge, sem, rollouts=rollouts, min_pass_rate=min_pass_rate)

    entries = audit.run_tasks(tasks, job, concurrency=concurrency, progress=progress, desc="rubrics")
    written = {i: e["rubrics"] for i, e in entries.items() if e["rubrics"] is not None}
    if written:
        audit.write_json(pack / RUBRICS_FILE, {**audit.read_json(pack / RUBRICS_FILE), **written})
    eligible = {i: e for i, e in entries.items() if e["eligible"]}
    return {"pack": str(pack), "judge": judge.model, "tasks": len(entries), "rollouts": rollouts,
            "min_pass_rate": min_pass_rate, "eligible": len(eligible), "written": len(written),
            "failures": audit.failures(eligible), "pass_rates": {i: e["pass_rate"] for i, e in entries.items()}}


def load_rubrics(pack: str | Path) -> dict[str, Rubrics]:
    """The stored rubrics of ``pack``, task id → ``Rubrics``; {} when none were written."""
    path = Path(pack) / RUBRICS_FILE
    out = {}
    for tid, obj in audit.read_json(path).items():
        try:
            out[tid] = Rubrics.model_validate(obj)
        except ValidationError as e:
            raise PackError(f"{path}: the rubrics of {tid} are not a Rubrics object ({str(e).splitlines()[0]}); "
                            "rerun `rlonce grade synthesize-rubrics`") from None
    return out


def format_rubrics(report: dict) -> str:
    fails = ", ".join(f"{k} {v}" for k, v in report["failures"].items()) or "none"
    return (f"rubrics: {report['tasks']} tasks, {report['rollouts']} rollouts each; {report['eligible']} eligible "
            f"(pass rate >= {report['min_pass_rate']:g}); {report['written']} written to "
            f"{Path(report['pack']) / RUBRICS_FILE}; judge failures: {fails}")
