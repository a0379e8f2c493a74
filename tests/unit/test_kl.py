"""The optional KL term: the k3 estimator by hand, and the trainer's frozen reference policy."""

import copy
import math

import pytest
import torch

from rlonce.algo.losses import kl_k3
from rlonce.config import AlgoConfig, ConfigError, load_config, objective_params
from rlonce.core.records import TrainingRow
from rlonce.train.request import RLRequest
from rlonce.train.trainer import OptimSettings, Trainer, token_logprobs


def test_k3_by_hand():
    lp = torch.log(torch.tensor([[0.5, 0.5, 0.2]])).requires_grad_()
    ref = torch.log(torch.tensor([[0.25, 0.5, 0.8]]))
    k = kl_k3(lp, ref, torch.tensor([[1, 1, 0]]))
    # d = log(0.25/0.5) = -ln 2: e^d - d - 1 = 0.5 + ln 2 - 1 = 0.19315; equal probabilities: 0; masked: 0
    assert k.tolist()[0] == pytest.approx([0.5 + math.log(2) - 1, 0.0, 0.0], abs=1e-6)
    k.sum().backward()
    # d/d log π of e^d - d - 1 = 1 - e^d = 0.5: descent lowers log π toward the reference's
    assert lp.grad.tolist()[0] == pytest.approx([0.5, 0.0, 0.0], abs=1e-6)
    # k3 is never negative, unlike k1 = -d
    d = torch.linspace(-3, 3, 13)[None]
    assert (kl_k3(torch.zeros_like(d), d, torch.ones_like(d)) >= 0).all()
    # the ceiling: d = 3 → e^3 - 4 = 16.09 → 10, with no gradient; d = 2 → e^2 - 3 = 4.389 stays
    lp = torch.zeros(1, 3, requires_grad=True)
    k = kl_k3(lp, torch.tensor([[3.0, 2.0, 100.0]]), torch.ones(1, 3))
    assert k.tolist()[0] == pytest.approx([10.0, math.exp(2) - 3, 10.0], abs=1e-5)
    k.sum().backward()
    assert lp.grad.tolist()[0] == pytest.approx([0.0, 1 - math.exp(2), 0.0], abs=1e-5)  # finite, even at d = 100


def _rows(lm) -> list[TrainingRow]:
    out = []
    for b, n in enumerate((9, 12)):
        ids = [(5 * b + 3 * t) % 700 + 10 for t in range(n)]
        mask = [0, 0] + [1] * (n - 2)
        with torch.no_grad():
            lp = token_logprobs(lm.model, torch.tensor([ids]), torch.ones(1, n, dtype=torch.long))[0][0].tolist()
        out.append(TrainingRow(ids, mask, [x * m for x, m in zip([0.0] + lp, mask)], [0.0] * n,
                               [0 if m else -1 for m in mask], group_id="g"))
    return out


def _step(tr: Trainer, rows, kl_coef: float) -> dict:
    return tr.rl_step(rows, RLRequest(objective="ppo", params=objective_params(AlgoConfig()), agg="token-mean",
                                      correction="none", correction_cap=2.0, geometric_bounds=(0.999, 1.001),
                                      kl_coef=kl_coef, topk_weight=0.0,
                                      routing_replay=True, qdq_align=False, version=0))


def _mean_k3(model, ref, rows) -> float:
    vals = []
    for r in rows:
        ids = torch.tensor([r.token_ids])
        attn = torch.ones_like(ids)
        with torch.no_grad():
            lp, lr = token_logprobs(model, ids, attn)[0], token_logprobs(ref, ids, attn)[0]
        vals.append(kl_k3(lp, lr, torch.tensor([r.loss_mask[1:]]))[0])
    return float(torch.cat(vals).sum() / sum(sum(r.loss_mask) for r in rows))


def test_the_kl_term_pulls_the_policy_back_to_the_reference(lm):
    rows = _rows(lm)  # zero advantages: the KL term is the whole loss
    model = copy.deepcopy(lm.model)
    tr = Trainer(model, OptimSettings(lr=1e-5))
    assert tr.reference is None and "reference" not in tr.state_dict()
    m = _step(tr, rows, kl_coef=0.5)  # the first step with KL on freezes the reference: the weights held now
    assert m["kl"] == pytest.approx(0.0, abs=1e-9) and m["grad_norm"] == pytest.approx(0.0, abs=1e-9)
    assert m["mismatch_tokens"] == 17.0  # the mismatch is still measured on every trained token (7 + 10)
    ref_state = {k: v.clone() for k, v in tr.reference.state_dict().items()}
    torch.manual_seed(0)
    with torch.no_grad():  # move the policy away from the reference
        model.model.embed_tokens.weight.add_(0.02 * torch.randn_like(model.model.embed_tokens.weight))
    before = _mean_k3(model, tr.reference, rows)
    assert before > 1e-3
    m = _step(tr, rows, kl_coef=0.5)
    assert m["kl"] == pytest.approx(before, rel=1e-4)  # the metric: mean k3 over the trained tokens
    after = _mean_k3(model, tr.reference, rows)
    assert after < 0.9 * before  # the update moved toward the reference (0.120 → 0.092 here)
    assert all(torch.equal(v, ref_state[k]) for k, v in tr.reference.state_dict().items())  # never trained
    # a resumed trainer measures against the saved reference, not against the weights it resumes with
    state = tr.state_dict()
    fresh = Trainer(copy.deepcopy(model), OptimSettings(lr=1e-5))
    fresh.load_state_dict(state)
    assert all(torch.equal(v, ref_state[k]) for k, v in fresh.reference.state_dict().items())
    assert _step(fresh, rows, kl_coef=0.5)["kl"] == pytest.approx(after, rel=1e-4)


def test_kl_is_off_by_default_and_needs_one_trainer_process():
    assert load_config(None, []).algo.kl_coef == 0.0
    with pytest.raises(ConfigError, match="ray.trainer_workers = 1"):
        load_config(None, ["algo.kl_coef=0.01", "executor=ray", "ray.trainer_workers=2"])
