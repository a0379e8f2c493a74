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
