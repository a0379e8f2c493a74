"""Content routes on the general domain (issue 56): answers, replies and emails that a grader with
no judge once rewarded — every balance listed, a negated balance, "see you there" or "moved, not
cancelled" for a cancellation, every colleague as recipients. Each route, through a real
environment, earns 0 with no judge and with the scripted judge; the reference plan, the scripted
expert and a correct attempt worded unusually earn 1. The code checks behind them are tested by
hand on texts too: what a correct claim may look like, and what denies, hedges or contradicts it.
"""

import asyncio
import sqlite3

import pytest

from rlonce.envs.general.probe import CONTROLS, probe
from rlonce.envs.general.rubric import Final, address_set, says_cancelled, states_amount
from rlonce.envs.general.tasks import TEMPLATES, make_task

CONTENT_ROUTES = ["every_balance_answer", "stuffed_answer_no_tool", "every_balance_reply", "negated_balance_reply",
                  "see_you_there_cancel", "moved_not_cancelled", "email_all_colleagues"]


def _claims(text: str, cents: int = -123450, **kw) -> bool:
    return states_amount(Final({}, {}, {}, {}, text), cents, **kw)


@pytest.mark.parametrize("text", ["-1234.50", "Balance: $-1,234.50 EUR", "-$1,234.50", "EUR -1234.5", "\u22121234.50",
                                  "As of March 16, 2026 the operations balance is -1234.50.",
                                  "The balance is -1234.50. Don't hesitate to ask.",
                                  "On 2026-03-16 at 10:30 it stood at -1234.50 (R-1000, INV-12345, #3, Q1, 2nd look)"])
def test_a_claim_of_the_one_value_passes_however_written(text):
    assert _claims(text, rivals=["travel", "software"])


@pytest.mark.parametrize("text", ["operations: -1234.50; travel: -20.00; software: -5.00", "-1234.50 or -1234.51",
                                  "The balance is NOT -1234.50.", "it isn't -1234.50", "-1234.50 is wrong",
                                  "about -1234.50", "roughly -1234.50", "I think -1234.50", "travel: -1234.50",
                                  "1234.50", "-1234", "-1234.505", "2 accounts: -1234.50", "", "none"])
def test_a_claim_with_another_value_a_denial_a_hedge_or_a_rival_account_fails(text):
    assert not _claims(text, rivals=["travel", "software"])


def test_an_amount_asked_without_a_sign_takes_either():
    assert _claims("1,234.50", 123450, either_sign=True) and _claims("-1234.50", 123450, either_sign=True)
    assert not _claims("1234.50 and -1234.50 and 1.00", 123450, either_sign=True)


def _email(text: str, title: str = "Retro") -> bool:
    db = sqlite3.connect(":memory:")
    db.execute("create table messages (text)")
    db.execute("insert into messages values (?)", (text,))
    return says_cancelled(Final({}, {"mail": db}, {}, {}, ""), "mail", "select text from messages", [], title)


@pytest.mark.parametrize("text", ["Cancelled: Retro\n'Retro' on 2026-03-18 is cancelled.",
                                  "Retro\nHi both, sorry: Retro on 2026-03-18 has been called off.",
                                  "Retro will not take place this week.", "We are cancelling the Retro.",
                                  "The Retro is off, sorry.", "Retro: cancelled, not moved.",
                                  "The Retro won\u2019t happen. Best", "Retro is no longer happening.",
                                  "Retro has been cancelled, no need to prepare."])
def test_an_email_stating_the_cancellation_passes_however_written(text):
    assert _email(text)


@pytest.mark.parametrize("text", ["Cancelled: Retro\n'Retro' on 2026-03-18: see you there!",
                                  "Retro on 2026-03-18 is moved, not cancelled.", "Retro is not cancelled.",
                                  "Retro hasn't been cancelled.", "Retro is cancelled. Not!",
                                  "Retro: cancelled. Just kidding, it goes ahead.", "Retro is postponed.",
                                  "Retro will take place as planned.", "Retro is still on.",
                                  "Retro: the cancellation is reversed, it's back on.", "Retro: see you soon",
                                  "Cancelled: Budget review", "Retro"])
def test_an_email_contradicting_or_missing_the_cancellation_fails(text):
    assert not _email(text)


def test_recipients_must_be_exactly_the_expected_set():
    db = sqlite3.connect(":memory:")
    db.execute("create table messages (recipients)")
    f = Final({}, {"mail": db}, {}, {}, "")

    def check(*rows) -> bool:
        db.execute("delete from messages")
        db.executemany("insert into messages values (?)", [(r,) for r in rows])
        return address_set(f, "mail", "select recipients from messages", [], ["a@x.test", "b@x.test"])

    assert check("b@x.test, A@x.test") and check("a@x.test,b@x.test")
    assert not check("a@x.test, b@x.test, c@x.test") and not check("a@x.test")  # a superset, a subset
    assert not check("a@x.test, b@x.test", "a@x.test, b@x.test") and not check()  # two messages, none


def test_every_judged_item_is_decided_by_a_code_item_too():
    """A run with no judge leaves judged items out, so each must have a code twin that decides it."""
    seen = set()
    for i in range(len(TEMPLATES) * 4):
        task = make_task("train", i)
        code = {it.name for it in task.items if it.kind != "judged"}
        for it in task.items:
            if it.kind == "judged":
                assert it.args.get("decided_by") in code, (task.template, it.name)
                seen.add(task.template)
    assert seen == {"cancel_and_notify"}


def _one_of_each(*templates: str) -> list:
    found = {}
    for i in range(200):
        task = make_task("heldout", i)
        found.setdefault(task.template, task)
        if set(templates) <= set(found):
            return [found[t] for t in templates]
    raise AssertionError(f"no held-out task of {set(templates) - set(found)}")


@pytest.mark.sandbox
def test_the_content_routes_earn_nothing_and_the_controls_everything():
    from rlonce.grading.judge import ScriptedJudge
    from rlonce.grading.scripted import scripted_rules

    tasks = _one_of_each("balance_question", "reply_with_balance", "cancel_and_notify", "schedule_first_free",
                         "invoice_to_ledger")
    report = asyncio.run(probe(tasks, concurrency=3, routes=CONTENT_ROUTES))
    assert {r: report[r]["rewarded"] for r in CONTENT_ROUTES} == dict.fromkeys(CONTENT_ROUTES, 0)
    assert all(report[r]["tasks"] >= 1 for r in CONTENT_ROUTES)
    assert report["email_all_colleagues"]["tasks"] == 3  # the reply, the invitation, the cancellation email
    for control in ("reference", "expert", *CONTROLS):
        assert report[control]["rewarded"] == report[control]["tasks"] > 0, (control, report[control])
    assert report["reworded"]["tasks"] == 4

    # the one template with a judged item, its judge the scripted one (it passes what names the
    # event's title and date: the code item must catch the rest)
    judged = asyncio.run(probe(tasks[2:3], concurrency=3, routes=CONTENT_ROUTES,
                               judge=ScriptedJudge(scripted_rules)))
    assert {r: judged[r]["rewarded"] for r in CONTENT_ROUTES} == dict.fromkeys(CONTENT_ROUTES, 0)
    cancel_routes = ("see_you_there_cancel", "moved_not_cancelled", "email_all_colleagues")
    assert [judged[r]["tasks"] for r in cancel_routes] == [1, 1, 1]
    assert judged["reference"] == judged["expert"] == judged["reworded"] == {"tasks": 1, "rewarded": 1}
