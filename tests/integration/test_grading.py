"""Model graders on a real code group: the real orchestrator, executor, sandbox and hidden-test
grader, then the group grader with a scripted judge before the group is judged.

The seeds' GAR worked example end to end (seed 001: quality factors ½ and 1 on two passes, λ = 4/3,
advantages 1/3 and 2/3, failures −½), a confirmed hack zeroed before the group's statistics, GRS
rubric scores multiplying the test reward, and every unusable judge — malformed, late, down —
falling back to the test rewards with the fallback counted and the ledger balanced."""

import asyncio
import json
import random
import re
from types import SimpleNamespace

import pytest
from test_code_training import PerSession, _spec

from rlonce.algo.signal import SignalSettings
from rlonce.config import TaskConfig
from rlonce.core.records import Grades
from rlonce.envs.domains import domain_for
from rlonce.grading.graders import Grader, GradingSettings
from rlonce.grading.judge import EndpointJudge, ScriptedJudge
from rlonce.grading.verdicts import Rubrics
from rlonce.rollout.graded import GradedExecutor, PackRubrics

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from rlonce.model.loader import EMBEDDED_DIR

    return AutoTokenizer.from_pretrained(EMBEDDED_DIR)


def _group(code_pack, tok, judge, settings: GradingSettings, signal: SignalSettings, *, rubrics=lambda t: None):
    """One group of 4 on the first train task: the reference fix twice (the second after a detour,
    so the two changes differ only in the trajectory), then two empty submissions."""
    from collections import Counter

    from rlonce.envs.code.expert import expert_turns
    from rlonce.model.chat import ToolCall
    from rlonce.rollout.mixer import SampleMixer, SourceStats
    from rlonce.rollout.orchestrator import Orchestrator, OrchestratorSettings
    from rlonce.rollout.runner import LocalExecutor

    spec = _spec(tok)
    fmt = spec.chat_format
    domain = domain_for(TaskConfig(name="code", pack=str(code_pack)))
    fix = expert_turns(domain.task("train", 0), random.Random(0), fmt, detour_p=0.0)
    look = [fmt.assistant_text("", [ToolCall("bash", {"command": "ls"})])]
    submit = [fmt.assistant_text("", [ToolCall("submit", {"answer": "done"})])]
    engine = PerSession([fix, look + fix, submit, submit], spec.encode)
    grader = Grader(judge, settings, statement=lambda t: domain.env_factory(t).user_prompt(), decode=tok.decode,
                    rubrics=rubrics)
    executor = GradedExecutor(LocalExecutor(domain.env_factory, engine, spec), grader, Counter())

    async def go():
        orch = Orchestrator(executor, lambda _s, i: domain.task("train", i),
                            SampleMixer({"code": SourceStats(0, share=1.0)}), signal,
                            OrchestratorSettings(group_size=4, batch=1, refill=False))
        res = await orch.collect(1)
        await orch.close()
        return res

    res = asyncio.run(go())
    res.ledger["code"].check()
    return res, grader


def _advantages(res) -> list[float]:
    by_seq = {}
    for r in res.rows:
        by_seq.setdefault(id(r), max(r.advantages, key=abs))
    return [round(a, 6) for a in sorted(by_seq.values())]


def _gar_script(kind, prompt, sample):
    if kind != "gar":
        return '{"hack": false, "reason": "clean"}'
    ids = [int(i) for i in re.findall(r"^### Attempt (\d+) \(passed\)", prompt, re.M)]
    dims = ("approach", "precision", "minimality", "no_side_effects", "craftsmanship")
    return json.dumps({"attempts": [{"attempt": i, **dict.fromkeys(dims, q)} for i, q in zip(ids, (0.5, 1.0))]})


def test_gar_worked_example_end_to_end_on_a_real_code_group(code_pack, tok):
    res, grader = _group(code_pack, tok, ScriptedJudge(_gar_script), GradingSettings(gar=True),
                         SignalSettings(gar=True))
    seqs = res.finished
    assert [s.passed for s in seqs] == [True, True, False, False]
    assert all(s.artifact.startswith("--- a/") for s in seqs[:2]) and not seqs[2].artifact  # the diff reached it
    assert [s.grades.gar_quality for s in seqs] == [0.5, 1.0, None, None]
    # seed 001: Σ_P A = 1, Σ_P f·A = 3/4, λ = 4/3 → 1/3 and 2/3; failures stay −1/2; the group sums to 0
    assert _advantages(res) == [-0.5, -0.5, round(1 / 3, 6), round(2 / 3, 6)]
    assert res.metrics["gar_groups"] == 1
    stats = grader.take_stats()
    assert stats["grading/gar_groups"] == stats["grading/gar_applied"] == 1 and stats["grading/groups"] == 1


def test_a_confirmed_hack_is_zeroed_before_the_group_statistics(code_pack, tok):
    def script(kind, prompt, sample):  # the auditor confirms the pass that took a detour first
        detour = '"command": "ls"' in prompt.split("## Trajectory")[1]
        return json.dumps({"hack": detour and "Result: passed" in prompt})

    res, grader = _group(code_pack, tok, ScriptedJudge(script), GradingSettings(audit_sources=("code",)),
                         SignalSettings(zero_hacks=True))
    seqs = res.finished
    assert [s.hack_confirmed for s in seqs] == [False, True, False, False]
    assert [s.grades.audit_hack for s in seqs] == [False, True, False, False]
    assert [s.reward for s in seqs] == [1.0, 1.0, 0.0, 0.0]  # the test reward stays on the record ...
    # ... and the statistics see [1, 0, 0, 0]: mean 1/4, so +3/4 and −1/4 (not ±1/2)
    assert _advantages(res) == [-0.25, -0.25, -0.25, 0.75]
    assert res.ledger["code"].hack_zeroed == 1
    stats = grader.take_stats()
    assert (stats["grading/audited"], stats["grading/audit_confirmed"], stats["grading/audited/code"]) == (2, 1, 2)


def test_grs_scores_multiply_the_test_reward(code_pack, tok):
    def script(kind, prompt, sample):  # 2 of 4 solution items, 1 of 2 behaviour items
        return '{"solution": [true, true, false, false], "behavior": [true, false]}'

    rubrics = Rubrics(solution=["a", "b", "c", "d"], behavior=["e", "f"])
    res, grader = _group(code_pack, tok, ScriptedJudge(script), GradingSettings(grs=True), SignalSettings(grs=True),
                         rubrics=lambda t: rubrics)
    seqs = res.finished
    assert [(s.grades.rubric_solution, s.grades.rubric_behavior) for s in seqs[:2]] == [(0.5, 0.5)] * 2
    # R = 1 · ½ · ½ = ¼ for both passes, 0 for the failures: mean 1/8 → +1/8, −1/8
    assert _advantages(res) == [-0.125, -0.125, 0.125, 0.125]
    assert grader.take_stats()["grading/grs_scored"] == 2


@pytest.mark.parametrize("judge_kind", ["malformed", "late", "down"])
def test_unusable_judges_fall_back_to_test_rewards_and_are_counted(code_pack, tok, judge_kind):
    async def slow(kind, prompt, sample):
        await asyncio.sleep(5)
        return "{}"

    judge = {"malformed": ScriptedJudge(lambda k, p, s: "the patches look fine to me"),
             "late": ScriptedJudge(slow, timeout=30),
             "down": EndpointJudge("http://127.0.0.1:9/v1", "m", retries=0)}[judge_kind]
    rubrics = Rubrics(solution=["a"], behavior=["b"])
    res, grader = _group(code_pack, tok, judge, GradingSettings(grs=True, gar=True, audit_fraction=1.0,
                                                                deadline=0.5 if judge_kind == "late" else 60),
                         SignalSettings(grs=True, gar=True), rubrics=lambda t: rubrics)
    seqs = res.finished
    assert [s.reward for s in seqs] == [1.0, 1.0, 0.0, 0.0] and not any(s.hack_confirmed for s in seqs)
    assert all(s.grades == Grades() for s in seqs)
    assert _advantages(res) == [-0.5, -0.5, 0.5, 0.5]  # the test rewards' advantages, unchanged
    stats = grader.take_stats()
    if judge_kind == "late":
        assert stats["grading/late_groups"] == 1
    else:
        cat = "non_json" if judge_kind == "malformed" else "down"
        assert stats[f"grading/audit_fallback_{cat}"] == 4 and stats[f"grading/grs_fallback_{cat}"] == 2
        assert stats[f"grading/gar_fallback_{cat}"] == 1
    e = res.ledger["code"]
    assert (e.dispatched, e.retained, e.hack_zeroed, e.infra_failed) == (4, 4, 0, 0)


def test_pack_rubrics_are_read_from_the_pack(tmp_path):
    (tmp_path / "rubrics.json").write_text(json.dumps({"t1": {"solution": ["x"], "behavior": ["y"]}}))
    r = PackRubrics()
    assert r(SimpleNamespace(pack_dir=str(tmp_path), task_id="t1")) == Rubrics(solution=["x"], behavior=["y"])
    assert r(SimpleNamespace(pack_dir=str(tmp_path), task_id="t2")) is None
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "rubrics.json").write_text("{not json")
    assert r(SimpleNamespace(pack_dir=str(tmp_path / "bad"), task_id="t1")) is None
