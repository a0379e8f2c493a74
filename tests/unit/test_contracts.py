"""The contracts a newcomer reads first: every environment has every member the product uses,
the workspace is an explicit capability, the domain registry owns the per-domain rules, and the
experts and judges the package ships (and the outside example domain's expert) keep their
contracts, ``rlonce.envs.domains.Expert`` and ``rlonce.envs.base.JudgeBinding``.

Nothing type-checks a callable against a Protocol at run time (``isinstance`` on a function only
sees that it has ``__call__``), so ``_mismatches`` compares signatures: every way the contract
lets a caller call must be one the implementation accepts. The experts are also called, the way
SFT and the minimal loop call them, on real tasks of every domain that makes them without a pack."""

import inspect
import random
import sys
from functools import partial
from pathlib import Path

import pytest

from rlonce.config import load_config
from rlonce.config.domains import BUILTIN, load_domain
from rlonce.envs.base import Environment, HasWorkspace, JudgeBinding, group_grader
from rlonce.envs.code.env import CodeEnv
from rlonce.envs.domains import Domain, Expert, domain_for
from rlonce.envs.reasoning.env import ReasoningEnv
from rlonce.envs.toolfind.env import ToolfindEnv
from rlonce.envs.toolfind.tasks import make_task
from rlonce.model.chat import get_format
from rlonce.rollout.sources import check_sources

MEMBERS = [n for n in dir(Environment) if not n.startswith("_")]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "filecount"
PACK_DOMAINS = {"code", "cyber"}
"""Built-in domains whose build needs a pack: their expert is taken from what build hands ``pack_domain``."""


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
        "visual": (True, True, True), "context": (True, True, False)}
    # the rules these flags drive are checked in tests/unit/test_config.py (one-line ConfigErrors)
    check_sources(load_config(None, ["task.name=reasoning", "harness.arms=[single-turn]", "sft.demos=0"]))


def test_every_wire_protocol_client_meets_the_client_contract():
    from rlonce.harness.clients import CLIENTS, Client

    members = [n for n in dir(Client) if not n.startswith("_")] + list(inspect.get_annotations(Client))
    assert set(members) >= {"ask", "give", "restart", "protocol"}
    for protocol, cls in CLIENTS.items():
        assert cls.protocol == protocol and inspect.iscoroutinefunction(cls.ask)
        assert all(hasattr(cls, m) for m in members), cls


def _mismatches(impl, contract, *, unbound: bool = False) -> list[str]:
    """Why ``impl`` cannot be called every way the Protocol method ``contract`` can ([]: it can).
    ``unbound``: ``impl`` is a class's function, its first parameter ``self`` like the contract's."""
    want = list(inspect.signature(contract).parameters.values())[1:]
    have = list(inspect.signature(impl).parameters.values())[1 if unbound else 0:]
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in have)
    var_kw = any(p.kind is p.VAR_KEYWORD for p in have)
    positional = [p for p in have if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    named = {p.name: p for p in have if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    out, served = [], set()
    for i, w in enumerate(want):
        h = None
        if w.kind in (w.POSITIONAL_ONLY, w.POSITIONAL_OR_KEYWORD):
            h = positional[i] if i < len(positional) else None
            if h is None and not var_pos:
                out.append(f"takes no positional argument {i} ({w.name})")
            elif w.kind is w.POSITIONAL_OR_KEYWORD and (h is None or h.name != w.name):
                out.append(f"argument {i} is not named {w.name!r}: a caller may pass it by name")
        if w.kind is w.KEYWORD_ONLY:
            h = named.get(w.name)
            if h is None and not var_kw:
                out.append(f"takes no keyword {w.name!r}")
        if h is not None:
            served.add(h.name)
            if w.default is not w.empty and h.default is h.empty:
                out.append(f"{w.name!r} is required; the contract lets a caller leave it out")
    required = [p.name for p in have if p.name not in served and p.default is p.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if required:
        out.append(f"requires {required}, which the contract never passes")
    if inspect.iscoroutinefunction(contract) != inspect.iscoroutinefunction(impl):
        out.append("is " + ("not " if inspect.iscoroutinefunction(contract) else "") + "a coroutine function")
    return out


def _domains(monkeypatch) -> dict[str, Domain]:
    """Every built-in domain built with its default options, and the outside example."""
    import rlonce.envs.packs

    monkeypatch.setattr(rlonce.envs.packs, "pack_domain",
                        lambda name, o, validated, env, expert: Domain(name, env, lambda s, i: None, expert=expert))
    out = {}
    for name in BUILTIN:
        spec = load_domain(name)
        out[name] = spec.build(spec.options())
    monkeypatch.syspath_prepend(str(EXAMPLE))
    try:
        import filecount

        out["filecount"] = filecount.build(filecount.Options())
    finally:
        sys.modules.pop("filecount", None)
    return out


def test_the_signature_check_refuses_what_does_not_conform():
    def no_fmt(task, rng, **kw):
        return []

    def needs_translate(task, rng, fmt, *, translate, **kw):
        return []

    def no_keywords(task, rng, fmt):
        return []

    def asks_more(task, rng, fmt, extra, **kw):
        return []

    async def in_a_coroutine(task, rng, fmt, **kw):
        return []

    def fine(task, rng, fmt, *, translate=None, single_turn=False, **kw):
        return []

    assert _mismatches(no_fmt, Expert.__call__) == ["takes no positional argument 2 (fmt)"]
    assert _mismatches(needs_translate, Expert.__call__) == [
        "'translate' is required; the contract lets a caller leave it out"]
    assert len(_mismatches(no_keywords, Expert.__call__)) == 4  # translate, detour_p, max_detours, single_turn
    assert _mismatches(asks_more, Expert.__call__) == ["requires ['extra'], which the contract never passes"]
    assert _mismatches(in_a_coroutine, Expert.__call__) == ["is a coroutine function"]
    assert _mismatches(fine, Expert.__call__) == []

    class NoFiles:
        name = model = "x"

        async def ask(self, prompt, schema, *, kind, sample=0, task=None, images=()):
            pass

        def take_counts(self):
            return {}

    assert _mismatches(NoFiles.ask, JudgeBinding.ask, unbound=True) == ["takes no keyword 'files'"]

    class NoCounts:
        name = model = "x"

        async def ask(self, prompt, schema, **kw):
            pass

    assert isinstance(NoFiles(), JudgeBinding) and not isinstance(NoCounts(), JudgeBinding)


def test_every_domains_expert_is_an_expert(monkeypatch):
    from rlonce.harness.arms import get_arm

    domains = _domains(monkeypatch)
    assert set(domains) == set(BUILTIN) | {"filecount"}
    fmt, arm = get_format("hermes"), get_arm("mini-bash")
    for name, domain in domains.items():
        assert domain.expert is not None, name
        assert _mismatches(domain.expert, Expert.__call__) == [], name
        if name in PACK_DOMAINS:
            continue  # their tasks come from a built pack: tests/integration runs their experts
        task = domain.task("sft", 0)
        for single_turn in {False, domain.single_turn}:  # as SFT calls it: every keyword
            turns = domain.expert(task, random.Random(0), fmt, translate=arm.translate, detour_p=0.5,
                                  max_detours=2, single_turn=single_turn)
            assert turns and all(isinstance(t, str) for t in turns), (name, single_turn)
        turns = domain.expert(task, random.Random(0), fmt, detour_p=0.0, max_detours=0)  # as the minimal loop
        assert turns and all(isinstance(t, str) for t in turns), name


def test_every_judge_is_a_judge_binding(tmp_path):
    import rlonce.grading.agentic  # noqa: F401 - its AgenticJudge is a Judge subclass
    from rlonce.config.grading import JudgeConfig
    from rlonce.grading.build import build_judge
    from rlonce.grading.judge import Judge

    def subclasses(cls):
        return [cls, *(s for sub in cls.__subclasses__() for s in subclasses(sub))]

    classes = [c for c in subclasses(Judge) if not inspect.isabstract(c)]
    assert {c.__name__ for c in classes} >= {"ScriptedJudge", "EndpointJudge", "AgenticJudge"}
    for cls in classes:
        for method in ("ask", "take_counts"):
            assert _mismatches(getattr(cls, method), getattr(JudgeBinding, method), unbound=True) == [], \
                (cls.__name__, method)
    configs = [JudgeConfig(kind="scripted"), JudgeConfig(kind="endpoint", base_url="http://127.0.0.1:9/v1"),
               JudgeConfig(kind="scripted", agentic=True),
               JudgeConfig(kind="endpoint", base_url="http://127.0.0.1:9/v1", agentic=True)]
    built = [build_judge(c, tmp_path / "calls.jsonl") for c in configs]
    assert [type(j).__name__ for j in built] == ["ScriptedJudge", "EndpointJudge", "AgenticJudge", "AgenticJudge"]
    for judge in built:
        assert isinstance(judge, JudgeBinding)
        assert _mismatches(judge.ask, JudgeBinding.ask) == [] and judge.take_counts() == {}
    assert build_judge(JudgeConfig(kind="none"), None) is None


@pytest.mark.parametrize("name", sorted(PACK_DOMAINS))
def test_a_pack_domain_hands_its_expert_to_pack_domain(name, monkeypatch):
    """The stand-in for ``pack_domain`` above sees what the real one is given: the domain's expert
    module's ``expert_turns`` (so the check is of the expert SFT uses)."""
    import importlib

    expert = importlib.import_module(f"rlonce.envs.{name}.expert").expert_turns
    assert _domains(monkeypatch)[name].expert is expert
