"""The pure builders give each part of a run its settings from the resolved config."""

from rlonce.config import load_config
from rlonce.train.builders import optim_settings, rl_request
from rlonce.train.request import RLRequest


def test_optim_settings_follow_the_named_optimizer():
    cfg = load_config(None, ["rl.optimizer=adamw-m1", "rl.lr=3e-4"])
    o = optim_settings(cfg.rl)
    assert (o.lr, o.betas, o.eps, o.max_grad_norm) == (3e-4, (0.9, 0.95), 1e-15, 1.0)
    assert optim_settings(load_config(None, ["rl.adam_eps=1e-6"]).rl).eps == 1e-6


def test_rl_request_carries_the_objective_and_the_controller_bounds():
    cfg = load_config(None, ["rl.minibatches=4"])
    request = rl_request(cfg, 3, step=7, version=2)
    assert request == RLRequest(objective="ppo", params={"clip_low": 0.2, "clip_high": 0.28, "clip_c": 3.0},
                                agg="prompt-mean", minibatches=3, seed=7, correction="none", correction_cap=2.0,
                                geometric_bounds=(0.999, 1.001), kl_coef=0.0, topk_weight=0.0,
                                routing_replay=True, qdq_align=False, version=2)
    four = load_config(None, ["algo.objective=four_bound"])
    request = rl_request(four, 10, step=1, version=0, bounds={"pos_high": 4.0})
    assert request.objective == "four_bound" and request.params["pos_high"] == 4.0 and request.params["neg_high"] == 5.0
