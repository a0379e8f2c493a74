"""Difficulty tiers of the seed domains (issue 58): each tier setting draws only the tasks it names,
held-out tasks stay on their own worlds, and a wrong setting is a one-line error."""

import pytest

from rlonce import config as C
from rlonce.config import ConfigError, load_config
from rlonce.envs.domains import domain_for
from rlonce.envs.general.tasks import SINGLE_SERVICE, TEMPLATES


def test_general_templates_draw_only_the_named_templates_in_turn():
    d = domain_for(C.TaskConfig(name="general", general_templates=list(SINGLE_SERVICE)))
    tasks = [d.task("heldout", i) for i in range(6)]
    assert [t.template for t in tasks] == ["balance_question", "resolve_with_comment"] * 3
    assert all(len(t.services) == 1 for t in tasks)
    # the same index keeps its world: a tier changes the template drawn, not the held-out seeds
    full = domain_for(C.TaskConfig(name="general"))
    assert [t.seed for t in tasks] == [full.task("heldout", i).seed for i in range(6)]
    assert {t.seed for t in tasks}.isdisjoint({d.task("train", i).seed for i in range(64)})


def test_general_default_draws_all_eight_templates():
    d = domain_for(C.TaskConfig(name="general"))
    assert [d.task("train", i).template for i in range(8)] == list(TEMPLATES)


def test_single_service_names_exactly_the_templates_with_one_service():
    d = domain_for(C.TaskConfig(name="general"))
    one = {t.template for t in (d.task("train", i) for i in range(8)) if len(t.services) == 1}
    assert one == set(SINGLE_SERVICE)


@pytest.mark.parametrize("names, says", [(["balance_question", "nope"], "unknown general template(s) nope"),
                                         (["balance_question", "balance_question"], "names a template twice")])
def test_a_wrong_general_template_list_is_one_line(names, says):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["task.name=general", f"task.general_templates={names!r}".replace("'", '"')])
    assert says in str(e.value) and "\n" not in str(e.value)


CODE = b'''def short(a, b):
    return a + b


class K:
    def long(self, x):
        y = x * 2
        if y > 3:
            y = y - 1
        return y < 10
'''


def test_code_function_lengths_by_hand():
    from rlonce.envs.code.mutate import function_lengths

    assert function_lengths(CODE) == {"short": 2, "K.long": 5}


def test_code_tier_keeps_the_named_operators_in_short_functions():
    from rlonce.envs.code.mutate import find_mutations, function_lengths, in_tier

    ms, lengths = find_mutations("m.py", CODE), function_lengths(CODE)
    easy = [m for m in ms if in_tier(m, lengths, ("binop", "compare"), 3)]
    assert {(m.function, m.operator, m.original) for m in easy} == {("short", "binop", "+")}
    every_op_short = {m.function for m in ms if in_tier(m, lengths, None, 3)}
    assert every_op_short == {"short"}
    assert [m for m in ms if in_tier(m, lengths, None, None)] == ms  # the full tier: every site
    ops = {m.operator for m in ms if in_tier(m, lengths, ("compare",), None)}
    assert ops == {"compare"}


def test_code_problem_statement_quotes_as_many_message_lines_as_its_tier_says():
    from rlonce.envs.code.build import problem_statement
    from rlonce.envs.code.mutate import find_mutations
    from rlonce.envs.code.packages import PACKAGES

    m = find_mutations("src/pkg/m.py", CODE)[0]
    failures = {"tests/test_m.py::test_short": {"message": "assert 1 == 3\n +  where 1 = short(2, 1)\nthird"}}
    one = problem_statement(PACKAGES["toolz"], m, failures)
    two = problem_statement(PACKAGES["toolz"], m, failures, message_lines=2)
    assert "    assert 1 == 3\n\nFind" in one and "where 1" not in one
    assert "    assert 1 == 3\n     +  where 1 = short(2, 1)\n\nFind" in two and "third" not in two


def test_code_build_settings_refuse_an_unknown_operator():
    from pydantic import ValidationError

    from rlonce.envs.code import BuildSettings

    assert BuildSettings(operators="binop,compare").operators == "binop,compare"
    with pytest.raises(ValidationError, match="unknown operator.*nope.*operators: binop"):
        BuildSettings(operators="binop,nope")
