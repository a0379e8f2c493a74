"""Every mutation operator on hand-written source: one minimal span, the rest untouched."""

import ast

import pytest

from rlonce.envs.code.mutate import OPERATORS, find_mutations

SRC = b'''"""Docstring with 1 + 2 inside."""


def f(a, b=3, flag=True):
    # a comment that must survive
    if a < b and flag:
        return a + b
    return g(a, b) * 2
'''


def test_each_operator_edits_one_span():
    ms = find_mutations("m.py", SRC)
    found = {(m.operator, m.original, m.replacement) for m in ms}
    assert ("compare", "<", "<=") in found
    assert ("bool_op", "and", "or") in found
    assert ("binop", "+", "-") in found and ("binop", "*", "//") in found
    assert ("swap_args", "a, b", "b, a") in found
    assert ("drop_branch", "a < b and flag", "False") in found
    assert ("return_none", "a + b", "None") in found
    assert ("wrong_default", "True", "False") in found
    assert sum(1 for m in ms if (m.original, m.replacement) == ("3", "4")) == 1  # one edit, however it is named
    assert ("off_by_one", "2", "3") in found
    assert not any("Docstring" in m.original for m in ms)  # the docstring is never mutated
    assert {m.operator for m in ms} == set(OPERATORS)
    for m in ms:
        out = m.apply(SRC)
        ast.parse(out)
        assert b"# a comment that must survive" in out
        rep = m.replacement.encode()
        assert out[:m.start] == SRC[:m.start] and out[m.start + len(rep):] == SRC[m.end:]
    assert [m.function for m in ms if m.operator == "compare"] == ["f"]


def test_deterministic_and_guarded():
    assert find_mutations("m.py", SRC) == find_mutations("m.py", SRC)
    m = next(m for m in find_mutations("m.py", SRC) if m.operator == "compare")
    with pytest.raises(ValueError, match="mutation site changed"):
        m.apply(SRC.replace(b"a < b", b"a > b"))


def test_reference_fix_minimal_and_whole_lines():
    """The expert's fix: the fewest whole words that occur once in the buggy file, or whole lines."""
    from rlonce.envs.code.routes import reference_fix_calls
    from rlonce.envs.code.tasks import CodeTask

    expected = {  # (operator, original) -> minimal (old_str, new_str), worked out by hand on SRC
        ("compare", "<"): ("<=", "<"),  # '<=' occurs once in the buggy file
        ("binop", "+"): ("-", "+"),
        ("swap_args", "a, b"): ("b, a", "a, b"),
        ("return_none", "a + b"): ("None", "a + b"),
        ("wrong_default", "True"): ("False", "True"),
        ("off_by_one", "2"): (" 3", " 2"),  # '3' also occurs in 'b=3': one character more makes it unique
        ("drop_branch", "a < b and flag"): ("False", "a < b and flag"),
    }
    for m in find_mutations("m.py", SRC):
        if (m.operator, m.original) not in expected:
            continue
        task = CodeTask("t", "pkg", "1", m.to_dict(), "", [], [], {})
        buggy = m.apply(SRC).decode()
        ((_, small),) = reference_fix_calls(task, buggy, whole_lines=False)
        ((_, whole),) = reference_fix_calls(task, buggy)
        assert (small["old_str"], small["new_str"]) == expected[m.operator, m.original], m
        for a in (small, whole):
            assert buggy.count(a["old_str"]) == 1 and buggy.replace(a["old_str"], a["new_str"]) == SRC.decode()
        assert whole["old_str"].endswith("\n") and buggy.count("\n" + whole["old_str"]) == 1
    m = next(m for m in find_mutations("m.py", SRC) if m.operator == "off_by_one" and m.original == "2")
    ((_, whole),) = reference_fix_calls(CodeTask("t", "pkg", "1", m.to_dict(), "", [], [], {}), m.apply(SRC).decode())
    assert (whole["old_str"], whole["new_str"]) == ("    return g(a, b) * 3\n", "    return g(a, b) * 2\n")
