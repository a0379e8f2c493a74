"""Judge-checked rubric items of the general domain, through the real services: the verdict is the
judge's first answer, a repeat and a second judge measure agreement, a disagreement is counted
ambiguous, and an unanswerable or absent judge leaves the item out (never a 0)."""

import asyncio
import json

import pytest

from rlonce.core.records import Sequence
from rlonce.envs.general.env import GeneralEnv
from rlonce.envs.general.judged import quoted_terms
from rlonce.envs.general.tasks import make_task
from rlonce.grading.judge import ScriptedJudge
from rlonce.grading.scripted import scripted_rules

pytestmark = pytest.mark.sandbox


def _task(template: str):
    return next(t for t in (make_task("heldout", i) for i in range(200)) if t.template == template)


async def _run(task, plan, **kw):
    env = GeneralEnv(task, **kw)
    await env.setup()
    try:
        for name, args in plan:
            await env.call_tool(name, dict(args))
        grade = await env.grade(Sequence(task.task_id, "x", answer=task.answer))
        return grade, env.metrics
    finally:
        await env.cleanup()


def _with_body(plan, body: str):
    return [(n, {**a, "body": body}) if n == "mail__send_message" else (n, a) for n, a in plan]


def test_the_judge_checks_the_emails_wording_and_agreement_is_measured(tmp_path):
    task = _task("cancel_and_notify")
    (item,) = [it for it in task.items if it.kind == "judged"]
    title = quoted_terms(item.args["criterion"])[0]
    judge = ScriptedJudge(scripted_rules, record=tmp_path / "calls.jsonl")
    contrary = ScriptedJudge(lambda kind, prompt, sample: json.dumps({"passed": False, "reason": "strict"}))

    good, m = asyncio.run(_run(task, task.plan, judge=judge, agreement=contrary))
    assert good.passed and good.reward == 1.0
    assert m["grade/judged_repeat_agree"] == 1.0 and m["grade/judged_cross_agree"] == 0.0
    assert m["grade/judged_ambiguous"] == 1.0  # the second judge disagreed: the item is flagged, not rescored
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert [c["kind"] for c in calls] == ["general_item", "general_item"] and title in calls[0]["prompt"]

    # the subject still says "Cancelled: <title>" and the body names nothing contrary: every code item
    # passes; the scripted judge misses the date, a model judge would ask what "next week" means
    vague, m = asyncio.run(_run(task, _with_body(task.plan, "See you next week."), judge=judge))
    assert not vague.passed and vague.reward == 0.0
    assert m["item_state_passed"] == 1.0 and m["item_judged_passed"] == 0.0
    assert "pass [state] email says it is cancelled" in vague.transcript
    assert "FAIL [judged] a judge reads it as cancelled" in vague.transcript


def test_an_unanswering_or_absent_judge_leaves_the_item_out():
    task = _task("cancel_and_notify")
    broken = ScriptedJudge(lambda kind, prompt, sample: "no idea", retries=0)
    g, m = asyncio.run(_run(task, _with_body(task.plan, "Moved to Friday."), judge=broken))
    # the body takes the cancellation back: the code item fails on its own; the judged item is left out
    assert m["grade/judged_failed"] == 1.0 and "left out [judged] a judge reads it as cancelled" in g.transcript
    assert not g.passed and "FAIL [state] email says it is cancelled" in g.transcript
    g, m = asyncio.run(_run(task, task.plan))
    assert g.passed and m["grade/judged_skipped"] == 1.0
