"""Hand-computed values and gradients for every objective, rollout correction and the bound controller."""

import math

import pytest
import torch

from rlonce.algo import EntropyBoundController, policy_loss, rollout_correction
from rlonce.config import AlgoConfig, objective_params


def _grad(name, ratios, adv, mask=None, **params):
    """Loss and d loss / d log π for one row whose rollout log-probs are log(0.5)."""
    old = torch.full((1, len(ratios)), math.log(0.5))
    lp = (old + torch.log(torch.tensor([ratios]))).clone().requires_grad_()
    mask = torch.ones(1, len(ratios)) if mask is None else torch.tensor([mask], dtype=torch.float32)
    loss, m = policy_loss(name, lp, old, torch.tensor([adv]), mask, agg="token-mean", **params)
    loss.backward()
    return loss.detach(), lp.grad[0], m, lp.detach()[0]


def test_cispo_clips_the_weight_and_keeps_every_token():
    # ratios 3.0 (above 1+0.28), 1.1, 0.5 (no lower bound with eps_low = 1): token-mean over 3
    loss, g, m, lp = _grad("cispo", [3.0, 1.1, 0.5], [1.0, -2.0, 1.0], eps_low=1.0, eps_high=0.28)
    w = torch.tensor([1.28, 1.1, 0.5])
    a = torch.tensor([1.0, -2.0, 1.0])
    assert float(loss) == pytest.approx(float(-(w * a * lp).sum() / 3), rel=1e-6)
    # d/d log π of -w·A·log π / 3 = -w·A/3 — the ratio-3 token still gets gradient 1.28/3
    assert g.tolist() == pytest.approx((-w * a / 3).tolist(), rel=1e-6)
    assert m["clipfrac"] == pytest.approx(1 / 3)
    # a finite lower bound clips low ratios too
    _, g, m, _ = _grad("cispo", [3.0, 1.1, 0.5], [1.0, -2.0, 1.0], eps_low=0.2, eps_high=0.28)
    assert g.tolist() == pytest.approx([-1.28 / 3, 2 * 1.1 / 3, -0.8 / 3], rel=1e-6)
    assert m["clipfrac"] == pytest.approx(2 / 3)


def test_four_bound_masks_out_of_interval_tokens_per_sign():
    ratios = [6.0, 0.1, 2.0, 6.0, 0.1, 0.7]
    adv = [1.0, 1.0, 1.0, -1.0, -1.0, -1.0]
    loss, g, m, lp = _grad("four_bound", ratios, adv, pos_low=0.2, pos_high=5.0, neg_low=0.2, neg_high=5.0)
    # kept: token 2 (A>0, r=2) and token 5 (A<0, r=0.7); loss -sg(r)·A·log π, token-mean over 6 valid
    assert float(loss) == pytest.approx(float(-(2.0 * lp[2]) + 0.7 * lp[5]) / 6, rel=1e-6)
    assert g.tolist() == pytest.approx([0, 0, -2.0 / 6, 0, 0, 0.7 / 6], abs=1e-7)
    assert (m["clip_pos_high"], m["clip_pos_low"], m["clip_neg_high"], m["clip_neg_low"]) == pytest.approx(
        (1 / 3, 1 / 3, 1 / 3, 1 / 3))
    assert m["clipfrac"] == pytest.approx(4 / 6)
    # asymmetric intervals: [0.5, 1.5] for positives drops token 2 as well
    _, g, m, _ = _grad("four_bound", ratios, adv, pos_low=0.5, pos_high=1.5, neg_low=0.2, neg_high=5.0)
    assert g[2] == 0 and m["clip_pos_high"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="interval"):
        _grad("four_bound", ratios, adv, pos_low=1.2, pos_high=5.0, neg_low=0.2, neg_high=5.0)


def test_unified_is_cispo_with_the_trust_region_mask():
    ratios, adv = [1.5, 1.5, 0.7, 0.7], [1.0, -1.0, 1.0, -1.0]
    _, g, m, _ = _grad("unified", ratios, adv, eps_low=1.0, eps_high=0.28, mask_low=0.2, mask_high=0.28)
    # M = 0 for (A>0, r=1.5 > 1.28) and (A<0, r=0.7 < 0.8); others keep the clipped weight
    assert g.tolist() == pytest.approx([0.0, 1.28 / 4, -0.7 / 4, 0.0], abs=1e-7)
    assert m["clipfrac"] == pytest.approx(2 / 4) and m["weight_clipfrac"] == pytest.approx(2 / 4)


def test_ppo_gradient_zero_on_clipped_tokens_and_masked_positions():
    _, g, _, _ = _grad("ppo", [1.5, 1.1, 0.5, 0.9], [1.0, 1.0, -1.0, -1.0], mask=[1, 1, 1, 0],
                       clip_low=0.2, clip_high=0.2, clip_c=None)
    # token 0: r > 1.2 with A > 0 → clipped, no gradient; token 2: r < 0.8 with A < 0 → clipped
    # token 1: d(-A·r)/d log π = -r·A / 3; token 3 masked
    assert g.tolist() == pytest.approx([0.0, -1.1 / 3, 0.0, 0.0], abs=1e-7)


@pytest.mark.parametrize("name", ["ppo", "four_bound", "cispo", "unified"])
def test_every_objective_descends_the_right_way(name):
    _, g, _, _ = _grad(name, [1.0, 1.0], [1.0, -1.0], **objective_params(AlgoConfig(objective=name)))
    assert g[0] < 0 < g[1]


@pytest.mark.parametrize("name", ["ppo", "four_bound", "cispo", "unified"])
def test_ppo_kl_clamps_each_tokens_log_ratio_to_20_as_verl(name):
    # log μ − log π per token: 30, −0.5, −25, and a masked 100 that must not count
    old = torch.tensor([[-1.0, -1.0, -30.0, -1.0]])
    new = torch.tensor([[-31.0, -0.5, -5.0, -101.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    _, m = policy_loss(name, new, old, torch.tensor([[1.0, -1.0, 1.0, 1.0]]), mask, agg="token-mean",
                       **objective_params(AlgoConfig(objective=name)))
    # clamped to ±20: (20 − 0.5 − 20) / 3; unclamped the mean would be (30 − 0.5 − 25) / 3 = 1.5
    assert m["ppo_kl"] == pytest.approx(-0.5 / 3, rel=1e-6)


def test_rollout_correction_truncated_masked_and_geometric():
    old = torch.log(torch.tensor([[0.5, 0.9, 0.2], [0.4, 0.4, 0.4]]))
    roll = torch.log(torch.tensor([[0.25, 0.9, 0.4], [0.1, 0.4, 0.4]]))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # ratios: row 0 → 2, 1, 0.5; row 1 → 4, 1 (5 valid tokens)

    def run(mode, cap=3.0, bounds=(0.5, 1.5)):
        w, keep, m = rollout_correction(old, roll, mask, mode=mode, cap=cap, bounds=bounds)
        return w.flatten().tolist(), keep.flatten().tolist(), m

    # TIS, token: 4 is truncated to 3; nothing is masked; mean weight 7.5 / 5
    w, keep, m = run("token")
    assert w == pytest.approx([2.0, 1.0, 0.5, 3.0, 1.0, 0.0], rel=1e-5) and keep == [1, 1, 1, 1, 1, 0]
    assert (m["correction_capped_frac"], m["correction_masked_frac"]) == (pytest.approx(1 / 5), 0.0)
    assert m["correction_weight_mean"] == pytest.approx(7.5 / 5, rel=1e-5)
    # TIS, sequence: row 0's product 2·1·0.5 = 1; row 1's 4·1 = 4 → 3 on both its tokens (2 of 5 capped)
    w, keep, m = run("sequence")
    assert w == pytest.approx([1.0, 1.0, 1.0, 3.0, 3.0, 0.0], rel=1e-5) and keep == [1, 1, 1, 1, 1, 0]
    assert m["correction_capped_frac"] == pytest.approx(2 / 5) and m["correction_weight_mean"] == pytest.approx(9 / 5)
    # MIS, token: the token with weight 4 > 3 is masked, the others keep their untruncated weight
    w, keep, m = run("token-mis")
    assert w == pytest.approx([2.0, 1.0, 0.5, 0.0, 1.0, 0.0], rel=1e-5) and keep == [1, 1, 1, 0, 1, 0]
    assert (m["correction_masked_frac"], m["correction_capped_frac"]) == (pytest.approx(1 / 5), 0.0)
    assert m["correction_weight_mean"] == pytest.approx(4.5 / 4, rel=1e-5)  # over the 4 kept tokens
    # MIS, sequence: row 1's product 4 > 3 masks the whole row; under cap 5 it keeps weight 4
    w, keep, m = run("sequence-mis")
    assert w == pytest.approx([1.0, 1.0, 1.0, 0.0, 0.0, 0.0], rel=1e-5) and keep == [1, 1, 1, 0, 0, 0]
    assert m["correction_masked_frac"] == pytest.approx(2 / 5) and m["correction_weight_mean"] == pytest.approx(1.0)
    w, keep, m = run("sequence-mis", cap=5.0)
    assert w == pytest.approx([1.0, 1.0, 1.0, 4.0, 4.0, 0.0], rel=1e-5) and m["correction_masked_frac"] == 0.0
    # geometric bounds the geometric mean of μ/π_old (1/ρ): row 0's (1/2·1·2)^(1/3) = 1 is inside
    # [0.6, 1.5]; row 1's (1/4·1)^(1/2) = 0.5 is below it
    w, keep, m = run("geometric", bounds=(0.6, 1.5))
    assert w == pytest.approx([1.0, 1.0, 1.0, 0.0, 0.0, 0.0], rel=1e-5) and keep == [1, 1, 1, 0, 0, 0]
    assert m["correction_masked_frac"] == pytest.approx(2 / 5) and m["correction_weight_mean"] == pytest.approx(1.0)
    assert run("geometric", bounds=(0.4, 1.5))[1] == [1, 1, 1, 1, 1, 0]
    # ratios 0.25, 1 → ρ's geometric mean 0.5, μ/π_old's 2: above the upper bound 1.5, inside 2.5
    low = torch.log(torch.tensor([[0.1, 0.1]])), torch.log(torch.tensor([[0.4, 0.1]])), torch.ones(1, 2)
    assert rollout_correction(*low, mode="geometric", cap=2.0, bounds=(0.6, 1.5))[1].tolist() == [[0.0, 0.0]]
    assert rollout_correction(*low, mode="geometric", cap=2.0, bounds=(0.6, 2.5))[1].tolist() == [[1.0, 1.0]]
    with pytest.raises(ValueError, match="unknown rollout correction"):
        rollout_correction(old, roll, mask, mode="nope", cap=2.0, bounds=(0.5, 1.5))
    with pytest.raises(ValueError, match="geometric bounds"):
        rollout_correction(old, roll, mask, mode="geometric", cap=2.0, bounds=(1.2, 1.5))


def test_geometric_bounds_the_inverse_ratio_as_verl():
    """verl's ``seq_mean_k1`` keeps a row when ``lower <= exp(mean log(μ/π_old)) <= upper``: with
    bounds 0.8 / 1.1 a row's geometric-mean ratio ρ is kept in [1/1.1, 1/0.8] = [0.909, 1.25]
    (bounding ρ itself would keep [0.8, 1.1])."""
    rho_B = [0.85, 0.90, 0.92, 1.05, 1.2, 1.24, 1.26]
    # two tokens per row, log-ratios 2·log ρ and 0: the row's geometric mean is ρ
    log_rho = torch.log(torch.tensor(rho_B, dtype=torch.float64))
    old = torch.stack([2 * log_rho - 1.0, torch.full_like(log_rho, -1.0)], -1)
    roll = torch.full_like(old, -1.0)
    _, keep, m = rollout_correction(old, roll, torch.ones_like(old), mode="geometric", cap=2.0, bounds=(0.8, 1.1))
    assert keep[:, 0].tolist() == [0, 0, 1, 1, 1, 1, 0]
    assert m["correction_masked_frac"] == pytest.approx(3 / 7)
    # the default preset [0.999, 1.001] is verl's "0.999_1.001": ρ in [1/1.001, 1/0.999] = [0.999001, 1.001001]
    for rho, kept in ((1.0010005, 1.0), (1.0010015, 0.0), (0.9990015, 1.0), (0.9990005, 0.0)):
        lo = torch.tensor([[math.log(rho)]], dtype=torch.float64)
        b = (AlgoConfig().geometric_low, AlgoConfig().geometric_high)
        assert rollout_correction(lo, torch.zeros_like(lo), torch.ones_like(lo), mode="geometric", cap=2.0,
                                  bounds=b)[1].item() == kept
    # one token's log-ratio is clamped to ±20 before the mean, as verl: 40 and 0 average to 10, not 20
    big = torch.tensor([[40.0, 0.0]], dtype=torch.float64)
    keep = rollout_correction(big, torch.zeros_like(big), torch.ones_like(big), mode="geometric", cap=2.0,
                              bounds=(math.exp(-10.5), 1.0))[1]
    assert keep.tolist() == [[1.0, 1.0]]


def test_entropy_controller_moves_bounds_and_checkpoints():
    c = EntropyBoundController(target_low=0.5, target_high=1.0, step=0.25)
    assert c.update(0.7) == {"pos_low": 0.2, "pos_high": 5.0, "neg_low": 0.2, "neg_high": 5.0}
    b = c.update(0.1)  # too low: positive interval widens, negative narrows
    assert b == pytest.approx({"pos_low": 0.16, "pos_high": 6.25, "neg_low": 0.25, "neg_high": 4.0})
    for _ in range(50):
        b = c.update(0.1)
    assert b == pytest.approx({"pos_low": 0.05, "pos_high": 20.0, "neg_low": 0.9, "neg_high": 1.1})  # limits
    saved = c.state_dict()
    c2 = EntropyBoundController(target_low=0.5, target_high=1.0)
    c2.load_state_dict(saved)
    assert c2.update(2.0) == c.update(2.0)  # too high: the opposite move, identically after a reload
    assert c2.pos_high < 20.0 and c2.neg_high > 1.1
