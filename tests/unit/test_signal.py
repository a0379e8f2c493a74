"""The order of operations, end to end on hand-built Samples: scores → filter → advantages → rows → penalties."""

import pytest

from rlonce.algo import LengthShaping, PenaltySpec, SignalSettings, learning_signal
from rlonce.core.ledger import LedgerEntry, LedgerImbalance
from rlonce.core.records import Context, FailureCategory, Grades, Role, Sample, Segment, Sequence, Status


def _seq(reward, status=Status.SUBMITTED, *, model_turns=1, tokens=2, flags=None, **kw):
    segs = [Segment(Role.PROMPT, [1, 2])]
    for k in range(model_turns):
        segs.append(Segment(Role.MODEL, [3 + k] * tokens, [-0.1] * tokens, [0] * tokens,
                            flags=dict(flags or {}) if k == model_turns - 1 else {}))
        segs.append(Segment(Role.OBSERVATION, [9]))
    failure = FailureCategory.SANDBOX_ERROR if status is Status.INFRA else None
    kw.setdefault("passed", reward is not None and reward >= 1.0)  # these graders pass exactly the full reward
    return Sequence("t", "mini-bash", [Context(segs)], status, failure, reward=reward, turns=model_turns, **kw)


def test_advantages_filter_and_ledger():
    a = Sample("a", "toolfind", 1, [_seq(1.0), _seq(0.0), _seq(0.0), _seq(None, Status.INFRA)])
    b = Sample("b", "toolfind", 1, [_seq(1.0), _seq(1.0)])  # no contrast
    rows, ledger, _ = learning_signal([a, b], 1, SignalSettings())
    e = ledger["toolfind"]
    assert (e.dispatched, e.finished, e.infra_failed, e.no_contrast_filtered, e.retained) == (6, 5, 1, 2, 3)
    assert e.no_contrast_all_passed == 2  # b was filtered because both passed
    c = Sample("c", "toolfind", 1, [_seq(0.0), _seq(0.0)])  # no contrast the other way
    assert learning_signal([c], 1, SignalSettings())[1]["toolfind"].no_contrast_all_passed == 0
    with pytest.raises(LedgerImbalance, match="no_contrast_all_passed 3 > filtered 2"):
        LedgerEntry(1, "x", dispatched=2, finished=2, no_contrast_filtered=2, no_contrast_all_passed=3).check()
    assert [r.advantages[3] for r in rows] == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    assert all(r.advantages[:2] == [0.0, 0.0] and r.advantages[4] == 0.0 for r in rows)  # prompt tokens carry no signal
    with pytest.raises(LedgerImbalance):
        LedgerEntry(1, "x", dispatched=3, finished=2, infra_failed=0).check()


def test_an_unusable_grade_leaves_its_group_and_the_std_is_over_the_graded_rows():
    """The run path has no invalid score: a grader's non-finite reward makes the sequence an
    infrastructure failure (grader_unavailable), which leaves its group before the statistics."""
    import asyncio
    import math

    from rlonce.core.records import Grade
    from rlonce.envs.base import grade_or_infra

    class NanGrader:
        metrics: dict = {}

        async def grade(self, seq):
            return Grade(float("nan"), passed=False)

    broken = _seq(None)
    assert asyncio.run(grade_or_infra(NanGrader(), broken)) is None
    assert (broken.status, broken.failure) == (Status.INFRA, FailureCategory.GRADER_UNAVAILABLE)
    sample = Sample("a", "code", 1, [_seq(1.0), _seq(0.0), _seq(0.0), broken])
    rows, ledger, _ = learning_signal([sample], 1, SignalSettings(norm_by_std=True))
    # mean 1/3, unbiased std over the three graded rows √(1/3) = 0.577 (the kernel's fill, which
    # counts the fourth row in n, would give √(2/9) = 0.471 and advantages 1.414, −0.707)
    std = math.sqrt(1 / 3)
    assert sample.signal["advantages"] == pytest.approx([(2 / 3) / std, (-1 / 3) / std, (-1 / 3) / std], rel=1e-5)
    assert [r.advantages[3] for r in rows] == pytest.approx([1.1547, -0.57735, -0.57735], rel=1e-4)
    e = ledger["code"]
    assert (e.dispatched, e.infra_failed, e.finished, e.retained) == (4, 1, 3, 3)
    assert e.infra_by_category == {"grader_unavailable": 1}
    # a graded-looking sequence without a usable reward is refused, not scored
    for bad in (None, float("nan")):
        with pytest.raises(ValueError, match="infrastructure failure"):
            learning_signal([Sample("b", "code", 1, [_seq(1.0), _seq(bad)])], 1, SignalSettings())


def test_hack_zeroed_before_statistics_and_counted():
    s = Sample("a", "code", 3, [_seq(1.0, hack_confirmed=True), _seq(1.0), _seq(0.0)])
    rows, ledger, _ = learning_signal([s], 3, SignalSettings())
    assert [r.advantages[3] for r in rows] == pytest.approx([-1 / 3, 2 / 3, -1 / 3])
    assert ledger["code"].hack_zeroed == 1
    # all-pass group made of one hack and one clean pass gains contrast only through the zeroing
    s = Sample("b", "code", 3, [_seq(1.0, hack_confirmed=True), _seq(1.0)])
    rows, ledger, _ = learning_signal([s], 3, SignalSettings(zero_hacks=False))
    assert rows == [] and ledger["code"].no_contrast_filtered == 2


def test_length_shaping_gives_an_all_pass_group_contrast():
    # all pass, output tokens (2, 2, 2, 3): anchor 2, the 3-token row has excess 0.5 → -0.0707
    seqs = [_seq(1.0, tokens=2), _seq(1.0, tokens=2), _seq(1.0, tokens=2), _seq(1.0, tokens=3)]
    rows, ledger, m = learning_signal([Sample("a", "s", 1, seqs)], 1, SignalSettings(length=LengthShaping()))
    d = 0.2 * 0.5 ** 1.5
    assert ledger["s"].length_penalized == 1 and m["length_deduction_sum"] == pytest.approx(d, abs=1e-6)
    assert [r.advantages[3] for r in rows] == pytest.approx([d / 4, d / 4, d / 4, -3 * d / 4], abs=1e-6)


def test_grs_and_gar_read_grader_outputs_with_fallback():
    seqs = [_seq(1.0, grades=Grades(rubric_solution=0.5, rubric_behavior=1.0)), _seq(1.0), _seq(0.0)]
    rows, _, m = learning_signal([Sample("a", "s", 1, seqs)], 1, SignalSettings(grs=True))
    assert [r.advantages[3] for r in rows] == pytest.approx([0.0, 0.5, -0.5])  # scores (0.5, 1, 0)
    assert m["grs_fallback"] == 1  # the second pass had no rubric scores: it kept its test reward
    seqs = [_seq(1.0, grades=Grades(gar_quality=0.5)), _seq(1.0, grades=Grades(gar_quality=1.0)), _seq(0.0),
            _seq(0.0)]
    rows, _, m = learning_signal([Sample("a", "s", 1, seqs)], 1, SignalSettings(gar=True, gar_lambda_max=10))
    assert [r.advantages[3] for r in rows] == pytest.approx([1 / 3, 2 / 3, -0.5, -0.5])
    assert m["gar_groups"] == 1


def test_pass_gated_steps_read_the_graders_flag_not_the_reward():
    # a reasoning group: one correct tagged answer (1.1, passed) and one wrong tagged answer whose
    # 0.1 format bonus is reward without a pass. GRS gates on the flag: scores (1.1·0.5, 0) → ±0.275.
    # (Gating on reward > 0, the 0.1 row would score 0.05 and the advantages be ±0.25.)
    rubric = Grades(rubric_solution=0.5, rubric_behavior=1.0)
    seqs = [_seq(1.1, passed=True, grades=rubric), _seq(0.1, passed=False, grades=rubric)]
    rows, _, _ = learning_signal([Sample("r", "reasoning", 1, seqs)], 1, SignalSettings(grs=True))
    assert [r.advantages[3] for r in rows] == pytest.approx([0.275, -0.275])
    # length shaping: one pass and three near misses (partial credit 0.95 + the 0.1 format bonus =
    # 1.05, not a pass) → pass rate 1/4, under the 0.5 gate: no deduction, although every reward is
    # >= 1 (a threshold on the reward would have shaped the group)
    seqs = [_seq(1.1, passed=True, tokens=2)] + [_seq(1.05, passed=False, tokens=5) for _ in range(3)]
    _, ledger, m = learning_signal([Sample("r", "reasoning", 1, seqs)], 1, SignalSettings(length=LengthShaping()))
    assert ledger["reasoning"].length_penalized == 0 and m["length_deduction_sum"] == 0


def test_penalty_rules_strategies_and_escalation():
    bad = {"malformed_tool_call": True}
    # sample a: the flagged failing sequence has one model turn → masking drops its only context
    a = Sample("a", "s", 1, [_seq(1.0), _seq(0.0, flags=bad)])
    # sample b: every sequence's only model turn is flagged → nothing survives → rejected
    b = Sample("b", "s", 1, [_seq(1.0, flags=bad), _seq(0.0, flags=bad)])
    # sample c: two model turns, the last flagged → the context survives with the flagged turn masked
    c = Sample("c", "s", 1, [_seq(1.0, model_turns=2, flags=bad), _seq(0.0)])
    settings = SignalSettings(penalties=[PenaltySpec("tool_call", "mask")])
    rows, ledger, m = learning_signal([a, b, c], 1, settings)
    e = ledger["s"]
    assert (e.finished, e.penalty_rejected, e.retained, e.zero_advantage, e.contexts_dropped) == (6, 2, 4, 1, 3)
    assert m["penalty_tool_call_segments"] == 4 and m["penalty_tool_call_sequences"] == 4
    c_row = rows[1]
    assert c_row.loss_mask == [0, 0, 1, 1, 0, 0, 0, 0] and c_row.advantages[2:4] == [0.5, 0.5]
    assert c_row.advantages[5:7] == [0.0, 0.0]  # masked tokens carry no advantage either


def test_penalty_advantage_strategies():
    bad = {"unknown_tool": True}
    s = Sample("a", "s", 1, [_seq(1.0, model_turns=2, flags=bad), _seq(0.0, model_turns=2, flags=bad)])
    rows, _, _ = learning_signal([s], 1, SignalSettings(
        penalties=[PenaltySpec("tool_call", "adv_reduction", strategy_params={"amount": 0.25})]))
    assert rows[0].advantages[2:8] == pytest.approx([0.5, 0.5, 0, 0.25, 0.25, 0])
    assert rows[1].advantages[2:8] == pytest.approx([-0.5, -0.5, 0, -0.75, -0.75, 0])
    rows, _, m = learning_signal([s], 1, SignalSettings(penalties=[PenaltySpec("tool_call", "adv_signed")]))
    # positive row: flagged pair → 0, clean pair ×2 (α = 2); negative row: flagged ×κ=2, clean ×β = 0 → floor 0.5
    assert rows[0].advantages[2:8] == pytest.approx([1.0, 1.0, 0, 0, 0, 0])
    assert rows[1].advantages[2:8] == pytest.approx([-0.25, -0.25, 0, -1.0, -1.0, 0])
    assert m["rebalance_groups"] == 1 and m["rebalance_clamped"] == 1


def test_repetition_and_confident_run_rules_flag_segments():
    rep = _seq(0.0, tokens=40)
    rep.contexts[0].segments[1].token_ids = [5, 6, 7, 8] * 10
    conf = _seq(1.0, tokens=5)
    conf.contexts[0].segments[1].logprobs = [-0.001] * 5
    s = Sample("a", "s", 1, [rep, conf])
    specs = [PenaltySpec("repetition", rule_params={"n": 4, "min_repeats": 4}),
             PenaltySpec("confident_run", rule_params={"run": 5})]
    _, _, m = learning_signal([s], 1, SignalSettings(penalties=specs))
    assert m["penalty_repetition_segments"] == 1 and m["penalty_confident_run_segments"] == 1
    assert rep.contexts[0].segments[1].flags == {"repetition": True}
    assert conf.contexts[0].segments[1].flags == {"confident_run": True}


def test_garbled_rule_uses_decoded_text():
    s = Sample("a", "s", 1, [_seq(1.0), _seq(0.0)])
    decode = lambda ids: "\ufffd\x07x"  # noqa: E731
    _, _, m = learning_signal([s], 1, SignalSettings(penalties=[PenaltySpec("garbled")]), decode=decode)
    assert m["penalty_garbled_segments"] == 2
    with pytest.raises(ValueError, match="decode"):
        learning_signal([s], 1, SignalSettings(penalties=[PenaltySpec("garbled")]))
    with pytest.raises(ValueError, match="unknown penalty rule"):
        PenaltySpec("nope")


def test_length_shaping_defaults_to_the_reference_profile_three_metrics():
    # all pass; (turns, input, output) = (1, 3, 2) ×3 and (2, 4, 2): output tokens alone are equal.
    # turns: anchor q0.3 of (1,1,1,2) = 1, excess 1 → t = 1 → 0.2; input: anchor 3, excess 1/3 →
    # 0.2·(1/3)^1.5 = 0.0385; max → 0.2. Scores (1, 1, 1, 0.8): mean 0.95.
    seqs = [_seq(1.0), _seq(1.0), _seq(1.0), _seq(1.0, model_turns=2, tokens=1)]
    assert LengthShaping().metrics == ("turns", "input_tokens", "output_tokens")
    rows, ledger, m = learning_signal([Sample("a", "s", 1, seqs)], 1, SignalSettings(length=LengthShaping()))
    assert ledger["s"].length_penalized == 1 and m["length_deduction_sum"] == pytest.approx(0.2)
    assert [r.advantages[2] for r in rows] == pytest.approx([0.05, 0.05, 0.05, -0.15])  # first model token
    # the former default (output tokens only) sees no difference: the group has no contrast
    rows, ledger, _ = learning_signal([Sample("a", "s", 1, seqs)], 1,
                                      SignalSettings(length=LengthShaping(metrics=("output_tokens",))))
    assert rows == [] and ledger["s"].no_contrast_filtered == 4
    from rlonce.config import AlgoConfig
    assert AlgoConfig().length.metrics == ["turns", "input_tokens", "output_tokens"]


def test_export_contexts_all_or_longest():
    # sequence A has two contexts: 7 tokens (4 model) and 4 tokens (2 model); B has one. Rewards (1, 0):
    # the sequences are the group members, so A's advantage is +0.5 whichever contexts are exported.
    a = _seq(1.0, tokens=4)
    a.contexts.append(Context([Segment(Role.PROMPT, [1, 2]), Segment(Role.MODEL, [4, 4], [-0.1] * 2, [0] * 2)]))
    s = Sample("t", "s", 1, [a, _seq(0.0)])
    rows, _, m = learning_signal([s], 1, SignalSettings())
    assert [len(r) for r in rows] == [7, 4, 5] and m["contexts_unexported"] == 0
    assert rows[1].advantages == [0.0, 0.0, 0.5, 0.5]
    rows, _, m = learning_signal([s], 1, SignalSettings(export_contexts="longest"))
    assert [len(r) for r in rows] == [7, 5] and m["contexts_unexported"] == 1
    assert rows[0].advantages == [0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.0] and rows[1].advantages[2:4] == [-0.5, -0.5]
    with pytest.raises(ValueError, match="unknown context export"):
        SignalSettings(export_contexts="first")


def test_mask_unfinished_drops_budget_cut_failures_but_keeps_their_score_in_the_baseline():
    # rewards (1, 0, 0, 1); the 2nd and 4th were cut by a budget, the 4th still passed (finished).
    # Baseline 0.5 from all four → advantages (0.5, -0.5, -0.5, 0.5); masking removes only the 2nd's rows.
    seqs = [_seq(1.0), _seq(0.0, Status.LIMITS), _seq(0.0), _seq(1.0, Status.LIMITS)]
    rows, ledger, m = learning_signal([Sample("a", "s", 1, seqs)], 1, SignalSettings())
    assert [r.advantages[3] for r in rows] == pytest.approx([0.5, -0.5, -0.5, 0.5]) and m["unfinished_masked"] == 0
    rows, ledger, m = learning_signal([Sample("a", "s", 1, seqs)], 1, SignalSettings(mask_unfinished=True))
    assert [r.advantages[3] for r in rows] == pytest.approx([0.5, -0.5, 0.5])
    e = ledger["s"]
    assert (e.retained, e.unfinished_masked, e.zero_advantage, m["unfinished_masked"]) == (4, 1, 0, 1)
    # a group whose every sequence is masked has nothing left to train: dropped as unfinished (not
    # as a penalty's rejection), both counted
    cut = [_seq(0.0, Status.LIMITS), _seq(0.5, Status.LIMITS)]
    rows, ledger, _ = learning_signal([Sample("b", "s", 1, cut)], 1, SignalSettings(mask_unfinished=True))
    e = ledger["s"]
    assert rows == [] and (e.unfinished_dropped, e.penalty_rejected, e.retained, e.unfinished_masked) == (2, 0, 0, 2)
    with pytest.raises(LedgerImbalance, match="unfinished 1"):
        LedgerEntry(1, "x", dispatched=2, finished=2, unfinished_dropped=1).check()
    with pytest.raises(LedgerImbalance, match="unfinished_masked"):
        LedgerEntry(1, "x", dispatched=1, finished=1, retained=1, unfinished_masked=2).check()


def _rebalance_batch_samples():
    bad = {"unknown_tool": True}
    # group a: a1 (+0.5) has 2 clean and 2 flagged positive tokens, a2 (-0.5) 2 clean negatives;
    # group b: b1 (+0.5) 2 clean positives, b2 (-0.5) 2 clean and 2 flagged negatives
    a = Sample("a", "s", 1, [_seq(1.0, model_turns=2, flags=bad), _seq(0.0)])
    b = Sample("b", "s", 1, [_seq(1.0), _seq(0.0, model_turns=2, flags=bad)])
    return [a, b]


def test_signed_rebalance_runs_over_the_batch_with_the_aggregations_token_weights():
    spec = [PenaltySpec("tool_call", "adv_signed")]  # κ = 2, α_max = 2, β_min = 0.5
    # token-mean (equal weights): M+ = 6·0.5 = 3, C+ = 4·0.5 = 2 → α = 1.5; M- = 3, H- = 1, C- = 2 →
    # β = (3 - 2·1)/2 = 0.5 (at the floor, not below). Per group, group a would have α = 2 and
    # group b β = 0 → clamped to 0.5.
    rows, _, m = learning_signal(_rebalance_batch_samples(), 1, SignalSettings(penalties=spec))
    a1, a2, b1, b2 = (r.advantages for r in rows)
    assert a1[2:7] == pytest.approx([0.75, 0.75, 0, 0, 0]) and a2[2:4] == pytest.approx([-0.25, -0.25])
    assert b1[2:4] == pytest.approx([0.75, 0.75]) and b2[2:7] == pytest.approx([-0.25, -0.25, 0, -1.0, -1.0])
    assert (m["rebalance_clamped"], m["rebalance_groups"]) == (0, 2)
    # seq-mean-token-mean: each row's tokens weigh 1/(its live tokens): a1, b2 1/4; a2, b1 1/2.
    # M+ = 4·¼·½ + 2·½·½ = 1, C+ = 2·¼·½ + ½ = ¾ → α = 4/3; M- = 1, H- = 2·¼·½ = ¼, C- = ½ + ¼ = ¾ →
    # β = (1 - 2·¼)/¾ = 2/3. Weighted masses are kept: positive ⅓ + ⅔ = 1, negative ⅓ + ⅙ + ½ = 1.
    settings = SignalSettings(penalties=spec, aggregation="seq-mean-token-mean")
    rows, _, m = learning_signal(_rebalance_batch_samples(), 1, settings)
    a1, a2, b1, b2 = (r.advantages for r in rows)
    assert a1[2:7] == pytest.approx([2 / 3, 2 / 3, 0, 0, 0]) and a2[2:4] == pytest.approx([-1 / 3, -1 / 3])
    assert b1[2:4] == pytest.approx([2 / 3, 2 / 3]) and b2[2:7] == pytest.approx([-1 / 3, -1 / 3, 0, -1.0, -1.0])
    with pytest.raises(ValueError, match="unknown aggregation"):
        SignalSettings(aggregation="mean")


def test_the_orchestrators_judge_defers_the_rebalance_to_the_steps_batch():
    from rlonce.rollout.groups import Group, Judge

    settings = SignalSettings(penalties=[PenaltySpec("tool_call", "adv_signed")])
    judge = Judge(settings)
    taken = []
    for k, sample in enumerate(_rebalance_batch_samples()):
        judged = judge(sample.task_id, "s", 1, sample.sequences)
        assert judged.stats["rebalance_groups"] == 0  # judged alone: no rebalance yet
        taken.append(Group(sample.group_id, None, "s", 1, k, rows=judged.rows))
    # the second group's rows stayed where an executor judged them (a payload, as a Ray pool leaves them)
    held = (taken[1].sequences, taken[1].rows)
    taken[1].rows, taken[1].payload = [], type("Held", (), {"rows": 2, "fetch": lambda self: held})()
    rows, stats = judge.batch(taken)
    assert rows[0].advantages[2:7] == pytest.approx([0.75, 0.75, 0, 0, 0])  # α = 1.5 over the batch
    assert rows[3].advantages[2:7] == pytest.approx([-0.25, -0.25, 0, -1.0, -1.0])
    assert stats == {"rebalance_clamped": 0, "rebalance_groups": 2} and taken[1].payload is None
