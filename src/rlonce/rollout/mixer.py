"""The Sample Mixer: dispatch enough of every task source to retain the mixture the config promised.

For source i with target retained groups per step ``B_i``, measured acceptance ``r_i`` (the
fraction of finished groups the learning signal keeps) and mean rollout duration ``t_i``
(MiMo-V2.6 §6.3; seed ``001_*``, "The mixer has to buy the batch it promised"):

    demand        m_i = B_i / r_i
    oversampling  p_i = clip(c · t_i / t̄, p_min, p_max),  t̄ = Σ m_j t_j / Σ m_j
                  with the shared c chosen (bisection) so that Σ m_i p_i / Σ m_i = p̄
    weight        w_i ∝ α · m_i / Σ m  +  (1 - α) · (B_i - A_i)_+ / Σ (B_j - A_j)_+

``A_i`` is the number of groups of source i already accepted toward the current step. The
report does not publish the oversampling equation's form or its bounds; this is ours: linear
in duration (longer sources get more headroom, because their groups are the ones still
running when a batch is collected), under a global budget ``p̄`` and per-source caps.

Estimates are exponential moving averages that start from a prior — or from a persisted
history (``state_dict``), so that after a restart the short rollouts that finish first do not
drag ``t_i`` down for every source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class SourceStats:
    target: float
    """B_i: retained groups per step."""
    acceptance: float = 0.5
    duration: float = 1.0
    tokens: float = 512.0
    """Mean context tokens of a sequence: the KV cost a dispatch is predicted to hold."""
    seen: int = 0
    share: float = 0.0
    """The source's share of each step's batch, from which ``SampleMixer.plan_step`` sets ``target``."""
    carry: float = 0.0
    """Rounding error of the whole-group targets so far, carried to the next step."""


@dataclass(kw_only=True)
class MixerSettings:
    budget: float = 1.25
    """p̄: the demand-weighted mean oversampling ratio."""
    p_min: float = 1.0
    p_max: float = 3.0
    alpha: float = 0.5
    ema: float = 0.2
    """Weight of a new observation in the moving averages."""
    min_acceptance: float = 0.05
    """Floor on r_i, so a source that accepted nothing yet is tried, not infinitely demanded."""


@dataclass
class SampleMixer:
    sources: dict[str, SourceStats]
    settings: MixerSettings = field(default_factory=MixerSettings)

    # ---- estimates -----------------------------------------------------------------------
    def observe(self, source: str, *, accepted: bool, duration: float, tokens: float | None = None) -> None:
        """One finished group of ``source``: whether the learning signal kept it, how long it ran."""
        s = self.sources[source]
        k = self.settings.ema if s.seen else 1.0  # the first observation replaces the prior
        s.acceptance += k * (float(accepted) - s.acceptance)
        s.duration += k * (duration - s.duration)
        if tokens is not None:
            s.tokens += k * (tokens - s.tokens)
        s.seen += 1

    def demand(self) -> dict[str, float]:
        lo = self.settings.min_acceptance
        return {n: s.target / max(s.acceptance, lo) for n, s in self.sources.items()}

    def oversampling(self) -> tuple[dict[str, float], float]:
        """Per-source p_i and the shared coefficient c meeting the budget (within the caps)."""
        st, m = self.settings, self.demand()
        total = sum(m.values())
        if total <= 0:
            return {n: st.p_min for n in m}, 0.0
        tbar = sum(m[n] * s.duration for n, s in self.sources.items()) / total
        rel = {n: s.duration / tbar for n, s in self.sources.items()}

        def mean_p(c: float) -> float:
            return sum(m[n] * min(st.p_max, max(st.p_min, c * rel[n])) for n in m) / total

        lo, hi = 0.0, st.p_max / min(rel.values())
        if mean_p(hi) <= st.budget:  # even the caps do not reach the budget
            c = hi
        elif mean_p(lo) >= st.budget:  # the floors already exceed it
            c = lo
        else:
            for _ in range(60):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if mean_p(mid) < st.budget else (lo, mid)
            c = (lo + hi) / 2
        return {n: min(st.p_max, max(st.p_min, c * rel[n])) for n in m}, c

    def quotas(self) -> dict[str, int]:
        """Groups to dispatch per step: ⌈m_i · p_i⌉."""
        p, _ = self.oversampling()
        return {n: math.ceil(m * p[n] - 1e-9) for n, m in self.demand().items()}

    def weights(self, accepted: dict[str, int]) -> dict[str, float]:
        """w_i: steady demand blended with the current deficit (α · demand share + (1-α) · deficit share)."""
        m = self.demand()
        total = sum(m.values()) or 1.0
        deficit = {n: max(0.0, s.target - accepted.get(n, 0)) for n, s in self.sources.items()}
        dsum = sum(deficit.values())
        a = self.settings.alpha
        return {n: a * m[n] / total + (1 - a) * (deficit[n] / dsum if dsum else m[n] / total) for n in m}

    def concurrency(self, slots: int, p: dict[str, float] | None = None) -> dict[str, int]:
        """Per-source session budgets from Little's law: in flight ∝ m_i · p_i · t_i (at least 1)."""
        p = p if p is not None else self.oversampling()[0]
        m = self.demand()
        load = {n: m[n] * p[n] * s.duration for n, s in self.sources.items()}
        total = sum(load.values()) or 1.0
        return {n: max(1, round(slots * v / total)) for n, v in load.items()}

    def plan_step(self, total: int) -> dict[str, int]:
        """This step's targets ``B_i``: ``total`` groups split by the sources' shares in whole
        groups, the rounding error carried to the next step — each step's targets sum to
        ``total`` and, over steps, every source gets its share to within one group."""
        src = self.sources
        want = {n: total * s.share + s.carry for n, s in src.items()}
        out = {n: int(max(0.0, w)) for n, w in want.items()}
        for n in sorted(want, key=lambda n: (out[n] - want[n], n))[:max(0, total - sum(out.values()))]:
            out[n] += 1
        for n, s in src.items():
            s.target, s.carry = out[n], want[n] - out[n]
        return out

    # ---- persistence ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {n: {"acceptance": s.acceptance, "duration": s.duration, "tokens": s.tokens, "seen": s.seen,
                    "carry": s.carry} for n, s in self.sources.items()}

    def load_state_dict(self, state: dict) -> None:
        """Warm-start from persisted estimates (sources not in ``state`` keep their priors)."""
        for n, v in state.items():
            if n in self.sources:
                s = self.sources[n]
                s.acceptance, s.duration, s.tokens, s.seen = v["acceptance"], v["duration"], v["tokens"], v["seen"]
                s.carry = v.get("carry", 0.0)
