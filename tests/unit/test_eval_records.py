"""Per-attempt evaluation records and the paired before/after change, against hand-computed values."""

import json

import pytest

from rlonce.recipes.evaluate import keep_rows, paired_change, write_rows


def row(task, reward, passed, infra=False, arm="mini-bash"):
    return {"task_id": task, "arm": arm, "reward": reward, "passed": passed,
            "status": "infra" if infra else "submitted", "infra_failed": infra}


def test_paired_change_is_the_mean_difference_over_attempts_both_scored(tmp_path):
    before, after = tmp_path / "b.jsonl", tmp_path / "a.jsonl"
    write_rows(before, [row("t1", 0.2, False), row("t2", 0.5, True), row("t3", None, False, infra=True),
                        row("t4", 1.0, True)], source="s")
    write_rows(after, [row("t1", 0.4, True), row("t2", 0.5, True), row("t3", 1.0, True),
                       row("t4", None, False, infra=True), row("t5", 1.0, True)], source="s")
    ch = paired_change(before, after)
    # t3 and t4 are infrastructure failures on one side, t5 was not evaluated before: t1 and t2 remain.
    # reward differences 0.2 and 0.0: mean 0.1, sample variance 0.02, SE sqrt(0.02 / 2) = 0.1
    # pass differences 1 and 0: mean 0.5, sample variance 0.5, SE sqrt(0.5 / 2) = 0.5
    assert ch["attempts"] == 2
    assert ch["reward_change"] == pytest.approx(0.1) and ch["reward_change_se"] == pytest.approx(0.1)
    assert ch["passed_change"] == pytest.approx(0.5) and ch["passed_change_se"] == pytest.approx(0.5)


def test_paired_change_needs_both_files_and_a_common_attempt(tmp_path):
    a = tmp_path / "a.jsonl"
    write_rows(a, [row("t1", 1.0, True)], source="s")
    assert paired_change(a, tmp_path / "missing.jsonl") is None
    other = tmp_path / "o.jsonl"
    write_rows(other, [row("t1", 1.0, True, arm="mini-codex")], source="s")  # another arm: not the same attempt
    assert paired_change(a, other) is None


def test_paired_change_of_one_source_leaves_the_others_out(tmp_path):
    before, after = tmp_path / "b.jsonl", tmp_path / "a.jsonl"
    write_rows(before, [row("t1", 0.0, False), row("t2", 1.0, True)], source="s")
    with open(before, "a") as f:  # a second source's attempt at a task of the same id
        f.write(json.dumps({**row("t1", 1.0, True), "source": "u"}) + "\n")
    write_rows(after, [row("t1", 1.0, True), row("t2", 1.0, True)], source="s")
    with open(after, "a") as f:
        f.write(json.dumps({**row("t1", 0.0, False), "source": "u"}) + "\n")
    # s: pass differences 1 and 0 (mean 0.5, SE 0.5); u: -1 alone (SE 0); both: 1, 0, -1 (mean 0, SE sqrt(1/3))
    assert (paired_change(before, after, "s")["passed_change"], paired_change(before, after, "s")["attempts"]) == (
        pytest.approx(0.5), 2)
    u = paired_change(before, after, "u")
    assert (u["attempts"], u["passed_change"], u["passed_change_se"]) == (1, -1.0, 0.0)
    both = paired_change(before, after)
    assert both["attempts"] == 3 and both["passed_change"] == 0 and both["passed_change_se"] == pytest.approx(
        (1 / 3) ** 0.5)
    assert paired_change(before, after, "missing") is None


def test_trained_share_is_each_sources_part_of_the_retained_sequences():
    from rlonce.recipes.grpo import trained_by_source

    ledger = [{"step": 1, "source": "a", "dispatched": 12, "retained": 8, "no_contrast_filtered": 4},
              {"step": 1, "source": "b", "dispatched": 6, "retained": 0, "no_contrast_filtered": 6, "groups_short": 1},
              {"step": 2, "source": "a", "dispatched": 6, "retained": 6},
              {"step": 2, "source": "b", "dispatched": 6, "retained": 6}]
    metrics = [{"step": 0, "heldout_success": 0.5},
               {"step": 1, "reward_mean": 0.5, "src/a/retained_groups": 2.0, "src/b/retained_groups": 0.0},
               {"step": 2, "reward_mean": 0.5, "src/a/retained_groups": 1.0, "src/b/retained_groups": 1.0},
               {"step": 2, "final": True, "heldout_success": 0.5, "src/a/retained_groups": 9.0}]  # not a step
    t = trained_by_source(ledger, metrics, ["a", "b", "c"])
    assert t["a"] == {"sequences_dispatched": 18, "sequences_retained": 14, "sequences_no_contrast": 4,
                      "sequences_all_passed": 0, "groups_short": 0, "groups_retained": 3,
                      "trained_share": 0.7}  # 14 of 20
    assert t["b"]["trained_share"] == 0.3 and t["b"]["groups_short"] == 1 and t["b"]["sequences_no_contrast"] == 6
    assert t["b"]["groups_retained"] == 1
    assert t["c"] == {"sequences_dispatched": 0, "sequences_retained": 0, "sequences_no_contrast": 0,
                      "sequences_all_passed": 0, "groups_short": 0, "groups_retained": 0, "trained_share": 0.0}
    one = trained_by_source(ledger[:1], [{"step": 1, "reward_mean": 0.2, "groups_taken": 2.0}], ["a"])
    assert one["a"]["groups_retained"] == 2  # a one-source run counts its groups_taken


def test_keep_rows_moves_each_sources_rows_into_one_file(tmp_path):
    per_source = {"toolfind": {"success": 1.0, "rows": [row("t1", 1.0, True)]},
                  "arith": {"success": 0.0, "rows": [row("a1", 0.0, False, arm="single-turn")]}}
    path = keep_rows(tmp_path, "baseline eval", per_source)
    assert path == tmp_path / "eval" / "baseline.jsonl"
    assert [json.loads(x)["source"] for x in path.read_text().splitlines()] == ["toolfind", "arith"]
    assert all("rows" not in v for v in per_source.values())  # the run state never carries them
    assert keep_rows(tmp_path, "eval 10", {"s": {"rows": []}}).name == "eval-10.jsonl"
