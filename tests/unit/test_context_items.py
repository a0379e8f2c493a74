"""The context domain's atomic checks on hand-written replies, its reward modes, and its generated
tasks: deterministic, split apart, sized to their tier, answerable from their context only."""

import json
import random
import re
from pathlib import Path

import pytest

from rlonce.config import ConfigError, load_config
from rlonce.envs.context import items as I
from rlonce.envs.context.env import grade_reply
from rlonce.envs.context.expert import expert_turns, write
from rlonce.envs.context.items import Item
from rlonce.envs.context.record import LENGTHS, ContextTask, Rule
from rlonce.envs.context.tasks import FAMILIES, make_task
from rlonce.model.chat import get_format

EMBEDDED_TOKENIZER = Path(__file__).resolve().parents[2] / "src" / "rlonce" / "model" / "embedded" / "tokenizer.json"


def test_a_value_is_found_as_a_whole_token_with_case_and_spaces_ignored():
    assert I.holds("Your gate is C34.", "C34") and I.holds("your   GATE is\nc34", "c34")
    assert not I.holds("Your gate is C341.", "C34") and not I.holds("gate XC34", "C34")
    assert not I.holds("1431", "31") and I.holds("it is 31.", "31") and I.holds("(31)", "31")
    assert I.holds("capital: Rio de Janeiro", "Rio  de janeiro") and not I.holds("anything", "")
    assert I.lacks("Lyon [P3]", ["Paris", "Marseille"]) and not I.lacks("Lyon, not Paris", ["Paris"])
    assert I.lacks("nothing here", [])


def test_identifiers_citations_and_json():
    assert I.only_ids("Shipment SH-1187 holds 14.", r"\bSH-\d{4}\b", ["SH-1187"])
    assert I.only_ids("sh-1187: 14", r"\bSH-\d{4}\b", ["SH-1187"])  # case ignored
    assert not I.only_ids("SH-1187 or SH-2044", r"\bSH-\d{4}\b", ["SH-1187"])
    assert I.cites("[P3] Lyon", 3) and I.cites("Lyon [ p3 ].", 3) and I.cites("Lyon [P3] [P3]", 3)
    assert not I.cites("Lyon [P3][P4]", 3) and not I.cites("Lyon P3", 3) and not I.cites("Lyon [P13]", 3)
    fenced = '```json\n{\n  "name": "Fennick",\n  "gate": "C34"\n}\n```'
    assert I.json_keys(fenced, ["gate", "name"]) and I.json_value(fenced, "gate", "c34")
    assert I.json_value('{"name": "x", "room_number": 2417}', "room_number", "2417")
    assert not I.json_value('{"gate": true}', "gate", "True") and not I.json_value('{"gate": ["C34"]}', "gate", "C34")
    assert not I.json_keys('{"name": "x", "gate": "C34", "extra": 1}', ["name", "gate"])
    assert not I.json_keys('The answer: {"name": "x", "gate": "C34"}', ["name", "gate"])
    assert I.json_object("[" * 100_000 + "]" * 100_000) is None  # too deep for the parser: not JSON, no error
    assert I.json_object('["a list"]') is None and I.json_object("```") is None


def test_bullets_words_case_forbidden_words_and_the_ends():
    assert I.bullets("- Name: Fennick\n* Gate: C34\n\n•  Source: notes", 3)
    assert not I.bullets("- Name: Fennick\n- Gate: C34\nThat is all.", 2)  # a line that is no bullet
    assert not I.bullets("- a\n- b", 3) and not I.bullets("-\n- b", 2) and not I.bullets("", 0)
    assert I.max_words("Fennick: C34.", 2) and not I.max_words("Fennick's gate is C34.", 3) and not I.max_words(" ", 5)
    assert I.upper("FENNICK'S GATE IS C34.") and not I.upper("FENNICK's gate") and not I.upper("1234.")
    assert I.lower("fennick: c34.") and not I.lower("Fennick: c34.")
    assert I.no_words("My roommate: C34.", ["room"]) and not I.no_words("Room: C34.", ["room"])
    assert not I.no_words("Sure, C34.", ["please", "sure"])
    assert I.starts_with("  memo:   Fennick: C34.", "Memo:") and not I.starts_with("Fennick. Memo:", "Memo:")
    assert I.ends_with("C34.\nRegards,  Tamsin.", "Regards, Tamsin")
    assert not I.ends_with("Regards, Tamsin. Bye", "Regards, Tamsin")
    assert I.negated("FENNICK", "lower", {}) and not I.negated("fennick", "lower", {})


def _task(items, rules=()) -> ContextTask:
    return ContextTask("context-test-0", "rules", "test", "sys", "prompt", "C34", "Fennick's gate is {}.",
                       "Fennick: {}.", tuple(items), tuple(rules))


def test_the_reward_is_all_items_by_default_or_their_mean_and_passed_is_explicit():
    task = _task([Item("holds C34", "holds", {"value": "C34"}),
                  Item("at most 3 words", "max_words", {"n": 3}),
                  Item("not C20", "lacks", {"values": ["C20"]}, "negative")])
    right = grade_reply(task, "Fennick: C34.")
    assert (right.reward, right.passed) == (1.0, True)
    long = grade_reply(task, "Fennick's gate is C34.")  # 2 of 3 items
    assert (long.reward, long.passed) == (0.0, False)
    mean = grade_reply(task, "Fennick's gate is C34.", "mean")
    assert mean.reward == pytest.approx(2 / 3) and not mean.passed
    assert mean.transcript.splitlines() == ["rules/test: reply of 22 characters", "pass holds C34",
                                            "FAIL at most 3 words", "pass not C20"]
    empty = grade_reply(task, "", "mean")  # only the negative item passes
    assert empty.reward == pytest.approx(1 / 3) and not empty.passed
    none = grade_reply(task, None, "mean")
    assert (none.reward, none.passed) == (0.0, False) and none.transcript.startswith("rules/test: no reply")
    metrics = {}
    grade_reply(task, "Fennick: C34.", metrics=metrics)
    assert metrics == {"items_passed": 3.0, "items": 3.0}


def test_the_writer_obeys_each_rule():
    json_rule = Rule("json", "", ("name", "Fennick", "gate"))
    assert write(_task([], [json_rule]), "C34") == '{"name": "Fennick", "gate": "C34"}'
    bullets = Rule("bullets", "", ("Name: Fennick", "Gate: {}", "Source: the notes above"))
    assert write(_task([], [bullets, Rule("upper", "")]), "C34") == \
        "- NAME: FENNICK\n- GATE: C34\n- SOURCE: THE NOTES ABOVE"
    both = [Rule("max_words", "", 8), Rule("prefix", "", "Memo:")]
    assert write(_task([], both), "C34") == "Memo: Fennick: C34."
    signoff = Rule("signoff", "", "Regards, Tamsin")
    assert write(_task([], [signoff]), "C34") == "Fennick's gate is C34.\nRegards, Tamsin"
    assert write(_task([], [Rule("lower", "")]), "C34") == "fennick's gate is c34."
    assert write(_task([], [Rule("forbid", "", ("gate", "sure"))]), "C34") == "Fennick: C34."
    turns = expert_turns(_task([], [json_rule]), random.Random(0), get_format("hermes"), translate=None, detour_p=0.5,
                         max_detours=2, single_turn=True)
    assert turns == ['{"name": "Fennick", "gate": "C34"}<|im_end|>']


def test_tasks_are_pure_functions_of_split_and_index_and_the_splits_differ():
    assert make_task("heldout", 5) == make_task("heldout", 5)
    prompts = {split: {make_task(split, i).prompt for i in range(300)} for split in ("sft", "train", "heldout")}
    assert all(len(p) == 300 for p in prompts.values())
    assert not prompts["heldout"] & (prompts["train"] | prompts["sft"]) and not prompts["train"] & prompts["sft"]
    assert [make_task("train", i).family for i in range(8)] == [*FAMILIES, *FAMILIES]
    assert {make_task("train", i, ("listing",)).family for i in range(8)} == {"listing"}
    assert make_task("heldout", 3).task_id == "context-heldout-3" and make_task("heldout", 3).source == "context"


@pytest.mark.parametrize("length", ["short", "medium"])
def test_every_task_fits_its_tier_and_its_expert_passes_every_item(length):
    for i in range(120):
        task = make_task("heldout", i, length=length)
        size = len(task.system) + len(task.prompt)
        assert LENGTHS[length] * 0.8 < size <= LENGTHS[length], (task.task_id, size)
        grade = grade_reply(task, write(task, task.answer))
        assert grade.passed and grade.reward == 1.0, grade.transcript


def test_the_short_tier_fits_the_embedded_model_context():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(EMBEDDED_TOKENIZER))
    longest = max(len(tok.encode(t.system).ids) + len(tok.encode(t.prompt).ids)
                  for t in (make_task("heldout", i) for i in range(80)))
    assert longest <= 1024 - 64 - 40  # a 64-token reply and the chat template's markers still fit


def _of(family: str, kind: str | None = None, length: str = "short") -> ContextTask:
    return next(t for i in range(400) if (t := make_task("heldout", i, (family,), length)).kind == kind or kind is None)


def test_a_document_task_alters_the_real_fact_and_its_citation_points_at_it():
    task = _of("document", "capital")
    passages = dict(re.findall(r"^\[P(\d+)\] (.*)$", task.prompt, flags=re.M))
    cited = int(re.search(r"\[P(\d+)\]", task.sentence).group(1))
    assert task.answer in passages[str(cited)] and task.memory not in task.prompt
    assert task.answer != task.memory and task.distractor != task.answer and task.decoy not in task.prompt
    country = re.search(r"capital of (.+?)\?", task.prompt).group(1)
    from rlonce.envs.context.vocab import CAPITALS

    assert CAPITALS[country][0] == task.memory and task.answer in CAPITALS[country][1]
    memory = grade_reply(task, write(task, task.memory))
    assert not memory.passed and "FAIL does not give the real-world answer" in memory.transcript


def test_a_retention_task_quotes_a_numbered_conversation_with_the_value_first_and_the_question_last():
    for kind in ("other_owner", "correction"):
        task = _of("retention", kind)
        numbers = [int(n) for n in re.findall(r"^\[turn (\d+)\]", task.prompt, flags=re.M)]
        assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 6
        first = re.search(r"\[turn 1\] user: .* it is (\S+)\.", task.prompt).group(1)
        assert first == (task.answer if kind == "other_owner" else task.distractor)
        assert task.prompt.rstrip().endswith("?") and "[turn 3]" in task.prompt and task.distractor in task.prompt


def test_a_listing_task_asks_one_line_of_a_long_tool_output():
    task = _of("listing", "qty")
    asked = re.search(r"SH-\d{4}", task.prompt.rsplit("The user's new message:", 1)[1]).group(0)
    lines = [line for line in task.prompt.splitlines() if line.startswith("SH-")]
    mine = [line for line in lines if line.startswith(asked)]
    assert len(lines) >= 10 and len(mine) == 1 and mine[0].split()[-3] == task.answer
    assert sum(line.split()[-3] == task.answer for line in lines) == 1  # the asked quantity is on one line only


def test_a_changed_rule_is_stated_first_then_replaced_and_the_latest_one_is_graded():
    task = _of("rules", "change_prefix")
    (first,), (latest,) = task.first_rules, task.rules
    assert f'"{first.arg}"' in task.system and f'"{latest.arg}"' not in task.system
    assert f'From now on, begin every reply with "{latest.arg}" instead of "{first.arg}".' in task.prompt
    assert write(task, task.answer).startswith(latest.arg)
    stale = grade_reply(task, write(task, task.answer, task.first_rules))
    assert not stale.passed and f"FAIL does not use the superseded prefix {first.arg!r}" in stale.transcript
    case = _of("rules", "change_upper_to_lower")
    assert case.system.endswith("- Write in UPPER case only.") and write(case, case.answer).islower()


def test_the_options_are_checked_like_every_table():
    cfg = load_config(None, ["task.name=context", "task.context_families=[listing]", "task.context_length=medium",
                             "harness.arms=[single-turn]"])
    assert cfg.task.context_families == ["listing"] and cfg.task.context_reward == "all"
    with pytest.raises(ConfigError, match="context_length"):
        load_config(None, ["task.name=context", "task.context_length=huge"])
    with pytest.raises(ConfigError, match="context_famlies"):
        load_config(None, ["task.name=context", "task.context_famlies=[rules]"])


def test_task_items_are_plain_data():
    task = make_task("train", 1)
    assert json.loads(json.dumps([i.args for i in task.items]))  # no sets or objects: picklable, printable
