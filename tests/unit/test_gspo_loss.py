"""GSPO (``algo.objective = "gspo"``): verl 0.9.1's numbers on a seeded batch, the ratio-1 and
hand-computed cases, and one trainer step on the embedded model.

The reference numbers were produced on 2026-12-06 by verl 0.9.1 (from PyPI, in a separate venv
with torch 2.13.0+cpu): the function registered as "gspo",
``verl.trainer.ppo.core_algos.compute_policy_loss_gspo``, called with an ``FSDPActorConfig``
(``rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss.loss_mode="gspo"``, the clip bounds
and ``loss_agg_mode`` below, empty ``global_batch_info``) on the inputs of ``_seeded_batch``::

    fn = get_policy_loss_fn("gspo")
    for lo, hi, agg in ((3e-4, 4e-4, "seq-mean-token-mean"), (0.2, 0.2, "token-mean")):
        cfg = FSDPActorConfig(rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=lo,
                              clip_ratio_high=hi, loss_agg_mode=agg,
                              policy_loss=PolicyLossConfig(loss_mode="gspo"))
        lp = logp.clone().requires_grad_()
        loss, m = fn(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask,
                     loss_agg_mode=agg, config=cfg)
        loss.backward()   # recorded: loss.item(), lp.grad, m["actor/pg_clipfrac"]
"""

import copy
import math

import pytest
import torch

from rlonce.algo import policy_loss
from rlonce.config import AlgoConfig, load_config, objective_params

VERL = {
    # (clip_ratio_low, clip_ratio_high, loss_agg_mode): (loss, pg_clipfrac, d loss / d log_prob)
    (3e-4, 4e-4, "seq-mean-token-mean"): (0.2518206238746643, 0.30000001192092896, [
        [0.039271828] * 7,
        [-0.024597986] * 5 + [0.0] * 2,
        [-0.10000115] * 2 + [0.0] * 5,
        [0.0] * 7,
    ]),
    (0.2, 0.2, "token-mean"): (0.49484091997146606, 0.0, [
        [0.054980557] * 7,
        [-0.024597986] * 5 + [0.0] * 2,
        [-0.040000461] * 2 + [0.0] * 5,
        [0.052161306] * 6 + [0.0],
    ]),
}
"""verl 0.9.1's loss, clip fraction and gradient on ``_seeded_batch`` (its sequence ratios:
1.09961116, 0.98391938, 1.00001144, 0.86935508)."""


def _seeded_batch():
    """B=4 rows of T=7 with lengths 7, 5, 2, 6; old log-probs within ±0.3 of the new ones, row 2's
    within ±3e-5 (its sequence ratio stays inside the paper's clip range); advantages -1, 0.5, 0.8,
    -1.2 per row."""
    g = torch.Generator().manual_seed(0)
    B, T = 4, 7
    mask = (torch.arange(T)[None, :] < torch.tensor([7, 5, 2, 6])[:, None]).float()
    logp = -(torch.rand(B, T, generator=g) * 2 + 0.1)
    delta = (torch.rand(B, T, generator=g) * 2 - 1) * 0.3
    delta[2] *= 1e-4
    adv = torch.tensor([-1.0, 0.5, 0.8, -1.2])[:, None].expand(B, T).contiguous()
    return logp, logp + delta, adv, mask


def _run(lp, old, adv, mask, **kw):
    lp = lp.clone().requires_grad_()
    loss, m = policy_loss("gspo", lp, old, adv, mask, **kw)
    loss.backward()
    return float(loss.detach()), lp.grad, m


@pytest.mark.parametrize("key", list(VERL))
def test_matches_verl_0_9_1_loss_and_gradient(key):
    logp, old, adv, mask = _seeded_batch()
    # the same generator draws as the recorded run (torch's CPU generator): else the numbers mean nothing
    assert (logp.sum().item(), old.sum().item()) == pytest.approx((-29.65083885192871, -29.709163665771484),
                                                                  abs=1e-6)
    lo, hi, agg = key
    want_loss, want_clipfrac, want_grad = VERL[key]
    loss, grad, m = _run(logp, old, adv, mask, agg=agg, clip_low=lo, clip_high=hi)
    assert loss == pytest.approx(want_loss, abs=1e-5)
    assert torch.allclose(grad, torch.tensor(want_grad), atol=1e-5, rtol=0)
    assert m["clipfrac"] == pytest.approx(want_clipfrac, abs=1e-6)


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean", "prompt-mean"])
def test_at_identical_weights_the_ratio_is_1_and_the_loss_is_minus_the_mean_advantage(agg):
    logp, _, adv, mask = _seeded_batch()
    groups = ["a", "a", "b", "b"]
    loss, grad, m = _run(logp, logp, adv, mask, agg=agg, group_ids_B=groups, clip_low=3e-4, clip_high=4e-4)
    per_row = adv[:, 0]
    n = mask.sum(-1)
    want = {"seq-mean-token-mean": per_row.mean(),
            "token-mean": (per_row * n).sum() / n.sum(),
            "prompt-mean": ((per_row[:2] * n[:2]).sum() / n[:2].sum() + (per_row[2:] * n[2:]).sum() / n[2:].sum()) / 2}
    assert loss == pytest.approx(-float(want[agg]), rel=1e-6)
    # s = 1: each valid token's gradient is -A times its aggregation weight
    if agg == "seq-mean-token-mean":
        assert torch.allclose(grad, -adv * mask / n[:, None] / 4, atol=1e-7)
    assert m["clipfrac"] == 0.0 and m["ppo_kl"] == 0.0


def test_two_sequences_one_clipped_as_a_whole():
    # row 0 (A = +1): log-ratios 0.2, 0.0 → s = e^0.1 = 1.10517 > 1 + 0.05: clipped, no gradient on
    #   either token, though token 1's own ratio is exactly 1
    # row 1 (A = -0.5): log-ratios 0.06, -0.03, 0.0 → s = e^0.01 = 1.01005, inside [0.95, 1.05]
    old = torch.full((2, 3), math.log(0.5))
    lp = old + torch.tensor([[0.2, 0.0, 0.0], [0.06, -0.03, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-0.5, -0.5, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, grad, m = _run(lp, old, adv, mask, agg="seq-mean-token-mean", clip_low=0.05, clip_high=0.05)
    s1 = math.exp(0.01)
    # seq-mean-token-mean: (row 0's -A·1.05 + row 1's -A·s1) / 2 rows
    assert loss == pytest.approx((-1.05 + 0.5 * s1) / 2, rel=1e-6)
    # row 1's tokens: d(-A·s_t)/d log π_t = -A·s1, weighted 1 / (3 tokens · 2 rows)
    assert torch.allclose(grad, torch.tensor([[0.0, 0.0, 0.0], [0.5 * s1 / 6] * 3]), atol=1e-7, rtol=0)
    assert m["clipfrac"] == pytest.approx(2 / 5)
    # PPO clips per token: row 0's token 1 (ratio 1) keeps its gradient there
    lp_ppo = lp.clone().requires_grad_()
    policy_loss("ppo", lp_ppo, old, adv, mask, agg="seq-mean-token-mean", clip_low=0.05, clip_high=0.05,
                clip_c=None)[0].backward()
    assert lp_ppo.grad[0, 1] == pytest.approx(-1 / 4)


def test_log_ratio_capped_at_10_and_padding_never_leaks():
    # a row whose mean log-ratio is 12 with A < 0: the value is e^10 per token, and no gradient
    old = torch.tensor([[-20.0, -20.0]])
    lp = torch.tensor([[-8.0, -8.0]])
    loss, grad, _ = _run(lp, old, torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2), agg="token-mean",
                         clip_low=3e-4, clip_high=4e-4)
    assert loss == pytest.approx(math.exp(10.0), rel=1e-6) and grad.abs().max() == 0
    # garbage at masked positions (an infinite rollout log-prob, a huge new one) changes nothing
    logp, old, adv, mask = _seeded_batch()
    dirty_lp, dirty_old = logp.clone(), old.clone()
    dirty_lp[mask == 0], dirty_old[mask == 0] = 50.0, -math.inf
    clean = _run(logp, old, adv, mask, agg="token-mean", clip_low=0.2, clip_high=0.2)
    dirty = _run(dirty_lp, dirty_old, adv, mask, agg="token-mean", clip_low=0.2, clip_high=0.2)
    assert dirty[0] == clean[0] and torch.equal(dirty[1], clean[1])


def test_config_selects_gspo_with_the_papers_bounds():
    cfg = load_config(None, ["algo.objective=gspo", "algo.aggregation=seq-mean-token-mean"])
    assert objective_params(cfg.algo) == {"clip_low": 3e-4, "clip_high": 4e-4}
    cfg = load_config(None, ["algo.objective=gspo", "algo.objective.clip_high=1e-3"])
    assert (cfg.algo.objective.name, cfg.algo.objective.clip_low, cfg.algo.objective.clip_high) == ("gspo", 3e-4, 1e-3)
    # the loss descends the right way at its defaults
    _, g, _ = _run(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2),
                   agg="token-mean", **objective_params(AlgoConfig(objective="gspo")))
    assert g[0, 0] < 0 < g[0, 1]


def test_trainer_step_with_gspo(lm):
    """At ratio 1 GSPO's gradient is PPO's; one real step raises the positive row's log-probs and
    lowers the negative row's."""
    from rlonce.core.records import TrainingRow
    from rlonce.train.request import RLRequest
    from rlonce.train.trainer import OptimSettings, Trainer, token_logprobs

    def logprobs(model, ids):
        with torch.no_grad():
            lp, _ = token_logprobs(model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
        return [0.0] + lp[0].tolist()

    batch = []
    for b, n in enumerate((9, 12)):
        ids = [(104 * b + 11 * t) % 700 + 10 for t in range(n)]
        mask = [0, 0] + [1] * (n - 2)
        batch.append(TrainingRow(ids, mask, [x * m for x, m in zip(logprobs(lm.model, ids), mask)],
                                 [(1.0 - 2 * b) * m for m in mask], [0 if m else -1 for m in mask], group_id="g"))

    def request(name):
        return RLRequest(objective=name, params=objective_params(AlgoConfig(objective=name)),
                         agg="seq-mean-token-mean", correction="none", correction_cap=2.0,
                         geometric_bounds=(0.999, 1.001), kl_coef=0.0, topk_weight=0.0,
                         routing_replay=True, qdq_align=False)

    grads = {}
    for name in ("ppo", "gspo"):
        model = copy.deepcopy(lm.model)
        tr = Trainer(model, OptimSettings(lr=0.0))
        tr.optimizer.step = lambda: None  # keep the gradient for inspection
        tr.optimizer.zero_grad = lambda set_to_none=True: None
        metrics = tr.rl_step(batch, request(name))
        grads[name] = model.model.embed_tokens.weight.grad.clone()
    scale = grads["ppo"].abs().max()
    assert scale > 1e-6 and (grads["gspo"] - grads["ppo"]).abs().max() < 1e-4 * scale
    assert metrics["clipfrac"] == 0.0  # gspo's, at its 3e-4 / 4e-4 bounds

    model = copy.deepcopy(lm.model)
    before = [p.detach().clone() for p in model.parameters()]
    Trainer(model, OptimSettings(lr=1e-4)).rl_step(batch, request("gspo"))
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), before))
    # mean log-ratio per row after the step (log s): +0.87 and -0.93 when written
    moved = [sum(logprobs(model, r.token_ids)[t] - r.rollout_logprobs[t] for t in range(len(r)) if r.loss_mask[t])
             / sum(r.loss_mask) for r in batch]
    assert moved[0] > 0.1 and moved[1] < -0.1
