"""The pure builders give each part of a run its settings from the resolved config."""

from rlonce.config import load_config
from rlonce.train.builders import optim_settings, rl_step_kwargs


def test_optim_settings_follow_the_named_optimizer():
    cfg = load_config(None, ["rl.optimizer=adamw-m1", "rl.lr=3e-4"])
    o = optim_settings(cfg.rl)
    assert (o.lr, o.betas, o.eps, o.max_grad_norm) == (3e-4, (0.9, 0.95), 1e-15, 1.0)
    assert optim_settings(load_config(None, ["rl.adam_eps=1e-6"]).rl).eps == 1e-6


def test_rl_step_kwargs_carry_the_objective_and_the_controller_bounds():
    cfg = load_config(None, ["rl.minibatches=4"])
    kw = rl_step_kwargs(cfg, 3, step=7, version=2)
    assert kw == {"objective": "ppo", "agg": "prompt-mean", "minibatches": 3, "seed": 7, "correction": "none",
                  "correction_cap": 2.0, "geometric_bounds": (0.999, 1.001), "kl_coef": 0.0, "version": 2,
                  "clip_low": 0.2, "clip_high": 0.28, "clip_c": 3.0}
    four = load_config(None, ["algo.objective=four_bound"])
    kw = rl_step_kwargs(four, 10, step=1, version=0, bounds={"pos_high": 4.0})
    assert kw["objective"] == "four_bound" and kw["pos_high"] == 4.0 and kw["neg_high"] == 5.0
