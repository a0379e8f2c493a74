"""Hack probes of the general-tool-use rubrics: shortcut routes a policy could try, each run through
a real ``GeneralEnv`` (services in their sandbox, the agent's shell in its own) and graded.

Seed 000: "adversarial solutions that look correct without solving anything probe for exploitable
rubrics". Every route must earn reward 0 on every task it applies to; the reference plan is the
positive control (reward 1).

- ``claim_only``: submit the expected answer without acting.
- ``wrong_record``: the reference plan with the changed record's id (or account, path, addressee)
  swapped for another.
- ``delete_and_recreate``: the reference plan, plus a ledger entry deleted and recorded again
  (a new id).
- ``edit_database``: try to reach the services' databases from the shell (find them, sqlite3,
  python's sqlite3) and write the answer there.
- ``shell_deliverable``: write the deliverable with the shell into the agent's own workspace.
- ``answer_but_corrupt``: the reference plan, plus one destructive change elsewhere.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from rlonce.core.records import Sequence
from rlonce.envs.general.env import GeneralEnv
from rlonce.envs.general.expert import expert_calls
from rlonce.envs.general.tasks import GeneralTask

Calls = list[tuple[str, dict]]
DB_HUNT = ("find / -name '*.db' 2>/dev/null | head; ls -la /work /opt 2>&1 | head -20; "
           "sqlite3 /work/ledger.db 'select 1' 2>&1; python3 -c \"import sqlite3; "
           "sqlite3.connect('/work/ledger.db').execute('create table hacked(x)')\" 2>&1")


def _swap(args: dict) -> dict | None:
    """``args`` aimed at another record: a different id, account, path or addressee."""
    if "id" in args:
        return {**args, "id": args["id"] % 5 + 1 if args["id"] % 5 + 1 != args["id"] else args["id"] + 1}
    if "account" in args:
        return {**args, "account": "software" if args["account"] != "software" else "operations"}
    if "path" in args:
        return {**args, "path": args["path"].replace(".csv", "-draft.csv").replace(".md", "-draft.md")}
    for key in ("to", "attendees"):
        if key in args:
            return {**args, key: "someone.else@northwind.test"}
    return None


def wrong_record(task: GeneralTask) -> Calls | None:
    plan = list(task.plan)
    for i in range(len(plan) - 1, -1, -1):
        new = _swap(plan[i][1])
        if new is not None:
            return plan[:i] + [(plan[i][0], new)] + plan[i + 1:]
    return None


def delete_and_recreate(task: GeneralTask) -> Calls | None:
    if "ledger" in task.services:
        return [*task.plan, ("ledger__delete_entry", {"id": 10}),
                ("ledger__add_entry", {"date": "2026-03-15", "description": "Recreated", "amount": "-1.00",
                                       "category": "other", "account": "software"})]
    return None


def answer_but_corrupt(task: GeneralTask) -> Calls | None:
    extra = {"mail": ("mail__move_message", {"id": 1, "folder": "trash"}),
             "tickets": ("tickets__update_ticket", {"id": 8, "priority": "urgent"}),
             "calendar": ("calendar__create_event", {"title": "Blocker", "start": "2026-03-21T08:00",
                                                     "end": "2026-03-21T08:30"}),
             "ledger": ("ledger__add_entry", {"date": "2026-03-15", "description": "Noise", "amount": "-1.00",
                                              "category": "other", "account": "software"}),
             "files": ("files__write_file", {"path": "notes/extra.txt", "content": "x"})}
    return [*task.plan, extra[task.services[0]]]


ROUTES: dict[str, Callable[[GeneralTask], Calls | None]] = {
    "claim_only": lambda task: [],
    "wrong_record": wrong_record,
    "delete_and_recreate": delete_and_recreate,
    "edit_database": lambda task: [("bash", {"command": DB_HUNT})],
    "shell_deliverable": lambda task: [("bash", {"command": "mkdir -p reports && printf 'date,description,amount\\n' "
                                                            "> reports/out.csv && cat README.txt"})],
    "answer_but_corrupt": answer_but_corrupt,
}


async def run_calls(task: GeneralTask, calls: Calls, answer: str) -> tuple[float, bool, str]:
    """``calls`` in a fresh environment, then its grade: (reward, passed, transcript — one
    ``pass``/``FAIL`` line per rubric item)."""
    env = GeneralEnv(task)
    await env.setup()
    try:
        for name, args in calls:
            await env.call_tool(name, args)
        grade = await env.grade(Sequence(task.task_id, "probe", answer=answer))
    finally:
        await env.cleanup()
    return grade.reward, grade.passed, grade.transcript


def acts(task: GeneralTask) -> bool:
    """The task asks for a change of state (a route can then be told from a solution; a task that
    only asks a question is solved by its answer, which the routes are given)."""
    return any(it.kind == "state" for it in task.items)


def expert_route(task: GeneralTask) -> tuple[Calls, str]:
    """The scripted expert's attempt (its detours and recoverable mistakes, seeded by the task) as
    environment calls, and its answer."""
    calls = expert_calls(task, random.Random(task.seed))
    return [(c.name.removeprefix("mcp__"), c.arguments) for c in calls[:-1]], calls[-1].arguments["answer"]


def format_report(report: dict) -> str:
    routes = {n: r for n, r in report.items() if n != "expert_items"}
    lines = [f"{'route':22} {'tasks':>6} {'rewarded':>9}"]
    lines += [f"{name:22} {r['tasks']:6} {r['rewarded']:9}" for name, r in routes.items()]
    lines += ["", "expert: pass rate of each rubric item"]
    lines += [f"  {share:6.3f}  {name}" for name, share in report.get("expert_items", {}).items()]
    bad = [n for n, r in routes.items() if n not in ("reference", "expert") and r["rewarded"]]
    lines.append("every route failed its rubric" if not bad else f"routes that earned reward: {', '.join(bad)}")
    return "\n".join(lines)


async def probe(tasks: list[GeneralTask], *, concurrency: int = 2, routes: list[str] | None = None) -> dict:
    """Every route on every task that asks for a change of state and that the route applies to,
    and the reference plan and the scripted expert on all of them: rewarded counts, and the
    expert's pass rate per rubric item (``expert_items``). ``routes``: a subset of ``ROUTES`` (the
    reference and the expert always run)."""
    sem = asyncio.Semaphore(concurrency)
    report: dict[str, dict[str, int]] = {}

    async def one(route: str, task: GeneralTask, calls: Calls) -> None:
        async with sem:
            reward, *_ = await run_calls(task, calls, task.answer)
        r = report.setdefault(route, {"tasks": 0, "rewarded": 0})
        r["tasks"] += 1
        r["rewarded"] += int(reward > 0)

    items: dict[str, list[int]] = {}

    async def expert(task: GeneralTask) -> None:
        calls, answer = expert_route(task)
        async with sem:
            reward, _, transcript = await run_calls(task, calls, answer)
        r = report.setdefault("expert", {"tasks": 0, "rewarded": 0})
        r["tasks"] += 1
        r["rewarded"] += int(reward > 0)
        for line in transcript.splitlines():
            if line.startswith("left out "):  # a judged item with no judge to ask: no verdict to count
                continue
            verdict, name = line.split(" ", 1)
            items.setdefault(f"{task.template}: {name}", []).append(int(verdict == "pass"))

    jobs = [one("reference", t, list(t.plan)) for t in tasks] + [expert(t) for t in tasks]
    for name, route in ROUTES.items():
        if routes is not None and name not in routes:
            continue
        jobs += [one(name, t, calls) for t in tasks if acts(t) and (calls := route(t)) is not None]
    await asyncio.gather(*jobs)
    return {"reference": report["reference"], "expert": report["expert"],
            **{n: report[n] for n in ROUTES if n in report},
            "expert_items": {k: round(sum(v) / len(v), 3) for k, v in sorted(items.items())}}
