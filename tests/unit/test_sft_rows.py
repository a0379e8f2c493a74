"""SFT rows: per-source passes over the demonstrations (a mixed run's ``sft_epochs``)."""

from rlonce.core.records import Context, Role, Segment, Sequence
from rlonce.recipes.sft import sft_rows


def _demo(tid: str, token: int) -> Sequence:
    ctx = Context([Segment(Role.PROMPT, [1, 2]), Segment(Role.MODEL, [token, token], [0.0, 0.0], [0, 0], "stop")])
    return Sequence(tid, "x", [ctx])


def test_per_source_passes_repeat_rows_by_the_common_factor():
    a, b = _demo("a", 7), _demo("b", 9)
    # 2 passes over a, 6 over b: g = 2 passes over [a, b, b, b] (4 rows), 8 row-passes in batches of 4
    rows, steps = sft_rows([a, b], [2, 6], 4)
    assert [r.token_ids[-1] for r in rows] == [7, 9, 9, 9] and steps == 2
    # equal counts: the rows once and that many passes, as with one ``sft.epochs``
    rows, steps = sft_rows([a, b], [5, 5], 4)
    assert [r.token_ids[-1] for r in rows] == [7, 9] and steps == 2  # 5 * 2 // 4
    rows, steps = sft_rows([a, b], [0, 3], 1)  # a source with 0 passes adds no rows
    assert [r.token_ids[-1] for r in rows] == [9] and steps == 3
    assert sft_rows([], [], 4) == ([], 0)
