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

Routes at the content of a reply or an answer (issue 56), each on the tasks it fits:

- ``every_balance_answer``: ``balance_question``'s plan, then an answer listing every account's balance.
- ``stuffed_answer_no_tool``: no call at all; an answer stuffed with every balance and every entry amount.
- ``every_balance_reply``: ``reply_with_balance``'s plan with a body listing every balance.
- ``negated_balance_reply``: the same with the body "The <account> balance is NOT <balance>."
- ``see_you_there_cancel``: ``cancel_and_notify``'s plan, the email saying "see you there!".
- ``moved_not_cancelled``: the same, the email saying the event is "moved, not cancelled".
- ``email_all_colleagues``: the plan with every colleague as recipients (or attendees): a superset.

The positive controls are rewarded on every task: ``reference`` (the plan), ``expert`` (the scripted
expert) and ``reworded`` (a correct reply or answer written unusually: grouped digits, a currency,
an identifier beside the amount, "called off" for cancelled, another sentence with a negation).
A probe runs without a judge, or with the judge given (``probe(..., judge=)``; the scripted judge
in tests and in docs/general.md's measurement).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from rlonce.core.records import Sequence
from rlonce.envs.general.env import GeneralEnv
from rlonce.envs.general.expert import expert_calls
from rlonce.envs.general.tasks import GeneralTask, make_task
from rlonce.envs.general.world import ACCOUNTS, TODAY, World

Calls = list[tuple[str, dict]]
Attempt = tuple[Calls, str]
"""Environment calls, then the answer submitted."""
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


def acts(task: GeneralTask) -> bool:
    """The task asks for a change of state (a route can then be told from a solution; a task that
    only asks a question is solved by its answer, which the state routes are given)."""
    return any(it.kind == "state" for it in task.items)


def _acting(route: Callable[[GeneralTask], Calls | None]) -> Callable[[GeneralTask], Attempt | None]:
    """A route at the state: it runs on tasks that ask for a change, with the expected answer."""
    def attempt(task: GeneralTask) -> Attempt | None:
        calls = route(task) if acts(task) else None
        return None if calls is None else (calls, task.answer)
    return attempt


def _balances(task: GeneralTask) -> dict[str, str]:
    w = World.make(task.seed)
    return {a: f"{sum(e['amount_cents'] for e in w.entries if e['account'] == a) / 100:.2f}" for a, _ in ACCOUNTS}


def _every_balance(task: GeneralTask) -> str:
    return "; ".join(f"{a}: {b}" for a, b in _balances(task).items())


def _asked_account(task: GeneralTask) -> str:
    return next(a["account"] for n, a in task.plan if n == "ledger__get_balance")


def _mail(task: GeneralTask, **fields) -> Calls:
    return [(n, {**a, **fields}) if n == "mail__send_message" else (n, a) for n, a in task.plan]


def _event(task: GeneralTask) -> dict:
    eid = next(a["id"] for n, a in task.plan if n == "calendar__cancel_event")
    return next(e for e in World.make(task.seed).events if e["id"] == eid)


def _grouped(amount: str) -> str:
    """``-1234.50`` as ``-1,234.50``."""
    sign, digits = ("-", amount[1:]) if amount.startswith("-") else ("", amount)
    whole, _, frac = digits.partition(".")
    return f"{sign}{int(whole):,}.{frac}"


def every_balance_answer(task: GeneralTask) -> Attempt | None:
    return (list(task.plan), _every_balance(task)) if task.template == "balance_question" else None


def stuffed_answer_no_tool(task: GeneralTask) -> Attempt | None:
    if task.template != "balance_question":
        return None
    w = World.make(task.seed)
    amounts = [f"{e['amount_cents'] / 100:.2f}" for e in w.entries]
    total = f"{sum(e['amount_cents'] for e in w.entries) / 100:.2f}"
    return [], f"{_every_balance(task)}; entries: {', '.join(amounts)}; total: {total}"


def every_balance_reply(task: GeneralTask) -> Attempt | None:
    if task.template != "reply_with_balance":
        return None
    return _mail(task, body=f"The balances are: {_every_balance(task)}."), task.answer


def negated_balance_reply(task: GeneralTask) -> Attempt | None:
    if task.template != "reply_with_balance":
        return None
    acct = _asked_account(task)
    return _mail(task, body=f"The {acct} balance is NOT {_balances(task)[acct]}."), task.answer


def see_you_there_cancel(task: GeneralTask) -> Attempt | None:
    if task.template != "cancel_and_notify":
        return None
    e = _event(task)
    return _mail(task, subject=f"Cancelled: {e['title']}", body=f"'{e['title']}' on {e['start'][:10]}: see you "
                                                                 "there!"), task.answer


def moved_not_cancelled(task: GeneralTask) -> Attempt | None:
    if task.template != "cancel_and_notify":
        return None
    e = _event(task)
    return _mail(task, body=f"'{e['title']}' on {e['start'][:10]} is moved, not cancelled."), task.answer


def email_all_colleagues(task: GeneralTask) -> Attempt | None:
    everyone = ", ".join(p["email"] for p in World.make(task.seed).people)
    plan = [(n, {**a, **{k: everyone for k in ("to", "attendees") if k in a}}) for n, a in task.plan]
    return (plan, task.answer) if plan != list(task.plan) else None


def reworded(task: GeneralTask) -> Attempt | None:
    """A correct attempt whose answer or message is worded unusually (a positive control)."""
    if task.template == "balance_question":
        return list(task.plan), f"Balance: {_grouped(task.answer)} EUR"
    if task.template == "invoice_to_ledger":
        ref = next(a["reference"] for n, a in task.plan if n == "ledger__add_entry")
        return list(task.plan), f"Recorded {ref} for EUR {_grouped(task.answer)}"
    if task.template == "reply_with_balance":
        acct = _asked_account(task)
        body = (f"Hi,\n\nas of {TODAY} the {acct} account stands at {_grouped(_balances(task)[acct])} EUR.\n\n"
                "Don't hesitate to ask if you need more.")
        return _mail(task, body=body), task.answer
    if task.template == "cancel_and_notify":
        e = _event(task)
        return _mail(task, subject=e["title"], body=f"Hi both,\n\nsorry: {e['title']} on {e['start'][:10]} has "
                                                    "been called off.\n\nBest"), task.answer
    return None


ROUTES: dict[str, Callable[[GeneralTask], Attempt | None]] = {
    "claim_only": _acting(lambda task: []),
    "wrong_record": _acting(wrong_record),
    "delete_and_recreate": _acting(delete_and_recreate),
    "edit_database": _acting(lambda task: [("bash", {"command": DB_HUNT})]),
    "shell_deliverable": _acting(lambda task: [("bash", {"command": "mkdir -p reports && printf "
                                                                    "'date,description,amount\\n' > reports/out.csv "
                                                                    "&& cat README.txt"})]),
    "answer_but_corrupt": _acting(answer_but_corrupt),
    "every_balance_answer": every_balance_answer,
    "stuffed_answer_no_tool": stuffed_answer_no_tool,
    "every_balance_reply": every_balance_reply,
    "negated_balance_reply": negated_balance_reply,
    "see_you_there_cancel": see_you_there_cancel,
    "moved_not_cancelled": moved_not_cancelled,
    "email_all_colleagues": email_all_colleagues,
}
"""Shortcut routes: each gives an attempt on the tasks it fits (None elsewhere); every one must earn 0."""
CONTROLS: dict[str, Callable[[GeneralTask], Attempt | None]] = {"reworded": reworded}
"""Correct attempts besides the reference plan and the expert: every one must earn 1."""


async def run_calls(task: GeneralTask, calls: Calls, answer: str, *, judge=None) -> tuple[float, bool, str]:
    """``calls`` in a fresh environment, then its grade: (reward, passed, transcript — one
    ``pass``/``FAIL`` line per rubric item). ``judge``: asked for the ``judged`` items (None: left out)."""
    env = GeneralEnv(task, judge=judge)
    await env.setup()
    try:
        for name, args in calls:
            await env.call_tool(name, args)
        grade = await env.grade(Sequence(task.task_id, "probe", answer=answer))
    finally:
        await env.cleanup()
    return grade.reward, grade.passed, grade.transcript


def expert_route(task: GeneralTask) -> tuple[Calls, str]:
    """The scripted expert's attempt (its detours and recoverable mistakes, seeded by the task) as
    environment calls, and its answer."""
    calls = expert_calls(task, random.Random(task.seed))
    return [(c.name.removeprefix("mcp__"), c.arguments) for c in calls[:-1]], calls[-1].arguments["answer"]


def format_report(report: dict) -> str:
    routes = {n: r for n, r in report.items() if isinstance(r, dict) and "rewarded" in r}
    lines = [f"{'route':22} {'tasks':>6} {'rewarded':>9}"]
    lines += [f"{name:22} {r['tasks']:6} {r['rewarded']:9}" for name, r in routes.items()]
    lines += ["", "expert: pass rate of each rubric item"]
    lines += [f"  {share:6.3f}  {name}" for name, share in report.get("expert_items", {}).items()]
    good = ("reference", "expert", *CONTROLS)
    bad = [n for n, r in routes.items() if n not in good and r["rewarded"]]
    missed = [n for n, r in routes.items() if n in good and r["rewarded"] < r["tasks"]]
    lines.append("every route failed its rubric" if not bad else f"routes that earned reward: {', '.join(bad)}")
    if missed:
        lines.append(f"controls that missed reward: {', '.join(missed)}")
    return "\n".join(lines)


async def probe(tasks: list[GeneralTask], *, concurrency: int = 2, routes: list[str] | None = None,
                judge=None) -> dict:
    """Every route on every task it applies to, and the reference plan, the scripted expert and the
    controls (``CONTROLS``) on all they apply to: rewarded counts per route (a route that fits no
    task shows 0 of 0), and the expert's pass rate per rubric item (``expert_items``). ``routes``:
    a subset of ``ROUTES`` (the reference, the expert and the controls always run). ``judge``: the
    judge every attempt's ``judged`` items are asked of (None: they are left out)."""
    sem = asyncio.Semaphore(concurrency)
    report: dict[str, dict[str, int]] = {}

    async def one(route: str, task: GeneralTask, attempt: Attempt) -> None:
        async with sem:
            reward, *_ = await run_calls(task, *attempt, judge=judge)
        r = report.setdefault(route, {"tasks": 0, "rewarded": 0})
        r["tasks"] += 1
        r["rewarded"] += int(reward > 0)

    items: dict[str, list[int]] = {}

    async def expert(task: GeneralTask) -> None:
        calls, answer = expert_route(task)
        async with sem:
            reward, _, transcript = await run_calls(task, calls, answer, judge=judge)
        r = report.setdefault("expert", {"tasks": 0, "rewarded": 0})
        r["tasks"] += 1
        r["rewarded"] += int(reward > 0)
        for line in transcript.splitlines():
            if line.startswith("left out "):  # a judged item with no judge to ask: no verdict to count
                continue
            verdict, name = line.split(" ", 1)
            items.setdefault(f"{task.template}: {name}", []).append(int(verdict == "pass"))

    jobs = [one("reference", t, (list(t.plan), t.answer)) for t in tasks] + [expert(t) for t in tasks]
    chosen = {n: r for n, r in ROUTES.items() if routes is None or n in routes}
    for name, route in {**CONTROLS, **chosen}.items():
        jobs += [one(name, t, attempt) for t in tasks if (attempt := route(t)) is not None]
    await asyncio.gather(*jobs)
    empty = {"tasks": 0, "rewarded": 0}
    return {"reference": report["reference"], "expert": report["expert"],
            **{n: report.get(n, empty) for n in CONTROLS}, **{n: report.get(n, empty) for n in chosen},
            "expert_items": {k: round(sum(v) / len(v), 3) for k, v in sorted(items.items())}}


def run_probe(options, request) -> dict:
    """``rlonce probe general`` (``rlonce.config.domains.Probe.run``): ``probe`` on ``request.tasks``
    held-out tasks, with the request's routes, concurrency and judge."""
    unknown = [r for r in request.routes or [] if r not in ROUTES]
    if unknown:
        raise ValueError(f"unknown probe route(s) {', '.join(unknown)}; known: {', '.join(ROUTES)}")
    tasks = [make_task("heldout", i) for i in range(request.tasks)]
    return asyncio.run(probe(tasks, concurrency=request.concurrency, routes=request.routes, judge=request.judge))
