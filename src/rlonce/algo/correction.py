"""Rollout correction and the entropy-driven controller of the four ratio bounds.

``rollout_correction`` — the engine that sampled a token and the trainer that recomputes its
probability are different numerical programs (batching, kernels, precision), so even at the
same weights ``π_trainer ≠ μ_rollout``. Truncated importance sampling (TIS) multiplies each
token's loss by ``min(π_old / μ, cap)`` (token level) or one capped product per sequence
(sequence level), so the update stays an unbiased-up-to-truncation estimate for the policy being
trained. Masked importance sampling (MIS) keeps the weight untruncated but drops the tokens (or
sequences) whose weight exceeds the cap, and the geometric mask drops a whole sequence whose
per-token ratios drift on average: rejection rather than clipping, as Liu, Li et al. argue ("When
Speed Kills Stability", 2025) and verl's rollout correction implements. The bounded quantity is
verl's (its ``seq_mean_k1`` rejection): the geometric mean of ``μ/π_old``, the inverse ratio,
each token's log clamped to ±20 — so ``[lower, upper]`` keeps ``ρ = π_old/μ`` in
``[1/upper, 1/lower]`` (0.8/1.1 keep ρ in [0.909, 1.25]), and verl's preset bounds mean the
same here. Seed 001 places a rollout-correction stage in the public kernel's order ("Rollout
correction follows") but gives no rule; these rules are not the seeds'.
Seed 001 ("The equation only works if the history is true"): the sampling-time log-probs are
kept, never recomputed as if the latest policy had produced them.

``EntropyBoundController`` — seed 001, same section: the production run adjusts its four
clipping bounds with policy entropy, widening the positive interval and narrowing the negative
one when entropy is too low, the opposite when it is too high. The report gives no step rule;
here each update moves every bound by one multiplicative step ``(1 + step)`` in the required
direction, kept inside fixed limits, so one noisy entropy reading cannot swing the bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from rlonce.algo.losses import LOG_RATIO_BOUND


def _tis_token(log_w_BT, mask_BT, cap, bounds):
    w_BT = log_w_BT.exp()
    return w_BT.clamp(max=cap) * mask_BT, mask_BT, (w_BT > cap) & (mask_BT > 0)


def _tis_sequence(log_w_BT, mask_BT, cap, bounds):
    w_B = log_w_BT.sum(-1).exp()
    return w_B.clamp(max=cap)[:, None] * mask_BT, mask_BT, (w_B > cap)[:, None] & (mask_BT > 0)


def _mis_token(log_w_BT, mask_BT, cap, bounds):
    w_BT = log_w_BT.exp()
    keep_BT = mask_BT * (w_BT <= cap).float()
    return torch.where(keep_BT > 0, w_BT, 0.0), keep_BT, torch.zeros_like(mask_BT, dtype=torch.bool)


def _mis_sequence(log_w_BT, mask_BT, cap, bounds):
    w_B = log_w_BT.sum(-1).exp()
    keep_BT = mask_BT * (w_B <= cap).float()[:, None]
    return torch.where(keep_BT > 0, w_B[:, None], 0.0), keep_BT, torch.zeros_like(mask_BT, dtype=torch.bool)


def _geometric(log_w_BT, mask_BT, cap, bounds):
    log_inv_BT = (-log_w_BT).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND) * mask_BT
    stat_B = log_inv_BT.sum(-1) / mask_BT.sum(-1).clamp(min=1)  # mean log(μ/π_old)
    inside_B = (stat_B >= math.log(bounds[0])) & (stat_B <= math.log(bounds[1]))
    keep_BT = mask_BT * inside_B.float()[:, None]
    return keep_BT.clone(), keep_BT, torch.zeros_like(mask_BT, dtype=torch.bool)


CORRECTIONS: dict[str, Callable] = {"token": _tis_token, "sequence": _tis_sequence, "token-mis": _mis_token,
                                    "sequence-mis": _mis_sequence, "geometric": _geometric}
"""Each maps (log π_old/μ on valid tokens, mask, cap, bounds) to (weights, kept tokens, capped tokens)."""


def rollout_correction(old_logprobs_BT: torch.Tensor, rollout_logprobs_BT: torch.Tensor, mask_BT: torch.Tensor,
                       *, mode: str, cap: float, bounds: tuple[float, float]):
    """Rollout-correction weights and the tokens they keep, from ``ρ = exp(old − rollout)``:

    - ``token`` / ``sequence`` (TIS): ``min(ρ, cap)`` per token, or ``min(Πρ, cap)`` per row on
      each of its tokens; every token kept.
    - ``token-mis`` / ``sequence-mis`` (MIS): ``ρ`` (or ``Πρ``) where it is at most ``cap``; a
      token (row) above the cap is masked out, not truncated.
    - ``geometric``: a row whose geometric mean of the inverse ratio, ``exp(mean log(1/ρ))`` =
      ``exp(mean log(μ/π_old))`` (each token's log clamped to ±20), lies outside
      ``bounds = (lower, upper)`` is masked whole — verl's convention, so ``ρ``'s geometric mean is
      kept in ``[1/upper, 1/lower]``; kept rows weigh 1 (rejection only, no IS weight).

    Returns ``(weights_BT, keep_BT, metrics)``: weights are 0 where masked or invalid; ``keep_BT``
    is ``mask_BT`` less the masked tokens (the trainer takes them out of the loss, so they leave
    its denominators too). Metrics, shares of valid tokens: ``correction_capped_frac`` (weight
    truncated by the cap), ``correction_masked_frac``; ``correction_weight_mean`` over kept tokens."""
    try:
        fn = CORRECTIONS[mode]
    except KeyError:
        raise ValueError(f"unknown rollout correction {mode!r}; known: {sorted(CORRECTIONS)}") from None
    if cap < 1:
        raise ValueError(f"rollout correction cap must be >= 1, got {cap}")
    if not 0 < bounds[0] <= 1 <= bounds[1]:
        raise ValueError(f"geometric bounds {tuple(bounds)} must satisfy 0 < lower <= 1 <= upper")
    mask_BT = mask_BT.float()
    with torch.no_grad():
        w_BT, keep_BT, capped_BT = fn((old_logprobs_BT - rollout_logprobs_BT).double() * mask_BT, mask_BT, cap, bounds)
        n = mask_BT.sum().clamp(min=1)
        metrics = {"correction_capped_frac": float(capped_BT.float().sum() / n),
                   "correction_masked_frac": float((mask_BT - keep_BT).sum() / n),
                   "correction_weight_mean": float((w_BT * keep_BT).sum() / keep_BT.sum().clamp(min=1))}
    return w_BT.to(mask_BT.dtype), keep_BT, metrics


@dataclass(kw_only=True)
class EntropyBoundController:
    """Adjusts ``pos_low, pos_high, neg_low, neg_high`` from measured entropy (nats per token).

    Below ``target_low``: positive interval widens, negative narrows. Above ``target_high``:
    the opposite. Inside the band: unchanged. Lows stay in ``[min_low, max_low]`` (< 1),
    highs in ``[min_high, max_high]`` (> 1).
    """

    target_low: float
    target_high: float
    step: float = 0.05
    pos_low: float = 0.2
    pos_high: float = 5.0
    neg_low: float = 0.2
    neg_high: float = 5.0
    min_low: float = 0.05
    max_low: float = 0.9
    min_high: float = 1.1
    max_high: float = 20.0

    def __post_init__(self) -> None:
        if not self.target_low <= self.target_high:
            raise ValueError(f"entropy band [{self.target_low}, {self.target_high}] is empty")
        if not 0 < self.step < 1:
            raise ValueError(f"entropy controller step must be in (0, 1), got {self.step}")
        if not (0 < self.min_low <= self.max_low < 1 < self.min_high <= self.max_high):
            raise ValueError("entropy controller limits need 0 < min_low <= max_low < 1 < min_high <= max_high")

    def bounds(self) -> dict[str, float]:
        return {"pos_low": self.pos_low, "pos_high": self.pos_high, "neg_low": self.neg_low,
                "neg_high": self.neg_high}

    def _move(self, side: str, widen: bool) -> None:
        f = 1 + self.step
        lo, hi = getattr(self, f"{side}_low"), getattr(self, f"{side}_high")
        lo, hi = (lo / f, hi * f) if widen else (lo * f, hi / f)
        setattr(self, f"{side}_low", min(max(lo, self.min_low), self.max_low))
        setattr(self, f"{side}_high", min(max(hi, self.min_high), self.max_high))

    def update(self, entropy: float) -> dict[str, float]:
        if entropy < self.target_low:
            self._move("pos", widen=True)
            self._move("neg", widen=False)
        elif entropy > self.target_high:
            self._move("pos", widen=False)
            self._move("neg", widen=True)
        return self.bounds()

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)
