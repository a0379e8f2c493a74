"""``rlonce tasks validate`` for a cyber pack: the oracle must tell the bug from everything else.

A task is validated when its reference PoC earns the oracle's match on every one of ``reruns``
runs (8, the code domain's stability gate), an empty input does not, and no other bug's
reference PoC of the same target does (the specific vulnerability, not any crash). The report,
``validation.json``, lists the validated ids and each dropped task with its reason.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tqdm.auto import tqdm

from rlonce.envs.cyber.oracle import Run, run_input
from rlonce.envs.cyber.tasks import CyberTask, bug_manifest, load_pack


def matches(task: CyberTask, run: Run) -> bool:
    """The oracle's verdict: the report's type is the task's, and its topmost project frame is
    in the task's function."""
    rep = run.report
    if rep is None or rep.kind != task.kind:
        return False
    top = rep.top_frame({task.file})
    return top is not None and top.function == task.function


async def _check(task: CyberTask, others: list[bytes], reruns: int) -> str | None:
    poc = task.reference_poc()
    for i in range(reruns):
        if not matches(task, await run_input(task.binary, poc)):
            return f"the reference PoC missed on run {i + 1} of {reruns}"
    if matches(task, await run_input(task.binary, b"")):
        return "an empty input matches"
    for j, other in enumerate(others):
        if matches(task, await run_input(task.binary, other)):
            return f"another bug's reference PoC (#{j}) matches too"
    return None


def validate_pack(pack: Path, *, reruns: int = 8, progress: bool = True) -> dict:
    pack = Path(pack)
    tasks = load_pack(pack)
    bar = tqdm(total=len(tasks), desc="validating", unit="task", disable=not progress, leave=False)

    async def all_() -> list[str | None]:
        sem = asyncio.Semaphore(2)

        async def one(t: CyberTask) -> str | None:
            others = [bytes.fromhex(b["poc_hex"]) for i, b in bug_manifest(pack, t.target).items() if i != t.bug_id]
            async with sem:
                why = await _check(t, others, reruns)
            bar.update(1)
            return why

        return await asyncio.gather(*(one(t) for t in tasks))

    reasons = asyncio.run(all_())
    bar.close()
    report = {"domain": "cyber", "tasks": len(tasks), "reruns": reruns,
              "validated_ids": [t.task_id for t, why in zip(tasks, reasons) if why is None],
              "dropped": {t.task_id: why for t, why in zip(tasks, reasons) if why is not None}}
    report["validated"] = len(report["validated_ids"])
    report["types"] = sorted({t.kind for t, why in zip(tasks, reasons) if why is None})
    report["targets"] = sorted({t.target for t, why in zip(tasks, reasons) if why is None})
    (pack / "validation.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def validate_command(pack: Path, *, reruns: int = 8, progress: bool = True) -> tuple[dict, str]:
    """``rlonce tasks validate`` on a cyber pack (``PackTools.validate``): the report without the
    validated ids, and its summary line."""
    r = validate_pack(pack, reruns=reruns, progress=progress)
    text = (f"{r['validated']} of {r['tasks']} tasks validated over {len(r['targets'])} targets and "
            f"{len(r['types'])} vulnerability types ({', '.join(r['types'])}); dropped: "
            f"{r['dropped'] or 'none'}; report in {Path(pack) / 'validation.json'}")
    return {k: v for k, v in r.items() if k != "validated_ids"}, text


def validated_tasks(pack: Path) -> list[CyberTask]:
    tasks = load_pack(pack)
    f = Path(pack) / "validation.json"
    if not f.is_file():
        return tasks
    keep = set(json.loads(f.read_text())["validated_ids"])
    return [t for t in tasks if t.task_id in keep]
