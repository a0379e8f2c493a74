"""Per-token policy objectives and their aggregation, looked up by name.

A per-token objective maps (new log-probs, rollout log-probs, advantages, mask) to a loss per
token; aggregation reduces it to a scalar. Every aggregation mode is linear in the per-token
values, so it is computed as ``sum(w_BT * values_BT)`` with weights taken once over the whole
mini-batch (``aggregation_weights``) — which keeps gradient accumulation over micro-batches
exact for every mode, not only token-mean.
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


def ppo_token_loss(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, *, clip_low: float = 0.2,
                   clip_high: float = 0.2, clip_c: float | None = None):
    """Clipped surrogate ``-min(r·A, clip(r, 1-clip_low, 1+clip_high)·A)``; with ``clip_c``, the
    dual clip bounds negative-advantage tokens at ``-clip_c·A``."""
    mask_BT = mask_BT.float()
    ratio_BT = torch.exp(logprobs_BT - old_logprobs_BT)
    unclipped_BT = -advantages_BT * ratio_BT
    clipped_BT = -advantages_BT * ratio_BT.clamp(1 - clip_low, 1 + clip_high)
    loss_BT = torch.maximum(unclipped_BT, clipped_BT)
    with torch.no_grad():
        metrics = {
            "clipfrac": _masked_mean((clipped_BT > unclipped_BT).float(), mask_BT),
            "ppo_kl": _masked_mean(old_logprobs_BT - logprobs_BT, mask_BT),
        }
    if clip_c is not None:
        dual_BT = -advantages_BT * clip_c
        bind_BT = (advantages_BT < 0) & (loss_BT > dual_BT)
        loss_BT = torch.where(advantages_BT < 0, torch.minimum(loss_BT, dual_BT), loss_BT)
        metrics["clipfrac_lower"] = _masked_mean(bind_BT.float(), mask_BT).detach()
    return loss_BT * mask_BT, {k: float(v) for k, v in metrics.items()}


OBJECTIVES: dict[str, Callable] = {"ppo": ppo_token_loss}


def policy_loss(name: str, logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, *, agg: str = "token-mean",
                group_ids_B: Sequence | None = None, weights_BT: torch.Tensor | None = None, **params):
    """Objective ``name`` per token, then aggregated. ``weights_BT`` overrides ``agg`` with
    precomputed aggregation weights (used for micro-batches of a larger mini-batch)."""
    try:
        objective = OBJECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown policy objective {name!r}; known: {sorted(OBJECTIVES)}") from None
    loss_BT, metrics = objective(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, **params)
    if weights_BT is None:
        weights_BT = aggregation_weights(mask_BT, agg, group_ids_B=group_ids_B)
    return (weights_BT * loss_BT).sum(), metrics
