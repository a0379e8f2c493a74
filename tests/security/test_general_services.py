"""Attacks on the general-tool-use domain's services and grader.

- The agent's shell runs in its own sandbox: the services' databases and documents are not there,
  so editing the state directly or through a side door is impossible (the state changes only
  through the services' operations, and only the grader reads it back).
- The documents service takes hostile paths: traversal, absolute paths, odd names and
  extensions, deep trees — each refused as ``bad_arguments``, nothing written outside its folder.
- Hostile argument values (SQL in a search, huge text) are data: parameterised queries and size
  caps, the database intact.
"""

import asyncio

import pytest

from rlonce.envs.general.env import GeneralEnv
from rlonce.envs.general.tasks import make_task

pytestmark = pytest.mark.sandbox


def _run(task, calls):
    async def go():
        env = GeneralEnv(task)
        await env.setup()
        try:
            out = [await env.call_tool(n, a) for n, a in calls]
            return out, env.services.state_file("ledger.db") if "ledger" in task.services else b""
        finally:
            await env.cleanup()

    return asyncio.run(go())


def test_the_agents_shell_cannot_reach_the_services_state():
    task = make_task("train", 0)  # mail + ledger
    probes = ["find / -name '*.db' -o -name 'svc_host.py' 2>/dev/null | head", "ls -la /work /opt 2>&1",
              "cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c '[s]vc_host'",
              "python3 -c \"import sqlite3; sqlite3.connect('/work/ledger.db').execute('create table x(y)')\"; "
              "ls /work"]
    out, ledger = _run(task, [("bash", {"command": c}) for c in probes])
    assert not any(name in out[0] for name in ("ledger.db", "mail.db", "svc_host"))  # /usr has unrelated .db files
    assert "ledger" not in out[1] and "mail" not in out[1]
    assert out[2].strip().startswith("0")  # the services' process is not in the agent's pid namespace
    assert out[3].count("ledger.db") == 1  # the shell made a new, unrelated file in its own scratch space
    import sqlite3

    db = sqlite3.connect(":memory:")
    db.deserialize(ledger)
    assert [t for (t,) in db.execute("select name from sqlite_master where type = 'table'")] == ["accounts", "entries"]


@pytest.mark.parametrize("path", ["../secret.md", "/etc/passwd.md", "notes/../../x.md", "a/b/c/d.md", ".hidden/x.md",
                                  "notes/x.sh", "notes/x", "notes/x.md\x00.txt", "notes/" + "x" * 100 + ".md"])
def test_the_documents_service_refuses_hostile_paths(path):
    task = make_task("train", 5)  # ledger + files
    out, _ = _run(task, [("files__write_file", {"path": path, "content": "x"}),
                         ("files__read_file", {"path": path}), ("files__list_files", {})])
    assert out[0].startswith("error: bad_arguments") and out[1].startswith("error: bad_arguments"), out
    assert "secret" not in out[2] and ".sh" not in out[2]


def test_hostile_values_are_data_and_sizes_are_capped():
    task = make_task("train", 0)
    calls = [("mail__search_messages", {"query": "x' or 1=1; drop table messages; --"}),
             ("ledger__list_entries", {"account": "software' or '1'='1"}),
             ("ledger__add_entry", {"date": "2026-03-15", "description": "y" * 50_000, "amount": "-1.00",
                                    "category": "other", "account": "software"}),
             ("mail__list_messages", {"limit": 10_000})]
    out, ledger = _run(task, calls)
    assert out[0] == '{"messages": []}' and out[1] == '{"entries": []}'
    assert out[2].startswith("error: bad_arguments") and out[3].startswith("error: bad_arguments")
    import sqlite3

    db = sqlite3.connect(":memory:")
    db.deserialize(ledger)
    assert db.execute("select count(*) from entries").fetchone()[0] == 10  # the seeded ten, nothing added
