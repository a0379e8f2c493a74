"""Rollout correction and the entropy-driven controller of the four ratio bounds.

``rollout_correction`` — the engine that sampled a token and the trainer that recomputes its
probability are different numerical programs (batching, kernels, precision), so even at the
same weights ``π_trainer ≠ μ_rollout``. Truncated importance sampling multiplies each token's
loss by ``min(π_old / μ, cap)`` (token level) or one capped product per sequence (sequence
level), so the update stays an unbiased-up-to-truncation estimate for the policy being trained.
Seed 001 ("The equation only works if the history is true"): the sampling-time log-probs are
kept, never recomputed as if the latest policy had produced them.

``EntropyBoundController`` — seed 001, same section: the production run adjusts its four
clipping bounds with policy entropy, widening the positive interval and narrowing the negative
one when entropy is too low, the opposite when it is too high. The report gives no step rule;
here each update moves every bound by one multiplicative step ``(1 + step)`` in the required
direction, kept inside fixed limits, so one noisy entropy reading cannot swing the bounds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch


def _token_weights(log_w_BT: torch.Tensor, mask_BT: torch.Tensor, cap: float):
    w_BT = log_w_BT.exp()
    capped_BT = (w_BT > cap) & (mask_BT > 0)
    share = capped_BT.float().sum() / mask_BT.sum().clamp(min=1)
    return w_BT.clamp(max=cap) * mask_BT, share


def _sequence_weights(log_w_BT: torch.Tensor, mask_BT: torch.Tensor, cap: float):
    log_w_B = (log_w_BT * mask_BT).sum(-1)
    rows_B = mask_BT.sum(-1) > 0
    w_B = log_w_B.exp()
    share = ((w_B > cap) & rows_B).float().sum() / rows_B.sum().clamp(min=1)
    return w_B.clamp(max=cap)[:, None] * mask_BT, share


CORRECTIONS: dict[str, Callable] = {"token": _token_weights, "sequence": _sequence_weights}


def rollout_correction(old_logprobs_BT: torch.Tensor, rollout_logprobs_BT: torch.Tensor, mask_BT: torch.Tensor,
                       *, mode: str, cap: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated IS weights ``min(exp(old - rollout), cap)`` per token (``mode='token'``) or per
    sequence (``'sequence'``: the product over the row's valid tokens), zero where masked.
    Metrics: ``correction_capped_frac`` (share of valid tokens, or non-empty rows, whose weight
    the cap bound) and ``correction_weight_mean`` (over valid tokens)."""
    try:
        fn = CORRECTIONS[mode]
    except KeyError:
        raise ValueError(f"unknown rollout correction {mode!r}; known: {sorted(CORRECTIONS)}") from None
    if cap < 1:
        raise ValueError(f"rollout correction cap must be >= 1, got {cap}")
    mask_BT = mask_BT.float()
    with torch.no_grad():
        w_BT, share = fn((old_logprobs_BT - rollout_logprobs_BT) * mask_BT, mask_BT, cap)
        mean = (w_BT * mask_BT).sum() / mask_BT.sum().clamp(min=1)
    return w_BT, {"correction_capped_frac": float(share), "correction_weight_mean": float(mean)}


@dataclass
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
