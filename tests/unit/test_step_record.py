"""The per-step metrics record, against hand-computed values."""

from collections import Counter

import pytest

from rlonce.core.ledger import LedgerEntry
from rlonce.core.records import FailureCategory, Sequence, Status
from rlonce.telemetry.step import StepInputs, step_record


def test_step_record_by_hand():
    a = Sequence("t", "mini-bash", reward=1.0, passed=True, turns=2,
                 metrics={"model_tokens": 30.0, "versions_spanned": 2.0, "prompt_tokens": 300.0,
                          "cached_prompt_tokens": 180.0, "compiled_tokens": 24.0, "sampled_tokens": 40.0})
    b = Sequence("t", "mini-codex", reward=0.0, turns=3, metrics={"model_tokens": 50.0, "rollbacks": 1.0,
                                                                  "prompt_tokens": 100.0, "format_retries": 2.0,
                                                                  "context_lost_turns": 1.0})
    c = Sequence("t", "mini-bash", status=Status.INFRA, failure=FailureCategory.SANDBOX_ERROR, turns=1,
                 metrics={"model_tokens": 20.0})
    entry = LedgerEntry(3, "toolfind")
    entry.stale_dropped, entry.carried_over = 2, 1
    rec = step_record(StepInputs(step=3, finished=[a, b, c], trained=[a, b], ledger={"toolfind": entry},
                                 rollout_seconds=4.0, train_seconds=1.0, retained_rows=2, version=7, violations=5,
                                 replayed=1, reissued=0, arms=["mini-bash", "mini-codex"],
                                 lag_counts=Counter({0: 10, 1: 5})),
                      {"grs_fallback": 0}, {"loss": 0.25})
    assert rec["reward_mean"] == 0.5 and rec["success_rate"] == 0.5  # the infra sequence is not scored
    assert rec["response_tokens_mean"] == pytest.approx(100 / 3) and rec["turns_mean"] == 2.0
    assert rec["generated_tokens_per_s"] == 25.0 and rec["step_seconds"] == 5.0
    assert rec["status_infra"] == pytest.approx(1 / 3) and rec["status_submitted"] == pytest.approx(2 / 3)
    assert rec["version_lag_max"] == 1 and rec["version_lag_mean"] == pytest.approx(5 / 15)
    assert rec["version_lag_tokens/1"] == 5.0 and rec["staleness_violations"] == 5.0
    assert rec["sequences_spanning_versions"] == 1.0 and rec["gateway_rollbacks"] == 1.0
    assert rec["format_retries"] == 2.0 and rec["context_lost_turns"] == 1.0
    assert (rec["stale_dropped"], rec["carried_over"], rec["replayed_groups"]) == (2.0, 1.0, 1.0)
    assert rec["reward_mean/mini-bash"] == 1.0 and rec["reward_mean/mini-codex"] == 0.0
    assert rec["loss"] == 0.25 and rec["grs_fallback"] == 0 and rec["version"] == 7
    # 400 prompt tokens sent, 180 of them from kept caches: 220 run, a reuse rate of 0.45
    assert rec["prefill_tokens"] == 220.0 and rec["prefix_reuse_rate"] == pytest.approx(0.45)
    # 40 tokens sampled (a rolled-back turn's too), 24 of them after compiled one-row steps
    # (engine.compile_solo); b's 50 model tokens have no sampled count: not in the share
    assert rec["compiled_decode_share"] == pytest.approx(24 / 40)


def test_staleness_violations_hold_each_row_to_its_own_source_s_staleness():
    from rlonce.core.records import TrainingRow, staleness_violations

    def row(group: str, versions: list[int]) -> TrainingRow:
        n = len(versions) + 1
        return TrainingRow([1] * n, [0] + [1] * len(versions), [0.0] * n, [0.0] * n, [-1] + versions, group_id=group)

    # trainer at version 5; source "code" allows staleness 3 (lag ≤ 2), "math" staleness 1 (lag 0)
    rows = [row("c@2", [5, 4, 3, 2]), row("m@4", [5, 4, 4])]
    limit = {"c@2": 3, "m@4": 1}
    assert staleness_violations(rows, 5, limit.__getitem__) == 1 + 2  # code's lag-3 token, math's two lag-1 tokens
    # the run-wide maximum (3) would have counted only code's lag-3 token
    assert staleness_violations(rows, 5, lambda g: 3) == 1


def test_a_source_that_trained_nothing_is_named_with_where_its_sequences_went():
    from rlonce.core.ledger import LedgerEntry
    from rlonce.telemetry.step import untrained_line, why_untrained

    easy = LedgerEntry(3, "toolfind", dispatched=12, finished=12, no_contrast_filtered=12, no_contrast_all_passed=6)
    broken = LedgerEntry(3, "code", dispatched=6, infra_failed=4, finished=2, no_contrast_filtered=2)
    fine = LedgerEntry(3, "arith", dispatched=6, finished=6, retained=6)
    assert why_untrained(easy) == "6 in groups that all failed, 6 in groups that all passed (sequences)"
    assert why_untrained(broken.to_dict()) == "2 in groups that all failed, 4 failed in the infrastructure (sequences)"
    assert why_untrained(LedgerEntry(3, "music")) == "nothing dispatched"
    ledger = {"toolfind": easy, "code": broken, "arith": fine}
    assert untrained_line(3, ledger, {"arith": 1}, {"toolfind": 2, "code": 1, "arith": 1}) == (
        "step 3: toolfind, code trained no group (toolfind: 6 in groups that all failed, 6 in groups that all "
        "passed (sequences); code: 2 in groups that all failed, 4 failed in the infrastructure (sequences))")
    assert untrained_line(3, ledger, {}, {}).startswith("step 3 trained nothing: toolfind: 6 in groups")
    assert untrained_line(3, {"arith": fine}, {"arith": 1}, {"arith": 1}) is None
    # a source owed no share is not an idle one
    assert untrained_line(3, {"arith": fine, "code": broken}, {"arith": 1}, {"arith": 1, "code": 0}) is None


def test_the_audit_fails_a_run_that_trained_on_zero_tokens():
    from rlonce.recipes.audit import check_trained

    idle = [{"step": 1, "source": "a", "dispatched": 4, "no_contrast_filtered": 4, "no_contrast_all_passed": 2},
            {"step": 2, "source": "a", "dispatched": 4, "infra_failed": 1, "no_contrast_filtered": 3}]
    v = check_trained(idle)
    assert not v.ok and v.checked == 2 and v.violations == [
        "the run trained on 0 tokens in 2 RL step(s): of 8 dispatched, 5 in groups that all failed, "
        "2 in groups that all passed, 1 failed in the infrastructure (sequences)"]
    assert check_trained([*idle, {"step": 3, "source": "a", "dispatched": 4, "retained": 4}]).ok
    none = check_trained([])
    assert none.ok and none.note == "no RL step"
