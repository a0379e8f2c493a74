import pytest
import torch

from rlonce.algo import aggregate, group_advantages, policy_loss
from rlonce.config import AlgoConfig, objective_params


def test_group_advantages_hand_computed():
    s = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    g = ["a", "a", "a", "a", "b", "b"]
    adv = group_advantages(s, g)
    assert adv.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.0, 0.0])
    # std-normalised: group a has unbiased std sqrt(1/3)
    adv = group_advantages(s, g, norm_by_std=True, eps=0.0)
    assert adv[:4].tolist() == pytest.approx([0.5 / (1 / 3) ** 0.5, -0.866025, -0.866025, 0.866025], rel=1e-5)


def test_group_advantages_invalid_rows_and_singletons():
    s = torch.tensor([1.0, 0.0, 123.0, 0.7])
    adv = group_advantages(s, [1, 1, 1, 2], valid_N=torch.tensor([True, True, False, True]))
    # group 1 baseline from the two valid rows (mean 0.5); the invalid row gets exactly 0
    assert adv.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.7])  # singleton: mean 0, std 1


def test_invalid_scores_take_the_valid_mean_and_count_in_the_std():
    # seed 001's kernel: scores (1, 0, 0, invalid) → (1, 0, 0, 1/3); mean 1/3, squared deviations
    # 4/9 + 1/9 + 1/9 + 0 = 2/3 over n - 1 = 3 → std sqrt(2/9) = 0.4714 (valid rows only: sqrt(1/3)).
    s = torch.tensor([1.0, 0.0, 0.0, float("nan")])
    adv = group_advantages(s, ["a"] * 4, norm_by_std=True, eps=0.0, valid_N=torch.tensor([True, True, True, False]))
    assert adv.tolist() == pytest.approx([2 ** 0.5, -(0.5 ** 0.5), -(0.5 ** 0.5), 0.0], rel=1e-6)
    # the former rule (invalid rows outside the std) gave (2/3)/sqrt(1/3) = 1.1547 and -0.5774
    assert float(adv[0]) != pytest.approx(1.1547, rel=1e-3)
    # one valid row among two: filled group (2, 2) → advantage 0 (not the singleton rule's 2);
    # no valid row: the fill is 0 and every advantage 0
    adv = group_advantages(torch.tensor([2.0, 5.0, 7.0, 8.0]), ["b", "b", "c", "c"], norm_by_std=True,
                           valid_N=torch.tensor([True, False, False, False]))
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_aggregation_modes_hand_computed():
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # third row fully masked
    assert float(aggregate(v, m, "token-mean")) == pytest.approx(10 / 4)
    assert float(aggregate(v, m, "token-sum")) == pytest.approx(10)
    assert float(aggregate(v, m, "seq-mean-token-sum")) == pytest.approx((6 + 4) / 2)
    assert float(aggregate(v, m, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
    assert float(aggregate(v, m, "seq-mean-token-sum-norm")) == pytest.approx(10 / (2 * 3))
    # prompt-mean: rows 0,1 in group x (4 tokens), row 2 in y (no valid tokens: excluded)
    assert float(aggregate(v, m, "prompt-mean", group_ids_B=["x", "x", "y"])) == pytest.approx(10 / 4)
    v2 = torch.tensor([[1.0, 1.0], [3.0, 0.0]])
    m2 = torch.tensor([[1, 1], [1, 0]])
    assert float(aggregate(v2, m2, "prompt-mean", group_ids_B=["x", "y"])) == pytest.approx((1 + 3) / 2)


def test_ppo_clip_and_dual_clip_hand_computed():
    new = torch.log(torch.tensor([[1.5, 0.5, 1.0, 4.0]]))
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -1.0, 2.0, -1.0]])
    mask = torch.ones(1, 4)
    loss, m = policy_loss("ppo", new, old, adv, mask, agg="token-mean", clip_low=0.2, clip_high=0.2, clip_c=None)
    # per token: -min(rA, clip(r)A): [-1.2, +0.8, -2.0, +4.0] -> mean 0.4
    assert float(loss) == pytest.approx((-1.2 + 0.8 - 2.0 + 4.0) / 4)
    assert m["clipfrac"] == pytest.approx(2 / 4)  # tokens 0 and 1 are clipped
    loss, m = policy_loss("ppo", new, old, adv, mask, agg="token-mean", clip_low=0.2, clip_high=0.2, clip_c=3.0)
    assert float(loss) == pytest.approx((-1.2 + 0.8 - 2.0 + 3.0) / 4)  # dual clip caps token 3 at 3
    assert m["clipfrac_lower"] == pytest.approx(1 / 4)
    with pytest.raises(ValueError, match="unknown policy objective"):
        policy_loss("nope", new, old, adv, mask, agg="token-mean")
    with pytest.raises(TypeError, match="clip_c"):  # no second set of defaults: the config owns them
        policy_loss("ppo", new, old, adv, mask, agg="token-mean", clip_low=0.2, clip_high=0.2)
    with pytest.raises(ValueError, match="exactly one of agg"):
        policy_loss("ppo", new, old, adv, mask, clip_low=0.2, clip_high=0.2, clip_c=None)


def test_ppo_gradient_direction():
    lp = torch.log(torch.tensor([[0.3, 0.3]])).requires_grad_()
    loss, _ = policy_loss("ppo", lp, lp.detach(), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), agg="token-mean",
                          **objective_params(AlgoConfig()))
    loss.backward()
    assert lp.grad[0, 0] < 0 < lp.grad[0, 1]  # descent raises the good token, lowers the bad one


def test_trainer_micro_batches_equal_one_batch_and_row_weights_apply(lm):
    import copy

    from rlonce.core.records import TrainingRow
    from rlonce.train.request import RLRequest
    from rlonce.train.trainer import OptimSettings, Trainer, token_logprobs

    def rows(w0):
        out = []
        for b, n in enumerate((9, 14, 6, 11)):
            ids = [(7 * b + 3 * t) % 700 + 10 for t in range(n)]
            mask = [0, 0] + [1] * (n - 2)
            with torch.no_grad():  # rollout log-probs from the same weights: ratio 1, unclipped
                lp = [0.0] + token_logprobs(lm.model, torch.tensor([ids]),
                                            torch.ones(1, n, dtype=torch.long))[0][0].tolist()
            out.append(TrainingRow(ids, mask, [x * m for x, m in zip(lp, mask)],
                                   [(1.0 - 2 * (b % 2)) * m for m in mask], [0 if m else -1 for m in mask],
                                   weight=w0 if b == 0 else 1.0, group_id=str(b // 2)))
        return out

    grads = []
    for micro, w0 in ((1 << 20, 1.0), (20, 1.0), (1 << 20, 0.0)):
        model = copy.deepcopy(lm.model)
        tr = Trainer(model, OptimSettings(lr=0.0), micro_batch_tokens=micro)
        tr.optimizer.step = lambda: None  # keep the gradient for inspection
        tr.optimizer.zero_grad = lambda set_to_none=True: None
        tr.rl_step(rows(w0), RLRequest(objective="ppo", params={"clip_low": 0.2, "clip_high": 0.2, "clip_c": None},
                                       agg="prompt-mean", correction="none", correction_cap=2.0,
                                       geometric_bounds=(0.999, 1.001), kl_coef=0.0, topk_weight=0.0,
                                       routing_replay=True, qdq_align=False))
        grads.append(model.model.embed_tokens.weight.grad.clone())
    scale = grads[0].abs().max()
    assert scale > 1e-4
    assert (grads[0] - grads[1]).abs().max() < 1e-5 * scale  # micro-batching changes nothing
    assert (grads[0] - grads[2]).abs().max() > 1e-2 * scale  # a zero-weight row contributes nothing


def test_trainer_rollout_correction_and_objectives_by_name(lm):
    import copy

    from rlonce.core.records import TrainingRow
    from rlonce.train.request import RLRequest
    from rlonce.train.trainer import OptimSettings, Trainer, token_logprobs

    def rows(shift):
        out = []
        for b, n in enumerate((9, 12)):
            ids = [(5 * b + 3 * t) % 700 + 10 for t in range(n)]
            mask = [0, 0] + [1] * (n - 2)
            with torch.no_grad():
                lp = [0.0] + token_logprobs(lm.model, torch.tensor([ids]),
                                            torch.ones(1, n, dtype=torch.long))[0][0].tolist()
            out.append(TrainingRow(ids, mask, [(x - shift) * m for x, m in zip(lp, mask)],
                                   [(1.0 - 2 * b) * m for m in mask], [0 if m else -1 for m in mask], group_id="g"))
        return out

    def grad(rs, objective="ppo", correction="none", correction_cap=2.0):
        model = copy.deepcopy(lm.model)
        tr = Trainer(model, OptimSettings(lr=0.0))
        tr.optimizer.step = lambda: None
        tr.optimizer.zero_grad = lambda set_to_none=True: None
        m = tr.rl_step(rs, RLRequest(objective=objective, params=objective_params(AlgoConfig(objective=objective)),
                                     agg="token-mean", correction=correction, correction_cap=correction_cap,
                                     geometric_bounds=(0.999, 1.001), kl_coef=0.0, topk_weight=0.0,
                                     routing_replay=True, qdq_align=False))
        return model.model.embed_tokens.weight.grad.clone(), m

    plain, _ = grad(rows(0.0))
    same, m = grad(rows(0.0), correction="token", correction_cap=2.0)
    # rollout log-probs equal the trainer's: every IS weight is 1, the update is unchanged
    assert m["correction_weight_mean"] == pytest.approx(1.0, abs=1e-4) and m["correction_capped_frac"] == 0.0
    assert (plain - same).abs().max() < 1e-4 * plain.abs().max()
    # the rollout engine thought every token 2× less likely: weights e^0.69 = 2 hit the cap of 1.5
    _, m = grad(rows(0.6931), correction="token", correction_cap=1.5)
    assert m["correction_capped_frac"] == pytest.approx(1.0) and m["correction_weight_mean"] == pytest.approx(1.5)
    for name in ("four_bound", "cispo", "unified"):
        g, m = grad(rows(0.0), objective=name)
        assert (g - plain).abs().max() < 1e-4 * plain.abs().max(), name  # ratio 1: all equal PPO's gradient
        assert m["clipfrac"] == 0.0
