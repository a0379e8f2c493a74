"""The rule of blame, as a property over every tool of every domain: whatever the policy writes —
a NUL, a lone surrogate, a megabyte, a path that climbs out, newlines, bytes that are not UTF-8,
links and FIFOs where a grader reads — is the policy's failed attempt (graded, trained), never an
infrastructure failure.

Each built-in domain (``rlonce.config.domains.BUILTIN``) goes through the real rollout path
(real sandboxes, the in-process gateway, every harness arm it offers) with the scripted hostile
model of ``rlonce.rollout.hostile`` — what ``rlonce probe <domain>`` reports. A domain added to
the registry is covered without an edit here, except for the pack it may need (``PACKS``).
"""

import asyncio
import shutil

import pytest

from rlonce.config import TaskConfig
from rlonce.config.domains import BUILTIN, load_domain
from rlonce.envs.domains import domain_for
from rlonce.errors import MAX_ARGUMENT_CHARS, input_problem
from rlonce.rollout.hostile import HOSTILE, UNSENDABLE, arms_for, format_hostile, probe_hostile_input

pytestmark = [pytest.mark.sandbox]
PACKS = {"code": "code_pack", "cyber": "cyber_pack"}
"""Domains whose tasks come from a built pack: the session fixture that builds a small one."""


def test_the_boundary_check_names_each_hostile_value():
    assert input_problem({"command": "ls -la", "n": 3, "xs": ["a", {"b": "c"}]}) is None
    assert "NUL" in input_problem({"command": HOSTILE["nul"]})
    assert "surrogate" in input_problem(["ok", {"k": HOSTILE["surrogate"]}])
    assert "surrogate" in input_problem({HOSTILE["escape"]: "a key, not a value"})
    assert str(MAX_ARGUMENT_CHARS) in input_problem({"a": "y" * (MAX_ARGUMENT_CHARS // 2 + 1),
                                                     "b": "y" * (MAX_ARGUMENT_CHARS // 2)})
    assert input_problem("y" * MAX_ARGUMENT_CHARS) is None


HEAVY = {"general": "MCP services start for every episode", "visual": "headless Chromium grades every episode"}
"""Domains whose run is over half a minute here: in ``make test-slow`` (the others in ``make test``)."""


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n for n in BUILTIN])
def test_hostile_input_to_every_tool_of_every_domain_is_never_infrastructure(request, name):
    if name == "visual":
        request.getfixturevalue("chromium")
    if name == "cyber" and shutil.which("clang") is None:
        pytest.skip("clang is not installed (apt-get install clang)")
    pack = request.getfixturevalue(PACKS[name]) if name in PACKS else None
    domain = domain_for(TaskConfig(name=name, **({"pack": str(pack)} if pack else {})))
    entry = load_domain(name)
    report = asyncio.run(probe_hostile_input(domain.env_factory, domain.task("train", 0),
                                             arms_for(entry.single_turn, entry.tools)))
    assert report["infra"] == 0 and report["passed"] == 0, format_hostile(report)
    rows = report["rows"]
    for r in rows:
        if r["label"] == "every tool":  # answered, tool by tool, and graded as the policy's attempt
            assert r["status"] == "submitted" and r["policy_input_errors"] >= 2, r
        if r["label"] in ("unknown tool", "arguments not an object") or r["label"].endswith(UNSENDABLE):
            assert r["status"] == "format_error", r  # the gateway's parse refuses the turn
    assert {r["arm"] for r in rows} == set(arms_for(entry.single_turn, entry.tools))
