"""What one RL step asks of the trainer: the objective and how its loss is formed, as one value.

``rlonce.train.builders.rl_request`` builds it from the config; it travels through the trainer
backend (``TrainerBackend.train``) to ``Trainer.rl_step``, pickled to the Ray trainer actors on
the way, so it holds plain values and imports without torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class RLRequest:
    """``Trainer.rl_step``'s settings for one step. The loss fields come from the config
    (``algo.*``) and have no defaults here."""

    objective: str
    """The per-token objective's name in ``rlonce.algo.losses`` (``algo.objective.name``)."""
    params: Mapping[str, float | None]
    """The objective's parameters, all of them (``rlonce.config.objective_params``); an
    entropy-bound controller's current bounds replace the configured ones."""
    agg: str
    """How per-token losses are aggregated (``algo.aggregation``); the weights are taken over the
    whole mini-batch."""
    correction: str
    """Rollout correction (``algo.rollout_correction``). With 'none' the ratio's denominator is the
    rollout log-prob. With another mode the trainer first recomputes every row's log-probs under
    the weights it holds before the update (π_old); the correction
    (``rlonce.algo.rollout_correction``) then weights each token's loss and may mask tokens or
    whole rows, which leave the loss masks before the mini-batches are formed
    (``rlonce.train.row_terms``); the ratio is taken against π_old."""
    correction_cap: float
    """The correction's cap on importance weights (``algo.correction_cap``)."""
    geometric_bounds: tuple[float, float]
    """The 'geometric' correction's bounds on a row's mean ratio (``algo.geometric_low``/``high``)."""
    kl_coef: float
    """With ``kl_coef`` > 0 the loss gains ``kl_coef`` times the k3 estimate of KL(π_θ ‖ π_ref)
    under the aggregation's weights (``rlonce.algo.losses.kl_k3``; metric ``kl``). π_ref is a
    frozen copy of the weights the trainer held at its first step with KL on — the policy RL
    starts from — kept in its ``state_dict`` so that a resumed run measures against the same
    reference; its log-probs cost one more forward per row."""
    topk_weight: float
    """With ``topk_weight`` > 0, rows that carry their teacher's top-k (``distill.topk``) add
    ``topk_weight`` times the per-token KL from the teacher over those k tokens and the tail
    (``rlonce.algo.losses.topk_kl``; ``distill.topk_weight``), under the aggregation's weights."""
    routing_replay: bool
    """A sparse policy's forwards route each token to the experts the rollout recorded for it (R3,
    ``model.routing_replay``; ``rlonce.model.moe``); off, they route as the trainer's routers say
    (the expert-load metrics still count how many tokens would have changed). Dense: no effect."""
    qdq_align: bool
    """The experts' forward runs on their MXFP4 quantize-dequantize with a straight-through gradient
    (``model.qdq_align`` with ``model.rollout_quant = "mxfp4"``; ``rlonce.model.mxfp4.align``), the
    function the rollout engine sampled from."""
    minibatches: int = 1
    """Optimizer steps in this step: each on a seeded share of whole prompt groups
    (``rlonce.train.minibatch``)."""
    seed: int = 0
    """The seed of that split into mini-batches."""
    version: int | None = None
    """The policy version the trainer's weights are. With it, the train/inference mismatch is
    measured on the trained tokens that version sampled: the trainer's log-probs — recomputed for
    all rows when ``correction`` is on, else those of the first mini-batch's forward, before any
    update — against the rollout log-probs (``mismatch_metrics``); and the backend counts the
    trained rows by version lag."""
