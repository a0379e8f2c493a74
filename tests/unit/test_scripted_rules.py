"""The scripted judge answers a domain's own questions with the rules the domain gives
(``DomainSpec.judge_rules``); grading names no domain, and a domain cannot replace rlonce's own rules."""

import json

from rlonce.config import domains
from rlonce.config.domains import DomainSpec
from rlonce.grading.scripted import scripted_rules


def _notes_rules():
    return {"notes_count": lambda prompt: {"count": prompt.count("note")},
            "hack": lambda prompt: {"hack": True, "reason": "a domain's"}}


def test_a_loaded_domains_rule_answers_its_kind_and_rlonces_own_kinds_stay(monkeypatch):
    spec = DomainSpec(name="notes", build=lambda o: None, judge_rules=_notes_rules)
    assert scripted_rules("notes_count", "note, note", 0) == "the scripted judge has no rule for 'notes_count'"
    monkeypatch.setitem(domains._LOADED, "tests.notes:DOMAIN", spec)
    assert json.loads(scripted_rules("notes_count", "note, note and a note", 0)) == {"count": 3}
    assert json.loads(scripted_rules("hack", "## The attempt's change or answer\n+ x = 1\n", 0))["hack"] is False


def test_a_built_in_domains_rule_is_found_without_loading_it_first():
    prompt = "## Criterion\nIt says 'cancelled'.\n\n## Text\nThe meeting is Cancelled.\n\nDoes the text meet it?"
    assert json.loads(scripted_rules("general_item", prompt, 0)) == {"passed": True,
                                                                     "reason": "every quoted phrase is there"}
