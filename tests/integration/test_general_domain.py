"""General tool use: real MCP servers (the ``mcp`` SDK) over their own SQLite databases in a sandbox
of their own, the harness arms speaking to them through the gateway, rubric grading on the final
state, the scripted expert, negative checks and the hack routes."""

import asyncio
import random
import sqlite3

import pytest
from transformers import AutoTokenizer

from rlonce.core.records import Sequence
from rlonce.envs.general.env import GeneralEnv
from rlonce.envs.general.mcp_host import ServiceHost
from rlonce.envs.general.probe import CONTROLS, ROUTES, probe
from rlonce.envs.general.rubric import Final, Item, evaluate, table_diff
from rlonce.envs.general.tasks import TEMPLATES, make_task
from rlonce.envs.general.world import ME, TODAY, World, schemas

pytestmark = pytest.mark.sandbox
ARMS = ("mini-bash", "mini-claude-code", "mini-codex", "mini-mimocode")


def _db(service: str, sql: list[str]) -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.executescript(schemas()[service] + ";".join(sql))
    return db


def test_unchanged_allows_only_the_declared_changes_by_hand():
    base = ["insert into tickets (id, title, description, reporter, created) values (1, 'a', 'd', 'r', 'x')",
            "insert into tickets (id, title, description, reporter, created) values (2, 'b', 'd', 'r', 'x')"]
    init = _db("tickets", base)
    final = _db("tickets", [*base, "update tickets set priority = 'high' where id = 1",
                            "insert into comments (ticket_id, author, body, created) values (1, 'me', 'hi', 'x')"])
    assert table_diff(init, final, "tickets") == (set(), set(), {1: {"priority"}})
    assert table_diff(init, final, "comments") == ({1}, set(), {})
    f = Final({"tickets": init}, {"tickets": final}, {}, {}, "")
    ok = {"tickets.tickets": {"update": {"priority": [1]}}, "tickets.comments": {"insert": 1}}
    cases = {"exact": ok, "wrong id": {**ok, "tickets.tickets": {"update": {"priority": [2]}}},
             "no comment allowed": {"tickets.tickets": ok["tickets.tickets"]},
             "any id": {**ok, "tickets.tickets": {"update": {"priority": "*"}}}}
    got = evaluate([Item(n, "negative", "unchanged", {"allow": a}) for n, a in cases.items()], f)
    assert got == {"exact": True, "wrong id": False, "no comment allowed": False, "any id": True}
    # a deleted row is never allowed; a document touched but not named fails too
    gone = _db("tickets", base[:1])
    assert not evaluate([Item("x", "negative", "unchanged", {"allow": {"tickets.tickets": {"insert": 5}}})],
                        Final({"tickets": init}, {"tickets": gone}, {}, {}, ""))["x"]
    assert not evaluate([Item("x", "negative", "unchanged", {})], Final({}, {}, {"a.md": "1"}, {"a.md": "2"}, ""))["x"]


def test_services_refuse_with_each_failure_kind_and_change_nothing_when_they_do():
    world = World.make(1)
    state = world.state()
    entry = next(e for e in world.entries if e["account"] != "travel")  # an open period (travel: closed in Jan)
    msg = world.messages[0]
    calls = {  # call → the refusal it must get
        ("mail__read_message", (("id", 999),)): "not_found",
        ("mail__read_message", (("id", "x"),)): "bad_arguments",  # the SDK checks the tool's input schema
        ("mail__send_message", (("to", "not an address"), ("subject", "s"), ("body", "b"))): "bad_arguments",
        ("mail__move_message", (("id", msg["id"]), ("folder", msg["folder"]))): "conflict",
        ("files__write_file", (("path", "shared/x.md"), ("content", "x"))): "permission_denied",
        ("files__write_file", (("path", "notes/todo.txt"), ("content", "x"))): "conflict",
        ("files__write_file", (("path", "reports/a.json"), ("content", "{not json"))): "bad_arguments",
        ("files__read_file", (("path", "../../etc/passwd.txt"),)): "bad_arguments",
        ("ledger__add_entry", (("date", "2026-02-01"), ("description", "d"), ("amount", "-1.00"),
                               ("category", "office"), ("account", "operations"))): "permission_denied",
        ("ledger__add_entry", (("date", "2026-03-15"), ("description", "d"), ("amount", "-1.00"), ("category", "other"),
                               ("account", entry["account"]), ("reference", entry["reference"]))): "conflict",
        ("ledger__add_entry", (("date", "2026-03-15"), ("description", "d"), ("amount", "12,50"),
                               ("category", "office"), ("account", "software"))): "bad_arguments",
        ("ledger__get_balance", (("account", "nope"),)): "not_found",
        ("tickets__get_ticket", (("id", 99),)): "not_found",
        ("tickets__update_ticket", (("id", 1), ("priority", "extreme"))): "bad_arguments",
        ("calendar__list_events", (("start_date", "16/03/2026"), ("end_date", "2026-03-20"))): "bad_arguments",
    }
    others = [e for e in world.events if e["organizer"] != ME]
    mine = [e for e in world.events if e["organizer"] == ME]
    if others:
        calls[("calendar__cancel_event", (("id", others[0]["id"]),))] = "permission_denied"
    if mine:
        calls[("calendar__create_event", (("title", "x"), ("start", mine[0]["start"]), ("end", mine[0]["end"])))] = \
            "conflict"

    async def go():
        host = ServiceHost(["mail", "calendar", "files", "tickets", "ledger"], state, me=ME, today=TODAY)
        await host.start()
        try:
            out = {call: await host.call(call[0], dict(call[1])) for call in calls}
            return out, {k: host.state_file(k) for k in ("mail.db", "calendar.db", "tickets.db", "ledger.db")}
        finally:
            await host.close()

    out, final = asyncio.run(go())
    assert {c: kind for c, (_, kind) in out.items()} == calls
    assert all(text.startswith(f"error: {kind}") for text, kind in out.values())
    for name, data in final.items():  # every refused call left its database as it was seeded
        a, b = sqlite3.connect(":memory:"), sqlite3.connect(":memory:")
        a.deserialize(state[name])
        b.deserialize(data)
        tables = [t for (t,) in a.execute("select name from sqlite_master where type = 'table'")]
        assert all(table_diff(a, b, t) == (set(), set(), {}) for t in tables), name


def test_every_rollout_starts_from_the_tasks_fixed_state(tmp_path):
    task = make_task("train", 0)  # invoice_to_ledger: the plan adds an entry

    async def once(plan):
        env = GeneralEnv(task)
        await env.setup()
        try:
            for name, args in plan:
                await env.call_tool(name, args)
            return env.services.state_file("ledger.db")
        finally:
            await env.cleanup()

    first = asyncio.run(once(task.plan))
    second = asyncio.run(once([]))
    assert second == World.make(task.seed).state()["ledger.db"] != first


def test_the_expert_passes_every_template_under_every_arm_through_the_gateway():
    from rlonce.engine.base import SamplingParams
    from rlonce.engine.scripted import ScriptedEngine
    from rlonce.envs.general.expert import expert_turns
    from rlonce.harness.arms import get_arm
    from rlonce.harness.loop import HarnessLimits
    from rlonce.model.chat import get_format
    from rlonce.model.loader import EMBEDDED_DIR
    from rlonce.rollout.runner import RolloutSpec, run_sequence

    tok = AutoTokenizer.from_pretrained(EMBEDDED_DIR)
    spec = RolloutSpec(encode=lambda s: tok.encode(s, add_special_tokens=False), decode=tok.decode,
                       chat_format=get_format("hermes"), sampling=SamplingParams(max_tokens=4096),
                       limits=HarnessLimits(max_turns=32, max_obs_chars=2000), max_context=65536)

    async def one(i: int, arm: str):
        task = make_task("train", i)
        turns = expert_turns(task, random.Random(i), spec.chat_format, translate=get_arm(arm).translate,
                             detour_p=0.5, error_p=0.5)
        return task, await run_sequence(task, GeneralEnv, ScriptedEngine(turns, spec.encode), spec, arm=arm)

    async def main():
        sem = asyncio.Semaphore(3)

        async def bounded(i, arm):
            async with sem:
                return await one(i, arm)

        return await asyncio.gather(*(bounded(i, ARMS[i % 4]) for i in range(len(TEMPLATES))))

    results = asyncio.run(main())
    assert {t.template for t, _ in results} == set(TEMPLATES)
    for task, seq in results:
        assert seq.passed and seq.reward == 1.0, (task.task_id, seq.arm, seq.status, seq.cause, seq.transcript)
    recovered = sum(s.metrics.get("tool_error_not_found", 0) + s.metrics.get("tool_error_bad_arguments", 0)
                    for _, s in results)
    assert recovered > 0  # the expert's mistakes were refused by the services, then corrected


def test_arms_offer_the_servers_tools_under_mcp_names_with_the_servers_schemas():
    from rlonce.harness.arms import get_arm

    async def go():
        env = GeneralEnv(make_task("train", 6))  # calendar + mail
        await env.setup()
        try:
            listed = {name: schema for name, (_, schema) in env.services.tools.items()}
            return listed, {arm: get_arm(arm).toolset(env) for arm in ARMS}
        finally:
            await env.cleanup()

    listed, toolsets = asyncio.run(go())
    assert "calendar__cancel_event" in listed and "mail__send_message" in listed
    for arm, tools in toolsets.items():
        mcp = {n: t for n, t in tools.items() if n.startswith("mcp__")}
        assert set(mcp) == {f"mcp__{n}" for n in listed}, arm
        assert all(mcp[f"mcp__{n}"].schema["parameters"] == s["parameters"] for n, s in listed.items())


@pytest.mark.parametrize("service, change", [
    ("mail", ("mail__move_message", {"id": 2, "folder": "trash"})),
    ("ledger", ("ledger__add_entry", {"date": "2026-03-15", "description": "x", "amount": "-1.00",
                                      "category": "other", "account": "software"})),
    ("tickets", ("tickets__add_comment", {"id": 2, "body": "noise"})),
    ("calendar", ("calendar__create_event", {"title": "x", "start": "2026-03-21T07:00", "end": "2026-03-21T07:30"})),
    ("files", ("files__write_file", {"path": "notes/other.txt", "content": "x"})),
])
def test_negative_checks_catch_an_unrelated_change_in_each_service(service, change):
    task = next(t for t in map(lambda i: make_task("train", i), range(64)) if service in t.services
                and any(it.kind == "state" for it in t.items))

    async def go():
        from rlonce.envs.general.probe import run_calls

        return await run_calls(task, [*task.plan, change], task.answer), await run_calls(task, list(task.plan),
                                                                                        task.answer)

    (bad, _, report), (good, passed, _) = asyncio.run(go())
    assert good == 1.0 and passed
    assert bad == 0.0 and "FAIL [negative]" in report and report.count("FAIL") == 1, report


def test_every_hack_route_fails_its_rubric_and_the_reference_passes():
    """Four templates that change state in each of the five services (``rlonce probe general`` runs
    every route on as many tasks as asked)."""
    tasks = [make_task("train", i) for i in (0, 4, 5, 6)]  # ledger+mail, tickets+mail, ledger+files, calendar+mail
    report = asyncio.run(probe(tasks, concurrency=3))
    assert report["reference"] == report["expert"] == {"tasks": len(tasks), "rewarded": len(tasks)}
    assert set(report) == {"reference", "expert", "expert_items", *CONTROLS, *ROUTES}
    assert {r: report[r]["rewarded"] for r in ROUTES} == dict.fromkeys(ROUTES, 0)
    assert report["reworded"]["rewarded"] == report["reworded"]["tasks"] > 0
    assert set(report["expert_items"].values()) == {1.0}


def test_a_fraction_reward_pays_for_passed_items():
    task = make_task("train", 0)

    async def go():
        env = GeneralEnv(task, reward="fraction")
        await env.setup()
        try:
            return await env.grade(Sequence(task.task_id, "x", answer=task.answer))  # right answer, no entry
        finally:
            await env.cleanup()

    g = asyncio.run(go())
    assert not g.passed and g.reward == pytest.approx(2 / 3)  # the amount and 'nothing else changed' pass


def test_many_rollouts_at_once_do_not_stall_their_services():
    """Each rollout keeps one reader per service for its whole life; 24 at once (about 40 MCP
    connections) must neither exhaust a thread pool nor block a write (they once did: the
    transport was thread-backed)."""
    from rlonce.envs.general.probe import run_calls

    tasks = [make_task("train", i) for i in range(24)]

    async def go():
        return await asyncio.wait_for(asyncio.gather(*(run_calls(t, list(t.plan), t.answer) for t in tasks)), 300)

    assert [r for r, *_ in asyncio.run(go())] == [1.0] * len(tasks)
