"""The offline grading tools work on any domain's packs: a plugin domain that gives a ``PackAudit``
(``DomainSpec.pack_audit``) gets its pack audited — its own tasks, environment and scripted agents,
the scripted auditor's verdicts — and rubrics written, with no module of rlonce naming it. A pack
whose domain gives no tools is one line."""

import json
from dataclasses import dataclass

import pytest

from rlonce.config import domains
from rlonce.config.domains import DomainSpec
from rlonce.core.records import Grade
from rlonce.envs.pack_audit import Brief
from rlonce.errors import PackError
from rlonce.grading.judge import ScriptedJudge
from rlonce.grading.rubrics import load_rubrics
from rlonce.grading.scripted import RUBRICS, scripted_rules
from rlonce.recipes.rubric_synthesis import synthesize_rubrics
from rlonce.recipes.task_audit import audit_pack, pack_audit


@dataclass(frozen=True)
class Sum:
    task_id: str
    a: int
    b: int
    weak: bool = False
    """Its check passes any answer, or none."""
    source: str = "sums"


class SumEnv:
    """Add two numbers: the ``answer`` tool records a number; the grade compares it."""

    def __init__(self, task: Sum):
        self.task, self.metrics, self.answer = task, {}, None

    async def setup(self):
        pass

    def system_prompt(self) -> str:
        return "Add the numbers."

    def user_prompt(self) -> str:
        return f"{self.task.a} + {self.task.b}"

    def tools(self) -> list[dict]:
        return []

    async def call_tool(self, name: str, arguments: dict) -> str:
        self.answer = arguments["answer"]
        return "noted"

    async def grade(self, sequence) -> Grade:
        ok = self.task.weak or self.answer == self.task.a + self.task.b
        change = "" if self.answer is None else f"--- a/answer\n+++ b/answer\n@@ -0,0 +1 @@\n+{self.answer}\n"
        return Grade(float(ok), passed=ok, transcript="right" if ok else "wrong", artifact=change)

    async def cleanup(self):
        pass


def _answer(value):
    return lambda t: [("answer", {"answer": value(t)})]


class SumsAudit:
    audit_agents = (("adds", _answer(lambda t: t.a + t.b)), ("adds again", _answer(lambda t: t.b + t.a)),
                    ("no-op", lambda t: []), ("zero", _answer(lambda t: 0)))

    def tasks(self, pack):
        return [Sum(**t) for t in json.loads((pack / "tasks.json").read_text())]

    def env(self, task):
        return SumEnv(task)

    def rollout_agents(self, k: int):
        return [self.audit_agents[i % 2] for i in range(k - 1)] + [self.audit_agents[3]]

    def brief(self, task) -> Brief:
        return Brief(f"Add {task.a} and {task.b}.", "check: answer == a + b", {"check.txt": "a + b"},
                     f"--- a/answer\n+++ b/answer\n@@ -0,0 +1 @@\n+{task.a + task.b}\n")

    def repository(self, task) -> str:
        return "(no files)"


@pytest.fixture
def sums_pack(tmp_path, monkeypatch):
    spec = DomainSpec(name="sums", build=lambda o: None, pack_audit=SumsAudit)
    monkeypatch.setitem(domains._LOADED, "sums", spec)
    pack = tmp_path / "pack"
    pack.mkdir()
    (pack / "pack.json").write_text(json.dumps({"domain": "sums"}))
    tasks = [{"task_id": "sound", "a": 2, "b": 3}, {"task_id": "weak", "a": 1, "b": 1, "weak": True}]
    (pack / "tasks.json").write_text(json.dumps(tasks))
    (pack / "validation.json").write_text("{}")
    return pack


def test_a_plugin_domains_pack_is_audited_with_its_own_tasks_environment_and_agents(sums_pack, tmp_path):
    report = audit_pack(sums_pack, ScriptedJudge(scripted_rules), progress=False)
    assert report["attempts"] == 4 and report["audited"] == 2 and report["failures"] == {}
    sound, weak = report["tasks"]["sound"], report["tasks"]["weak"]
    assert [a["passed"] for a in sound["attempts"]] == [True, True, False, False] and sound["flags"] == []
    # the weak check passes doing nothing: the scripted auditor calls it a false positive
    assert [a["passed"] for a in weak["attempts"]] == [True] * 4 and weak["flags"] == ["false_positive"]
    assert sound["requires"] == "a change that adds: 5"
    assert json.loads((sums_pack / "validation.json").read_text())["audit"]["flagged"] == {"weak": ["false_positive"]}

    report = synthesize_rubrics(sums_pack, ScriptedJudge(scripted_rules), rollouts=3, progress=False)
    assert report["pass_rates"] == {"sound": 2 / 3, "weak": 1.0} and report["written"] == 2
    assert load_rubrics(sums_pack)["sound"].solution == RUBRICS["solution"]


def test_a_pack_of_a_domain_without_tools_or_of_no_domain_is_one_line(sums_pack, tmp_path, monkeypatch):
    monkeypatch.setitem(domains._LOADED, "sums", DomainSpec(name="sums", build=lambda o: None))
    with pytest.raises(PackError, match="the sums domain has no offline grading tools"):
        pack_audit(sums_pack)
    with pytest.raises(PackError, match="is not a task pack"):
        pack_audit(tmp_path)
    (sums_pack / "pack.json").write_text(json.dumps({"format": 1}))  # names no domain: the one with tools (code)
    name, tools = pack_audit(sums_pack)
    assert name == "code" and len(tools.audit_agents) == 4
