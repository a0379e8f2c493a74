"""``rlonce tasks validate``: the quality gates a task must pass before it is trained on.

Seed 001 ("The environment can accidentally hand out the answer"): F2P tests fail before the
reference fix and pass after it; P2P tests pass in both states; every outcome is the same in
each of ``reruns`` (8) runs, which screens out flaky tests and environment noise. A task that
fails a gate is dropped with its reason; the report is written to ``validation.json`` in the
pack and lists the validated task ids, each one's grading timeout (``grade_timeout``) and the
train / held-out split (``split_tasks``) that training on the pack uses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter
from pathlib import Path

from tqdm.auto import tqdm

from rlonce.envs.code.packages import testbed
from rlonce.envs.code.tasks import CodeTask, load_pack, materialize
from rlonce.envs.code.testbed import guards_for, make_sandbox, run_reports
from rlonce.envs.packs import HELDOUT_FRACTION, split_tasks

GATES = ("testbed_error", "unstable", "f2p_passes_before", "p2p_fails_before", "f2p_fails_after", "p2p_fails_after")


def _gate(task: CodeTask, before: list[dict] | None, after: list[dict] | None) -> str | None:
    if before is None or after is None:
        return "testbed_error"
    ids = [*task.f2p, *task.p2p]
    for runs in (before, after):
        seen = [tuple(r.get(i, {}).get("outcome", "missing") for i in ids) for r in runs]
        if len(set(seen)) > 1:
            return "unstable"

    def outcome(runs, i):
        return runs[0].get(i, {}).get("outcome", "missing")

    if any(outcome(before, i) == "passed" for i in task.f2p):
        return "f2p_passes_before"
    if any(outcome(before, i) != "passed" for i in task.p2p):
        return "p2p_fails_before"
    if any(outcome(after, i) != "passed" for i in task.f2p):
        return "f2p_fails_after"
    if any(outcome(after, i) != "passed" for i in task.p2p):
        return "p2p_fails_after"
    return None


GRADE_TIMEOUT_FLOOR = 10.0
GRADE_TIMEOUT_FACTOR = 10.0
"""A validated task's hidden tests get ``max(floor, factor × the slowest mean run)`` seconds at
grading (never more than the package's ``test_timeout``): code that hangs costs seconds, not a
minute, and a run ten times slower than validation saw is still on time. The grader treats a
timeout as infrastructure when the clean run itself took over half of it."""


async def check_task(task: CodeTask, tb: Path, *, reruns: int = 8) -> tuple[str | None, float]:
    """The first gate ``task`` fails (None when it passes them all), and the mean wall time of
    one run of its hidden tests in the slower state."""
    results, seconds = [], 0.0
    for fixed in (False, True):
        sbx = make_sandbox(task.spec, tb, timeout=task.timeout)
        try:
            materialize(task, sbx.workspace, fixed=fixed, hidden=True, git=False)
            reports = await run_reports(sbx, task.spec, sorted(task.hidden_files), reruns=reruns,
                                        timeout=task.timeout, guards=guards_for(task.tree(), task.spec))
        finally:
            sbx.close()
        ok = all(r is not None and not r.get("tampered") for r in reports)
        results.append([r["tests"] for r in reports] if ok else None)
        seconds = max([seconds, *(r["seconds"] for r in reports if r is not None)])
    return _gate(task, *results), seconds


def grade_timeout(task: CodeTask, seconds: float) -> float:
    return round(min(task.spec.test_timeout, max(GRADE_TIMEOUT_FLOOR, GRADE_TIMEOUT_FACTOR * seconds)), 1)


def validate_pack(pack: Path, *, reruns: int = 8, concurrency: int = 2, progress: bool = True,
                  heldout_fraction: float = HELDOUT_FRACTION) -> dict:
    pack = Path(pack)
    tasks = load_pack(pack)
    tb = testbed(pack / "cache")
    verdicts: dict[str, str | None] = {}
    seconds: dict[str, float] = {}
    bar = tqdm(total=len(tasks), desc="validate", unit="task", disable=not progress)

    async def main():
        sem = asyncio.Semaphore(concurrency)

        async def one(t: CodeTask):
            async with sem:
                verdicts[t.task_id], seconds[t.task_id] = await check_task(t, tb, reruns=reruns)
            bar.update(1)

        await asyncio.gather(*(one(t) for t in tasks))

    asyncio.run(main())
    bar.close()
    ok = [t for t in tasks if verdicts[t.task_id] is None]
    report = {
        "pack": str(pack),
        "tasks": len(tasks),
        "validated": len(ok),
        "dropped": dict(Counter(v for v in verdicts.values() if v is not None)),
        "packages": dict(Counter(t.package for t in ok)),
        "reruns": reruns,
        "validated_ids": [t.task_id for t in ok],
        "dropped_ids": {k: v for k, v in sorted(verdicts.items()) if v is not None},
        "timeouts": {t.task_id: grade_timeout(t, seconds[t.task_id]) for t in ok},
        "split": split_tasks([t.task_id for t in ok], heldout_fraction),
    }
    (pack / "validation.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def validate_command(pack: Path, *, reruns: int = 8, progress: bool = True) -> tuple[dict, str]:
    """``rlonce tasks validate`` on a code pack (``PackTools.validate``): the report without the
    validated ids, and its summary line."""
    r = validate_pack(pack, reruns=reruns, progress=progress)
    text = (f"{r['validated']} of {r['tasks']} tasks validated "
            f"({', '.join(f'{k} {v}' for k, v in sorted(r['packages'].items()))}); "
            f"dropped: {r['dropped'] or 'none'}; report in {Path(pack) / 'validation.json'}")
    return {k: v for k, v in r.items() if k != "validated_ids"}, text


def validated_tasks(pack: Path) -> list[CodeTask]:
    """The tasks of ``pack`` that passed validation (all of them if it was never validated)."""
    tasks = load_pack(pack)
    report = Path(pack) / "validation.json"
    if not report.is_file():
        return tasks
    rep = json.loads(report.read_text())
    keep, timeouts = set(rep["validated_ids"]), rep.get("timeouts", {})
    return [dataclasses.replace(t, timeout=timeouts.get(t.task_id, t.timeout)) for t in tasks if t.task_id in keep]
