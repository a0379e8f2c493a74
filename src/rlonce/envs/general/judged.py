"""Judge-checked rubric items: open-ended content (an email's wording) asked of a model judge.

Seed 000: "code-based checks for deterministic properties …, LLM-based checks for open-ended
content, with agreement across repeated judgments and across judge models identifying ambiguity."

A ``judged`` item names the text to judge (SQL over the final databases: e.g. the body of the
email the agent sent) and a yes/no criterion. The run's judge (``[grading.judge]``) is asked twice
— the first answer is the verdict, the second an independent draw (``sample`` 1; give the judge a
temperature above 0) — and the agreement judge (``[grading.agreement_judge]``), when one is set,
once. The item's verdict is the first answer; ``repeat_agree`` and ``cross_agree`` record whether
the others said the same, and an item where any answer differs is counted ``ambiguous``: the
signal for reviewing the criterion, as the seed describes, not a change of reward.

An item whose text is missing (the agent sent no email) fails. An item the judge could not answer
(down, unparseable) is left out of the reward and counted — never scored 0 — and so is every
judged item when no judge is configured (``grading.judge.kind = "none"``). That is safe only
because no judged item stands alone: each names in ``decided_by`` the code-checked item that
decides the same question without a judge (``rubric.says_cancelled`` for a cancellation email),
so a run with no judge loses the model's reading of the wording, never the check itself. A
template whose content a code check cannot decide must not be offered to a run without a judge.

``rlonce.envs`` sits below ``rlonce.grading``: this module asks a ``rlonce.envs.base.JudgeBinding``
(``rlonce.grading.judge.Judge`` is one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from rlonce.envs.base import JudgeBinding
from rlonce.envs.general.rubric import Final, Item

KIND = "general_item"
MAX_TEXT = 4000


class ItemVerdict(BaseModel):
    model_config = ConfigDict(extra="ignore")
    passed: bool
    reason: str = ""


def item_prompt(criterion: str, text: str) -> str:
    return (f"## Criterion\n{criterion}\n\n## Text\n{text[:MAX_TEXT]}\n\nDoes the text meet the criterion? Judge only "
            'what the text says. Answer: {"passed": true or false, "reason": "..."}')


def judged_text(final: Final, service: str, sql: str, params: list) -> str | None:
    """The rows ``sql`` selects from the final database, joined (None when it selects none)."""
    rows = final.final[service].execute(sql, params).fetchall()
    return "\n".join(str(c) for r in rows for c in r) if rows else None


def quoted_terms(criterion: str) -> list[str]:
    """The 'single-quoted' phrases of a criterion (what the scripted judge looks for)."""
    return re.findall(r"'([^']+)'", criterion)


def scripted_item(prompt: str) -> dict:
    """The scripted judge's rule: passed when the text holds every quoted phrase of the criterion."""
    criterion = prompt.split("## Criterion\n", 1)[1].split("\n\n## Text\n", 1)[0]
    text = prompt.split("\n\n## Text\n", 1)[1].rsplit("\n\nDoes the text meet", 1)[0].lower()
    missing = [t for t in quoted_terms(criterion) if t.lower() not in text]
    return {"passed": not missing, "reason": f"missing {missing}" if missing else "every quoted phrase is there"}


@dataclass
class Judged:
    verdicts: dict[str, bool] = field(default_factory=dict)
    """Items with a verdict (left-out items are absent)."""
    metrics: dict[str, float] = field(default_factory=dict)


async def judge_items(items: list[Item], texts: dict[str, str | None], judge: JudgeBinding | None,
                      agreement: JudgeBinding | None = None) -> Judged:
    """Verdicts for the ``judged`` items, given each one's text (``texts`` by item name)."""
    out = Judged()
    m = out.metrics
    for it in items:
        text = texts.get(it.name)
        if text is None:
            out.verdicts[it.name] = False
            continue
        if judge is None:
            m["judged_skipped"] = m.get("judged_skipped", 0.0) + 1
            continue
        prompt = item_prompt(it.args["criterion"], text)
        first = await judge.ask(prompt, ItemVerdict, kind=KIND, sample=0)
        if not first.ok:
            m["judged_failed"] = m.get("judged_failed", 0.0) + 1
            continue
        out.verdicts[it.name] = first.value.passed
        answers = [first.value.passed]
        again = await judge.ask(prompt, ItemVerdict, kind=KIND, sample=1)
        if again.ok:
            m["judged_repeat_agree"] = m.get("judged_repeat_agree", 0.0) + float(again.value.passed == answers[0])
            m["judged_repeated"] = m.get("judged_repeated", 0.0) + 1
            answers.append(again.value.passed)
        if agreement is not None:
            other = await agreement.ask(prompt, ItemVerdict, kind=KIND, sample=0)
            if other.ok:
                m["judged_cross_agree"] = m.get("judged_cross_agree", 0.0) + float(other.value.passed == answers[0])
                m["judged_crossed"] = m.get("judged_crossed", 0.0) + 1
                answers.append(other.value.passed)
        m["judged_ambiguous"] = m.get("judged_ambiguous", 0.0) + float(len(set(answers)) > 1)
    return out
