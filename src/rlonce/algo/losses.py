"""Per-token policy objectives and their aggregation, looked up by name.

A per-token objective maps (new log-probs, rollout log-probs, advantages, mask) to a loss per
token; aggregation reduces it to a scalar. Every aggregation mode is linear in the per-token
values, so it is computed as ``sum(w_BT * values_BT)`` with weights taken once over the whole
mini-batch (``aggregation_weights``) — which keeps gradient accumulation over micro-batches
exact for every mode, not only token-mean.

The objectives' parameters have no defaults here: ``rlonce.config`` (``algo.objective``) owns
them, so a value is stated once and a caller that forgets one gets an error, not a second value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def _nonempty(mask_BT: torch.Tensor) -> torch.Tensor:
    return mask_BT.sum(-1) > 0


def _w_token_mean(mask_BT, group_ids_B):
    return mask_BT / mask_BT.sum().clamp(min=1)


def _w_token_sum(mask_BT, group_ids_B):
    return mask_BT.clone()


def _w_seq_mean_token_sum(mask_BT, group_ids_B):
    return mask_BT / _nonempty(mask_BT).sum().clamp(min=1)


def _w_seq_mean_token_mean(mask_BT, group_ids_B):
    per_row = mask_BT / mask_BT.sum(-1, keepdim=True).clamp(min=1)
    return per_row / _nonempty(mask_BT).sum().clamp(min=1)


def _w_seq_mean_token_sum_norm(mask_BT, group_ids_B):
    return mask_BT / (_nonempty(mask_BT).sum().clamp(min=1) * mask_BT.shape[-1])


def _w_prompt_mean(mask_BT, group_ids_B):
    if group_ids_B is None:
        raise ValueError("prompt-mean aggregation needs group_ids_B")
    w = torch.zeros_like(mask_BT)
    groups: dict = {}
    for b, g in enumerate(group_ids_B):
        groups.setdefault(g, []).append(b)
    live = [rows for rows in groups.values() if mask_BT[rows].sum() > 0]
    for rows in live:
        w[rows] = mask_BT[rows] / mask_BT[rows].sum()
    return w / max(len(live), 1)


AGGREGATIONS: dict[str, Callable] = {
    "token-mean": _w_token_mean,
    "token-sum": _w_token_sum,
    "seq-mean-token-sum": _w_seq_mean_token_sum,
    "seq-mean-token-mean": _w_seq_mean_token_mean,
    "seq-mean-token-sum-norm": _w_seq_mean_token_sum_norm,
    "prompt-mean": _w_prompt_mean,
}


def aggregation_weights(mask_BT: torch.Tensor, mode: str, *, group_ids_B: Sequence | None = None) -> torch.Tensor:
    try:
        fn = AGGREGATIONS[mode]
    except KeyError:
        raise ValueError(f"unknown aggregation {mode!r}; known: {sorted(AGGREGATIONS)}") from None
    return fn(mask_BT.float(), group_ids_B)


def aggregate(values_BT: torch.Tensor, mask_BT: torch.Tensor, mode: str, *, group_ids_B: Sequence | None = None):
    return (aggregation_weights(mask_BT, mode, group_ids_B=group_ids_B) * values_BT).sum()


def _masked_mean(x_BT, mask_BT):
    return (x_BT * mask_BT).sum() / mask_BT.sum().clamp(min=1)


LOG_RATIO_BOUND = 20.0
"""Bound on one token's log-ratio where a mean of them is reported (``ppo_kl``) or exponentiated
(``kl_k3``), verl's ``±20``: one token whose probability collapsed would otherwise set the mean."""


def _ppo_kl(logprobs_BT, old_logprobs_BT, mask_BT):
    """The ``ppo_kl`` metric: mean ``log μ − log π`` over valid tokens, each clamped to
    ``±LOG_RATIO_BOUND`` first, as verl reports it. Only the metric: losses use the exact ratio."""
    return _masked_mean((old_logprobs_BT - logprobs_BT).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND), mask_BT)


def _ratio(logprobs_BT, old_logprobs_BT, mask_BT):
    """``π/μ`` on valid tokens, 1 elsewhere — so padding can never overflow into a NaN."""
    return torch.exp(torch.where(mask_BT > 0, logprobs_BT - old_logprobs_BT, torch.zeros_like(logprobs_BT)))


def ppo_token_loss(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, *, clip_low: float, clip_high: float,
                   clip_c: float | None):
    """PPO clip (seed 001, "The equation only works if the history is true", the public vanilla
    loss): ``-min(r·A, clip(r, 1-clip_low, 1+clip_high)·A)``. ``clip_high > clip_low`` is DAPO's
    clip-higher. With ``clip_c`` (dual clip) a negative-advantage token's loss is at most
    ``-clip_c·A``, so a huge ratio cannot blow up a penalty."""
    mask_BT = mask_BT.float()
    ratio_BT = _ratio(logprobs_BT, old_logprobs_BT, mask_BT)
    unclipped_BT = -advantages_BT * ratio_BT
    clipped_BT = -advantages_BT * ratio_BT.clamp(1 - clip_low, 1 + clip_high)
    loss_BT = torch.maximum(unclipped_BT, clipped_BT)
    with torch.no_grad():
        metrics = {
            "clipfrac": _masked_mean((clipped_BT > unclipped_BT).float(), mask_BT),
            "ppo_kl": _ppo_kl(logprobs_BT, old_logprobs_BT, mask_BT),
        }
    if clip_c is not None:
        if clip_c <= 1:
            raise ValueError(f"dual clip needs clip_c > 1, got {clip_c}")
        dual_BT = -advantages_BT * clip_c
        bind_BT = (advantages_BT < 0) & (loss_BT > dual_BT)
        loss_BT = torch.where(advantages_BT < 0, torch.minimum(loss_BT, dual_BT), loss_BT)
        metrics["clipfrac_lower"] = _masked_mean(bind_BT.float(), mask_BT).detach()
    return loss_BT * mask_BT, {k: float(v) for k, v in metrics.items()}


def four_bound_token_loss(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, *, pos_low: float, pos_high: float,
                          neg_low: float, neg_high: float):
    """MiMo's production rule (seed 001, same section): ``-sg(r)·A·log π`` with ``r = π/μ``, and a
    token is masked when its ratio leaves the interval for its advantage sign —
    ``[pos_low, pos_high]`` for A > 0, ``[neg_low, neg_high]`` for A < 0. These are ratio
    intervals (both start at [0.2, 5.0]), not ``1 ± ε``. Masked tokens pass no gradient."""
    for lo, hi, side in ((pos_low, pos_high, "positive"), (neg_low, neg_high, "negative")):
        if not 0 <= lo < 1 < hi:
            raise ValueError(f"four_bound {side} interval [{lo}, {hi}] must satisfy 0 <= low < 1 < high")
    mask_BT = mask_BT.float()
    ratio_BT = _ratio(logprobs_BT, old_logprobs_BT, mask_BT).detach()
    pos_BT, neg_BT = advantages_BT > 0, advantages_BT < 0
    out = {
        "pos_low": pos_BT & (ratio_BT < pos_low), "pos_high": pos_BT & (ratio_BT > pos_high),
        "neg_low": neg_BT & (ratio_BT < neg_low), "neg_high": neg_BT & (ratio_BT > neg_high),
    }
    dropped_BT = out["pos_low"] | out["pos_high"] | out["neg_low"] | out["neg_high"]
    keep_BT = mask_BT * (~dropped_BT).float()
    loss_BT = -ratio_BT * advantages_BT * logprobs_BT * keep_BT
    with torch.no_grad():
        metrics = {"clipfrac": _masked_mean(dropped_BT.float(), mask_BT),
                   "ppo_kl": _ppo_kl(logprobs_BT, old_logprobs_BT, mask_BT)}
        for name, hit_BT in out.items():
            sign_BT = mask_BT * (pos_BT if name.startswith("pos") else neg_BT).float()
            metrics[f"clip_{name}"] = _masked_mean(hit_BT.float(), sign_BT)
    return loss_BT, {k: float(v) for k, v in metrics.items()}


def _cispo_weight(ratio_BT, eps_low: float, eps_high: float):
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"CISPO needs eps_low, eps_high >= 0, got {eps_low}, {eps_high}")
    return ratio_BT.detach().clamp(min=1 - eps_low, max=1 + eps_high)


def cispo_token_loss(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, *, eps_low: float, eps_high: float):
    """CISPO (MiniMax-M1 §3.1, Eq. 4–5): ``-sg(clip(r, 1-eps_low, 1+eps_high))·A·log π``. The
    importance weight is clipped, the token is never dropped: every token keeps a gradient.
    M1 imposes no lower bound (``eps_low`` large; 1.0 puts it at 0) and tunes only
    ``eps_high``; the config's 0.28 matches DAPO's clip-higher so a comparison isolates clip-the-weight
    against drop-the-token."""
    mask_BT = mask_BT.float()
    ratio_BT = _ratio(logprobs_BT, old_logprobs_BT, mask_BT)
    w_BT = _cispo_weight(ratio_BT, eps_low, eps_high)
    loss_BT = -w_BT * advantages_BT * logprobs_BT * mask_BT
    with torch.no_grad():
        clipped_BT = (ratio_BT < 1 - eps_low) | (ratio_BT > 1 + eps_high)
        metrics = {"clipfrac": _masked_mean(clipped_BT.float(), mask_BT),
                   "ppo_kl": _ppo_kl(logprobs_BT, old_logprobs_BT, mask_BT)}
    return loss_BT, {k: float(v) for k, v in metrics.items()}


def unified_token_loss(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, *, eps_low: float, eps_high: float,
                       mask_low: float, mask_high: float):
    """M1's unified form (Eq. 6–7): CISPO times a token mask ``M`` that is 0 where
    ``A > 0 and r > 1 + mask_high`` or ``A < 0 and r < 1 - mask_low`` (the PPO trust region)."""
    mask_BT = mask_BT.float()
    ratio_BT = _ratio(logprobs_BT, old_logprobs_BT, mask_BT)
    w_BT = _cispo_weight(ratio_BT, eps_low, eps_high)
    with torch.no_grad():
        out_BT = ((advantages_BT > 0) & (ratio_BT > 1 + mask_high)) | ((advantages_BT < 0) & (ratio_BT < 1 - mask_low))
    keep_BT = mask_BT * (~out_BT).float()
    loss_BT = -w_BT * advantages_BT * logprobs_BT * keep_BT
    with torch.no_grad():
        clipped_BT = (ratio_BT < 1 - eps_low) | (ratio_BT > 1 + eps_high)
        metrics = {"clipfrac": _masked_mean(out_BT.float(), mask_BT),
                   "weight_clipfrac": _masked_mean(clipped_BT.float(), mask_BT),
                   "ppo_kl": _ppo_kl(logprobs_BT, old_logprobs_BT, mask_BT)}
    return loss_BT, {k: float(v) for k, v in metrics.items()}


GSPO_LOG_RATIO_MAX = 10.0
"""Ceiling of a sequence's log importance ratio in ``gspo_token_loss``, verl's ``clamp(max=10.0)``:
above it the ratio is ``e^10`` and passes no gradient."""


def gspo_token_loss(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, *, clip_low: float, clip_high: float):
    """GSPO (Zheng et al. 2025, arXiv 2507.18071; verl's ``compute_policy_loss_gspo``): PPO's
    clipped loss on the sequence ratio ``s = exp(mean over the row's valid tokens of log π − log μ)``,
    one per row, clipped to ``[1 − clip_low, 1 + clip_high]`` (ratios about 1, so the bounds are
    1e-4s, not PPO's 0.2). Written per token as verl does (the paper's GSPO-token), ``s_t =
    sg(s)·π_t / sg(π_t)``: every token carries the value ``s`` and passes gradient ``s`` to its
    own log-prob, so under ``seq-mean-token-mean`` a row's gradient is the paper's
    ``s·∇ mean log π``. As verl, ``log s`` is capped at ``GSPO_LOG_RATIO_MAX``.

    The sequence is the training row: one context of a ``Sequence`` (``sequence_to_rows``), as a
    response row is verl's; a multi-context sequence gets one ratio per context. Rows are never
    split across micro-batches, so each ratio sees all of its tokens."""
    mask_BT = mask_BT.float()
    valid_BT = mask_BT > 0
    log_ratio_BT = torch.where(valid_BT, logprobs_BT - old_logprobs_BT, torch.zeros_like(logprobs_BT))
    log_s_B = (log_ratio_BT.sum(-1) / mask_BT.sum(-1).clamp(min=1)).detach()
    own_BT = torch.where(valid_BT, logprobs_BT - logprobs_BT.detach(), torch.zeros_like(logprobs_BT))
    s_BT = torch.exp((log_s_B[:, None] + own_BT).clamp(max=GSPO_LOG_RATIO_MAX))
    unclipped_BT = -advantages_BT * s_BT
    clipped_BT = -advantages_BT * s_BT.clamp(1 - clip_low, 1 + clip_high)
    loss_BT = torch.maximum(unclipped_BT, clipped_BT)
    with torch.no_grad():
        metrics = {"clipfrac": _masked_mean((clipped_BT > unclipped_BT).float(), mask_BT),
                   "ppo_kl": _ppo_kl(logprobs_BT, old_logprobs_BT, mask_BT)}
    return loss_BT * mask_BT, {k: float(v) for k, v in metrics.items()}


K3_MAX = 10.0
"""Per-token ceiling of the k3 estimate, as verl's ``low_var_kl``: ``e^d`` is heavy-tailed, so a
few tokens whose probability fell far below the reference's would otherwise outweigh the rest."""


def kl_k3(logprobs_BT, ref_logprobs_BT, mask_BT):
    """Per-token k3 estimate of ``KL(π_θ ‖ π_ref)`` (the KL term of MiniMax-M1's Eq. 1, in the form
    GRPO uses): ``e^d − d − 1`` with ``d = log π_ref − log π_θ``, at most ``K3_MAX``; non-negative,
    zero where the two agree, unbiased on tokens drawn from π_θ (here they come from the rollout
    policy, as in GRPO), with lower variance than k1's ``−d``. Its gradient in ``log π_θ`` is
    ``1 − e^d`` (0 where the ceiling binds): each token's log-prob is pulled toward the
    reference's. Zero where masked."""
    mask_BT = mask_BT.float()
    d_BT = torch.where(mask_BT > 0, ref_logprobs_BT - logprobs_BT, torch.zeros_like(logprobs_BT))
    d_BT = d_BT.clamp(max=LOG_RATIO_BOUND)
    return (d_BT.exp() - d_BT - 1).clamp(max=K3_MAX) * mask_BT


TAIL_FLOOR = 1e-6
"""Least probability the top-k distillation term gives the student's tail bin (the mass outside the
teacher's top-k): its log stays finite when the student puts all its mass on those k tokens."""


def topk_kl(student_lp_BTK, teacher_lp_BTK, mask_BT):
    """Per-token ``KL(p_teacher ‖ p_student)`` over k+1 bins: the teacher's k most likely tokens at the
    position, and the rest of the vocabulary as one tail bin (on-policy distillation's top-k form,
    docs/distillation.md). ``student_lp_BTK``: the student's log-probs of those k tokens;
    ``teacher_lp_BTK``: the teacher's. Unlike the sampled reverse KL it reaches tokens the student
    did not sample: the gradient in the student's logits at a position is ``p_student − p_teacher``
    on the k+1 bins, so a teacher's answer gains mass however rarely the student draws it. At equal
    distributions it is 0 and so is its gradient (the bins' probabilities sum to 1 on both sides).
    Zero where masked; a bin the teacher gives no mass adds nothing."""
    mask_BT = mask_BT.float()
    p_BTK = teacher_lp_BTK.exp()
    tail_t_BT = (1 - p_BTK.sum(-1)).clamp(min=0)
    tail_s_BT = (1 - student_lp_BTK.exp().sum(-1)).clamp(min=TAIL_FLOOR)
    head_BT = (p_BTK * (teacher_lp_BTK - student_lp_BTK)).sum(-1)
    tail_BT = torch.where(tail_t_BT > 0, tail_t_BT * (tail_t_BT.clamp(min=1e-30).log() - tail_s_BT.log()),
                          torch.zeros_like(tail_t_BT))
    return (head_BT + tail_BT) * mask_BT


OBJECTIVES: dict[str, Callable] = {
    "ppo": ppo_token_loss,
    "four_bound": four_bound_token_loss,
    "cispo": cispo_token_loss,
    "unified": unified_token_loss,
    "gspo": gspo_token_loss,
}


def policy_loss(name: str, logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, *, agg: str | None = None,
                group_ids_B: Sequence | None = None, weights_BT: torch.Tensor | None = None, **params):
    """Objective ``name`` per token, then aggregated by ``agg`` — or, instead, by precomputed
    aggregation weights ``weights_BT`` (used for micro-batches of a larger mini-batch, and to fold
    in rollout-correction weights); give exactly one. ``params`` are the objective's parameters,
    all of them: the config (``algo.objective``) owns their defaults. Returns ``(loss, metrics)``;
    every metric is a share or a mean over valid tokens."""
    try:
        objective = OBJECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown policy objective {name!r}; known: {sorted(OBJECTIVES)}") from None
    if (agg is None) == (weights_BT is None):
        raise ValueError("policy_loss needs exactly one of agg (an aggregation name) and weights_BT")
    loss_BT, metrics = objective(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, **params)
    if weights_BT is None:
        weights_BT = aggregation_weights(mask_BT, agg, group_ids_B=group_ids_B)
    return (weights_BT * loss_BT).sum(), metrics
