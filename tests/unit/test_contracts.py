"""The contracts a newcomer reads first: every environment has every member the product uses,
the workspace is an explicit capability, and the domain registry owns the per-domain rules."""

import inspect
from functools import partial

import pytest

from rlonce.config import load_config
from rlonce.config.domains import BUILTIN, load_domain
from rlonce.envs.base import Environment, HasWorkspace, group_grader
from rlonce.envs.code.env import CodeEnv
from rlonce.envs.domains import domain_for
from rlonce.envs.reasoning.env import ReasoningEnv
from rlonce.envs.toolfind.env import ToolfindEnv
from rlonce.envs.toolfind.tasks import make_task
from rlonce.rollout.sources import check_sources

MEMBERS = [n for n in dir(Environment) if not n.startswith("_")]


def test_the_environment_contract_names_what_the_product_uses():
    assert set(MEMBERS) >= {"setup", "system_prompt", "user_prompt", "tools", "call_tool", "grade", "cleanup"}
    assert {"task", "metrics"} <= set(inspect.get_annotations(Environment))


@pytest.mark.parametrize("cls", [ToolfindEnv, ReasoningEnv, CodeEnv])
def test_every_environment_has_every_member(cls):
    missing = [m for m in MEMBERS if not callable(getattr(cls, m, None))]
    assert missing == []
    for m in ("setup", "call_tool", "grade", "cleanup"):
        assert inspect.iscoroutinefunction(getattr(cls, m)), m


def test_the_workspace_is_an_explicit_capability():
    assert isinstance(ToolfindEnv(make_task("train", 0)), HasWorkspace)
    reasoning = domain_for(load_config(None, ["task.name=reasoning", "harness.arms=[single-turn]", "sft.demos=0"]).task)
    assert not isinstance(reasoning.env_factory(reasoning.task("heldout", 0)), HasWorkspace)


def test_group_grader_is_found_through_a_partial():
    class Judged(ToolfindEnv):
        @staticmethod
        async def grade_group(task, sequences):
            pass

    assert group_grader(partial(Judged, limits=None)) is Judged.grade_group
    assert group_grader(ToolfindEnv) is None


def test_the_registry_owns_the_per_domain_rules():
    assert {n: (load_domain(n).has_expert, load_domain(n).single_turn, load_domain(n).tools) for n in BUILTIN} == {
        "toolfind": (True, False, True), "reasoning": (True, True, False), "code": (True, False, True),
        "music": (True, True, True), "cyber": (True, False, True), "general": (True, False, True),
        "visual": (True, True, True)}
    # the rules these flags drive are checked in tests/unit/test_config.py (one-line ConfigErrors)
    check_sources(load_config(None, ["task.name=reasoning", "harness.arms=[single-turn]", "sft.demos=0"]))


def test_every_wire_protocol_client_meets_the_client_contract():
    from rlonce.harness.clients import CLIENTS, Client

    members = [n for n in dir(Client) if not n.startswith("_")] + list(inspect.get_annotations(Client))
    assert set(members) >= {"ask", "give", "restart", "protocol"}
    for protocol, cls in CLIENTS.items():
        assert cls.protocol == protocol and inspect.iscoroutinefunction(cls.ask)
        assert all(hasattr(cls, m) for m in members), cls
