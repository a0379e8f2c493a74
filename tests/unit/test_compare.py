"""``rlonce compare BEFORE AFTER``: the paired held-out change per source between two evaluations of
the same tasks, by hand, and one-line errors for files that are not evaluations."""

import json

import pytest

from rlonce.cli import main
from rlonce.config import ConfigError
from rlonce.recipes.evaluate import compare


def write(path, rows):
    path.write_text("".join(json.dumps({"arm": "a", "reward": float(p), "infra_failed": infra, "passed": bool(p),
                                        "source": src, "task_id": t}) + "\n" for src, t, p, infra in rows))


def test_compare_pairs_each_source_on_the_attempts_both_scored(tmp_path, capsys):
    before, after = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    write(before, [("x", "t0", 0, False), ("x", "t1", 0, False), ("x", "t2", 1, False), ("x", "t3", 0, True),
                   ("y", "t0", 1, False), ("y", "t1", 1, False)])
    write(after, [("x", "t0", 1, False), ("x", "t1", 1, False), ("x", "t2", 1, False), ("x", "t3", 1, False),
                  ("y", "t0", 0, False), ("y", "t1", 1, False)])
    rows = {r["source"]: r for r in compare(before, after)}
    # x: t3 failed in the infrastructure before: three pairs, differences 1, 1, 0 -> +0.667, sd 0.577, SE 0.333
    x = rows["x"]
    assert (x["attempts"], x["before"], x["after"]) == (3, pytest.approx(1 / 3), 1.0)
    assert (x["passed_change"], x["passed_change_se"]) == pytest.approx((2 / 3, 1 / 3))
    # y: differences -1, 0 -> -0.5, sd 0.707, SE 0.5; all: 1, 1, 0, -1, 0 -> +0.2, SE 0.374
    assert (rows["y"]["passed_change"], rows["y"]["passed_change_se"]) == pytest.approx((-0.5, 0.5))
    assert (rows["all"]["attempts"], rows["all"]["passed_change"]) == (5, pytest.approx(0.2))
    assert rows["all"]["passed_change_se"] == pytest.approx(0.83666 / 5 ** 0.5, abs=1e-4)
    assert main(["compare", str(before), str(after)]) == 0
    out = capsys.readouterr().out
    assert "x                       3   0.333   1.000  +0.667 ± 0.333" in out and "(≥ 2 SE)" not in out.split("\n")[1]


def test_compare_refuses_what_is_not_two_evaluations_of_the_same_tasks(tmp_path, capsys):
    good, other = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write(good, [("x", "t0", 1, False)])
    write(other, [("x", "t9", 1, False)])
    with pytest.raises(ConfigError, match="share no scored attempt"):
        compare(good, other)
    (tmp_path / "bad.jsonl").write_text('{"task_id": "t0"}\n')
    for bad in (tmp_path / "bad.jsonl", tmp_path / "missing.jsonl"):
        assert main(["compare", str(bad), str(good)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("rlonce: error: ") and "is not an evaluation's attempts" in err and "\n" not in err
