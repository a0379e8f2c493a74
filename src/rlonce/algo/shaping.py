"""From graded outcomes to shaped scores: filtering, hack zeroing, GRS, length shaping, GAR,
and the signed rebalance of flagged tokens.

Each function implements one passage of seed 001 and says which. The order in which they run
is part of the objective; it is written once, in ``rlonce.algo.signal.learning_signal``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlonce.algo.advantages import _groups


def keep_groups(scores_N: torch.Tensor, group_ids_N: Sequence, infra_N: torch.Tensor) -> torch.Tensor:
    """Dynamic sampling (seed 001, "The slowest agent does not get to set the clock"): a group
    lacks contrast when, among its non-infrastructure rows, there is no row, one row, or zero
    spread (continuous rewards included). Returns, per row, whether its group is kept."""
    scores_N = torch.as_tensor(scores_N, dtype=torch.float32)
    infra_N = torch.as_tensor(infra_N, dtype=torch.bool)
    keep_N = torch.zeros(len(scores_N), dtype=torch.bool)
    for idx in _groups(group_ids_N):
        idx_t = torch.tensor(idx)
        s = scores_N[idx_t][~infra_N[idx_t]]
        keep_N[idx_t] = len(s) >= 2 and bool(s.max() > s.min())
    return keep_N


def zero_confirmed_hacks(scores_N: torch.Tensor, hack_N: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Seed 001 ("The environment can accidentally hand out the answer"): a groupwise grader
    resets confirmed hacks to zero reward *before* group statistics are (re)computed, so the
    hack also lowers nothing but itself. Returns the new scores and how many were zeroed."""
    scores_N = torch.as_tensor(scores_N, dtype=torch.float32)
    hack_N = torch.as_tensor(hack_N, dtype=torch.bool)
    return torch.where(hack_N, torch.zeros_like(scores_N), scores_N), int(hack_N.sum())


def grs_reward(r_test: torch.Tensor, s_sol: torch.Tensor, s_beh: torch.Tensor, passed: torch.Tensor) -> torch.Tensor:
    """Groupwise Reward Synthesis (seed 001, "A passing test is the beginning of grading"):
    ``R = R_test · S_sol · S_beh``. Correctness is a gate, read from the grader's pass flag
    (``Sequence.passed``), not from the reward's sign: a row that did not pass gets 0 whatever
    the rubric scores say (even unusable ones) and whatever partial credit its reward held;
    rubric scores of passing rows must lie in [0, 1]."""
    r_test, s_sol, s_beh = (torch.as_tensor(x, dtype=torch.float32) for x in (r_test, s_sol, s_beh))
    passed = torch.as_tensor(passed, dtype=torch.bool)
    for name, s in (("solution", s_sol), ("behaviour", s_beh)):
        bad = passed & ~((s >= 0) & (s <= 1))
        if bad.any():
            raise ValueError(f"GRS {name} scores of passing rows must lie in [0, 1]; got {s[bad].tolist()}")
    return torch.where(passed, r_test * s_sol * s_beh, torch.zeros_like(r_test))


def _length_deductions(lengths_G, passed_G, *, max_penalty, deadzone, saturation, exponent, anchor_quantile):
    lengths_G = torch.as_tensor(lengths_G, dtype=torch.float64)
    anchor = torch.quantile(lengths_G[passed_G], anchor_quantile)
    if anchor <= 0:
        return torch.zeros(len(lengths_G), dtype=torch.float64)
    excess_G = (lengths_G - anchor) / anchor
    t_G = ((excess_G - deadzone) / (saturation - deadzone)).clamp(0, 1)
    return torch.where(passed_G, max_penalty * t_G ** exponent, torch.zeros_like(t_G))


COMBINES = {"max": lambda d_KG: d_KG.max(0).values, "mean": lambda d_KG: d_KG.mean(0)}
"""How the deductions of several length metrics combine, by name (``algo.length.combine``)."""


def length_penalty(lengths_G, passed_G, *, max_penalty: float = 0.2, deadzone: float = 0.0,
                   saturation: float = 1.0, exponent: float = 1.5, anchor_quantile: float = 0.3,
                   pass_rate_gate: float = 0.5, combine: str = "max") -> torch.Tensor:
    """Group-relative length shaping (seed 001, "Shorter is not always better", report Eq. 4).

    Only when the group's pass rate is strictly above ``pass_rate_gate``: anchor ``ℓ*`` = the
    ``anchor_quantile`` quantile of passing lengths (linear interpolation), excess
    ``e = (ℓ - ℓ*)/ℓ*``, ramp ``t = clip((e - δ)/(s - δ), 0, 1)``, deduction ``X·t^γ`` on
    passing rows only (clipping before the power keeps a negative excess from a fractional
    power). ``lengths_G`` is one tensor, or a dict of named tensors (turns, input tokens,
    output tokens) whose deductions are combined by ``combine`` ('max', the reference, or
    'mean'). Constants default to the public Cyber reference profile.
    """
    passed_G = torch.as_tensor(passed_G, dtype=torch.bool)
    if not 0 <= deadzone < saturation:
        raise ValueError(f"length penalty needs 0 <= deadzone < saturation, got {deadzone}, {saturation}")
    if combine not in COMBINES:
        raise ValueError(f"unknown length-penalty combine {combine!r}; known: {sorted(COMBINES)}")
    metrics = lengths_G if isinstance(lengths_G, dict) else {"length": lengths_G}
    G = len(passed_G)
    if G == 0 or float(passed_G.float().mean()) <= pass_rate_gate:
        return torch.zeros(G)
    d_KG = torch.stack([_length_deductions(v, passed_G, max_penalty=max_penalty, deadzone=deadzone,
                                           saturation=saturation, exponent=exponent,
                                           anchor_quantile=anchor_quantile) for v in metrics.values()])
    return COMBINES[combine](d_KG).float()


def gar_redistribute(advantages_G: torch.Tensor, passed_G: torch.Tensor, quality_G: torch.Tensor, *,
                     lambda_max: float = 2.0) -> torch.Tensor:
    """Groupwise Advantage Redistribution (seed 001, "A passing test is the beginning of grading").

    For the passing set P: ``A'_i = λ·f_i·A_i`` with ``λ = Σ_P A_i / Σ_P f_i·A_i`` capped at
    ``lambda_max`` — more of the positive signal goes to better passing solutions while the
    uncapped total over P is unchanged — then the group mean is re-subtracted. A group with an
    unusable quality factor (NaN, outside [0, 1]) on a passing row, or with no positive
    passing mass, keeps its original advantages: losing a judgement must not erase a valid
    executable result.
    """
    adv_G = torch.as_tensor(advantages_G, dtype=torch.float64)
    passed_G = torch.as_tensor(passed_G, dtype=torch.bool)
    f_G = torch.as_tensor(quality_G, dtype=torch.float64)
    if not passed_G.any():
        return adv_G.float()
    f_P, a_P = f_G[passed_G], adv_G[passed_G]
    if not (torch.isfinite(f_P) & (f_P >= 0) & (f_P <= 1)).all():
        return adv_G.float()
    denom = (f_P * a_P).sum()
    if denom <= 0 or a_P.sum() <= 0:
        return adv_G.float()
    lam = min(float(a_P.sum() / denom), lambda_max)
    out = adv_G.clone()
    out[passed_G] = lam * f_P * a_P
    return (out - out.mean()).float()


def signed_rebalance(adv: torch.Tensor, flagged: torch.Tensor, *, kappa: float = 2.0, alpha_max: float = 2.0,
                     beta_min: float = 0.5, weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Segment-level behavioural penalty on advantages (seed 001, "Shorter is not always better",
    report p20; constants from the public Cyber reference).

    Positive side: flagged tokens go to 0, clean positives are scaled by
    ``α = M⁺ / C⁺`` (capped at ``alpha_max``) to keep the positive mass ``M⁺``. Negative side:
    flagged tokens are multiplied by ``κ``; only clean negatives are scaled, by
    ``β = (M⁻ - κ·H⁻) / C⁻`` (floored at ``beta_min``) to keep the negative magnitude. Masses
    are sums of ``weights·|A|`` (weights default to 1). Conservation is not unconditional: with
    no clean tokens on a side, or a bound hit, the metrics say so (``*_clamped``, ``*_unbalanced``).
    """
    dtype = adv.dtype if isinstance(adv, torch.Tensor) and adv.is_floating_point() else torch.float32
    adv = torch.as_tensor(adv, dtype=torch.float64)
    flagged = torch.as_tensor(flagged, dtype=torch.bool)
    w = torch.ones_like(adv) if weights is None else torch.as_tensor(weights, dtype=torch.float64)
    if kappa < 1:
        raise ValueError(f"signed rebalance needs kappa >= 1, got {kappa}")
    pos, neg = adv > 0, adv < 0
    mag = (w * adv.abs())
    m_pos, c_pos = float(mag[pos].sum()), float(mag[pos & ~flagged].sum())
    m_neg, h_neg, c_neg = float(mag[neg].sum()), float(mag[neg & flagged].sum()), float(mag[neg & ~flagged].sum())
    alpha = m_pos / c_pos if c_pos > 0 else 1.0
    alpha_clamped = alpha > alpha_max
    alpha = min(alpha, alpha_max)
    beta = (m_neg - kappa * h_neg) / c_neg if c_neg > 0 else 1.0
    beta_clamped = beta < beta_min
    beta = max(beta, beta_min)
    out = adv.clone()
    out[pos & flagged] = 0.0
    out[pos & ~flagged] *= alpha
    out[neg & flagged] *= kappa
    out[neg & ~flagged] *= beta
    new_mag = w * out.abs()
    metrics = {
        "pos_mass_before": m_pos, "pos_mass_after": float(new_mag[pos].sum()),
        "neg_mass_before": m_neg, "neg_mass_after": float(new_mag[neg].sum()),
        "alpha": alpha, "beta": beta, "alpha_clamped": alpha_clamped, "beta_clamped": beta_clamped,
        "pos_unbalanced": c_pos == 0 and m_pos > 0, "neg_unbalanced": c_neg == 0 and h_neg > 0,
    }
    return out.to(dtype), metrics
