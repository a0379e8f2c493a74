"""The seeds' worked numbers, exactly: GAR, length deduction, signed rebalance; plus GRS, filtering, hacks."""

import math

import pytest
import torch

from rlonce.algo import (
    broadcast_session_advantages,
    gar_redistribute,
    group_advantages,
    grs_reward,
    keep_groups,
    length_penalty,
    signed_rebalance,
    zero_confirmed_hacks,
)


def test_gar_worked_example():
    # rewards (1, 1, 0, 0) → advantages (½, ½, -½, -½); f = (0.5, 1) on the two passing rows
    adv = group_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), [0, 0, 0, 0])
    out = gar_redistribute(adv, torch.tensor([True, True, False, False]), torch.tensor([0.5, 1.0, math.nan, math.nan]),
                           lambda_max=10.0)
    # λ = Σ_P A / Σ_P f·A = 1 / 0.75 = 4/3; A' = (4/3·0.25, 4/3·0.5) = (1/3, 2/3); mean stays 0
    assert out.tolist() == pytest.approx([1 / 3, 2 / 3, -1 / 2, -1 / 2])


def test_gar_cap_resubtracts_mean_and_falls_back():
    adv = torch.tensor([0.5, 0.5, -0.5, -0.5])
    passed = torch.tensor([True, True, False, False])
    out = gar_redistribute(adv, passed, torch.tensor([0.5, 1.0, 0.0, 0.0]), lambda_max=1.0)
    # λ capped at 1: (0.25, 0.5, -0.5, -0.5), mean -1/16 re-subtracted
    assert out.tolist() == pytest.approx([0.3125, 0.5625, -0.4375, -0.4375])
    assert float(out.sum()) == pytest.approx(0.0, abs=1e-6)
    for bad in (math.nan, 1.5, -0.1):  # an unusable quality factor keeps the original advantages
        assert gar_redistribute(adv, passed, torch.tensor([bad, 1.0, 0.0, 0.0])).tolist() == adv.tolist()


def test_length_deduction_reference_constants():
    # four passing rollouts; 0.3-quantile anchor of (100, 100, 100, 150) is 100; 150 is 1.5× the anchor
    lengths = torch.tensor([100.0, 100.0, 100.0, 150.0, 400.0])
    passed = torch.tensor([True, True, True, True, False])  # pass rate 0.8 > 0.5
    d = length_penalty(lengths, passed)
    assert d[3].item() == pytest.approx(0.2 * 0.5 ** 1.5, abs=1e-6)
    assert round(d[3].item(), 4) == 0.0707
    assert d[[0, 1, 2, 4]].tolist() == [0.0, 0.0, 0.0, 0.0]  # failed rows are not the target
    # at a pass rate equal to the gate the penalty is skipped
    gate = torch.tensor([True, True, False, False])
    assert length_penalty(torch.tensor([100.0, 150.0, 50.0, 50.0]), gate).tolist() == [0.0] * 4
    # saturation: excess ≥ s gives the full X; a dict of metrics combines by max
    d = length_penalty({"turns": torch.tensor([2.0, 2.0, 2.0, 4.0]), "output_tokens": torch.tensor([10.0, 10, 10, 15])},
                       torch.ones(4, dtype=torch.bool))
    assert d[3].item() == pytest.approx(0.2)
    d = length_penalty({"turns": torch.tensor([2.0, 2.0, 2.0, 4.0]), "output_tokens": torch.tensor([10.0, 10, 10, 15])},
                       torch.ones(4, dtype=torch.bool), combine="mean")
    assert d[3].item() == pytest.approx((0.2 + 0.0707107) / 2, abs=1e-6)
    # deadzone: excess 0.5 with δ = 0.25, s = 1 → t = 1/3
    d = length_penalty(lengths, passed, deadzone=0.25)
    assert d[3].item() == pytest.approx(0.2 * (1 / 3) ** 1.5, abs=1e-6)


def test_signed_rebalance_worked_examples():
    flagged = torch.tensor([True, True] + [False] * 6)
    out, m = signed_rebalance(torch.full((8,), 0.5), flagged)
    assert m["alpha"] == pytest.approx(4 / 3) and m["pos_mass_after"] == pytest.approx(4.0)
    assert out.tolist() == pytest.approx([0, 0] + [2 / 3] * 6)
    out, m = signed_rebalance(torch.full((8,), -0.5), flagged, kappa=2.0)
    assert m["beta"] == pytest.approx(2 / 3) and m["neg_mass_after"] == pytest.approx(4.0)
    assert out.tolist() == pytest.approx([-1.0, -1.0] + [-1 / 3] * 6)
    assert not m["beta_clamped"]
    out, m = signed_rebalance(torch.full((8,), -0.5), flagged, kappa=4.0, beta_min=0.5)
    assert m["beta"] == 0.5 and m["beta_clamped"] and m["neg_mass_after"] == pytest.approx(5.5)
    # α capped: 6 flagged of 8 would need α = 4
    out, m = signed_rebalance(torch.full((8,), 0.5), torch.tensor([True] * 6 + [False] * 2), alpha_max=2.0)
    assert m["alpha_clamped"] and m["pos_mass_after"] == pytest.approx(2.0)
    # no clean token to compensate: reported, not hidden
    _, m = signed_rebalance(torch.full((2,), 0.5), torch.tensor([True, True]))
    assert m["pos_unbalanced"] and m["pos_mass_after"] == 0.0


def test_grs_is_a_gate_on_the_pass_flag_and_validates_scores():
    r = grs_reward(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0.5, 1.0, 1.0]), torch.tensor([0.8, 0.5, math.nan]),
                   torch.tensor([True, True, False]))
    assert r.tolist() == pytest.approx([0.4, 0.5, 0.0])  # a failed test stays 0 whatever the rubric says
    # partial credit without a pass (a 0.1 format bonus) is gated by the flag, not by the reward's sign
    r = grs_reward(torch.tensor([0.1, 1.1]), torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.8]),
                   torch.tensor([False, True]))
    assert r.tolist() == pytest.approx([0.0, 1.1 * 0.5 * 0.8])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        grs_reward(torch.tensor([1.0]), torch.tensor([1.5]), torch.tensor([1.0]), torch.tensor([True]))


def test_keep_groups_contrast_rules():
    scores = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.3, 0.0, 1.0, 0.7, 0.7])
    groups = ["a", "a", "b", "b", "c", "d", "d", "e", "e"]
    infra = torch.tensor([False, False, False, False, False, False, True, False, False])
    keep = keep_groups(scores, groups, infra)
    # a: contrast; b: equal continuous rewards; c: one row; d: one valid row (the 1.0 is infra); e: equal
    assert keep.tolist() == [True, True, False, False, False, False, False, False, False]


def test_zero_confirmed_hacks_before_statistics():
    s, n = zero_confirmed_hacks(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([True, False, False]))
    assert s.tolist() == [0.0, 1.0, 0.0] and n == 1
    assert group_advantages(s, [0, 0, 0]).tolist() == pytest.approx([-1 / 3, 2 / 3, -1 / 3])


def test_broadcast_session_advantages():
    # two sessions in one group; session 0 has two outputs (contexts), session 1 one
    mask = torch.tensor([[0, 1, 1], [1, 1, 0], [0, 0, 1]])
    a = broadcast_session_advantages(torch.tensor([1.0, 0.0]), ["g", "g"], [0, 0, 1], mask)
    assert a.flatten().tolist() == pytest.approx([0, 0.5, 0.5, 0.5, 0.5, 0, 0, 0, -0.5])
