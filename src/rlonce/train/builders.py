"""Pure builders: the trainer-side settings of a run from its resolved config."""

from __future__ import annotations

from rlonce.config import OPTIMIZERS, RLConfig, RunConfig, objective_params
from rlonce.train.request import RLRequest
from rlonce.train.trainer import OptimSettings


def optim_settings(r: RLConfig, freeze_router: bool = False) -> OptimSettings:
    """AdamW for the RL phase: ``rl.optimizer`` names β and ε (``rl.adam_eps`` overrides ε),
    ``rl.lr_schedule`` 'cosine' decays over ``steps`` × ``minibatches`` optimizer steps;
    ``freeze_router`` (``model.freeze_router``) keeps a sparse model's routers out of it."""
    adam = OPTIMIZERS[r.optimizer]
    return OptimSettings(lr=r.lr, warmup_steps=r.warmup_steps, weight_decay=r.weight_decay,
                         total_steps=r.steps * r.minibatches if r.lr_schedule == "cosine" else 0,
                         max_grad_norm=r.max_grad_norm, betas=adam["betas"], eps=r.adam_eps or adam["eps"],
                         freeze_router=freeze_router)


def rl_request(cfg: RunConfig, n_rows: int, step: int, version: int, bounds: dict | None = None) -> RLRequest:
    """What ``Trainer.rl_step`` is asked for one step of ``n_rows`` rows: the objective with its
    parameters (``bounds`` from an entropy-bound controller replace its bounds), the aggregation,
    the mini-batch count (at most one per row) seeded by ``step``, rollout correction, the KL
    term's coefficient, the version."""
    a = cfg.algo
    return RLRequest(objective=a.objective.name, params=objective_params(a) | (bounds or {}), agg=a.aggregation,
                     minibatches=min(cfg.rl.minibatches, n_rows), seed=step, correction=a.rollout_correction,
                     correction_cap=a.correction_cap, geometric_bounds=(a.geometric_low, a.geometric_high),
                     kl_coef=a.kl_coef, topk_weight=cfg.distill.topk_weight if cfg.distill.topk else 0.0,
                     routing_replay=cfg.model.routing_replay,
                     qdq_align=cfg.model.qdq_align and cfg.model.rollout_quant == "mxfp4", version=version)
