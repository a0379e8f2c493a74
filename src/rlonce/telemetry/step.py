"""The per-step metrics record (one line of ``metrics.jsonl``), built from what a step produced.

It reads records only (sequences, ledger entries, the trainer's metrics); it imports nothing
above the core layer, so any loop — the main job, a benchmark, a new recipe — builds the same
record from the same inputs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rlonce.core.records import Status


@dataclass
class StepInputs:
    step: int
    finished: list
    """Every sequence that finished this step (trained or not)."""
    trained: list
    """The sequences of the groups trained on."""
    ledger: dict
    """Source → ``LedgerEntry``."""
    rollout_seconds: float
    train_seconds: float
    retained_rows: int
    version: int
    staleness: int
    replayed: int = 0
    reissued: int = 0
    arms: list[str] = field(default_factory=list)
    lag_counts: Counter = field(default_factory=Counter)
    """Trained tokens by how many versions they lag the trainer."""


def _mean(values, n: int) -> float:
    return sum(values) / max(n, 1)


def step_record(x: StepInputs, signal_metrics: dict, train_metrics: dict) -> dict:
    seqs, lags = x.finished, x.lag_counts
    scored = [s for s in seqs if not s.infra_failed]
    gen_tokens = sum(s.metrics.get("model_tokens", 0.0) for s in seqs)
    lags_n = sum(lags.values())
    per_arm = {}
    if len(x.arms) > 1:
        per_arm = {f"reward_mean/{a}": _mean([s.reward for s in scored if s.arm == a], sum(s.arm == a for s in scored))
                   for a in x.arms if any(s.arm == a for s in scored)}
    return {
        "step": x.step,
        "reward_mean": _mean([s.reward for s in scored], len(scored)),
        "success_rate": _mean([s.success for s in scored], len(scored)),
        "response_tokens_mean": gen_tokens / max(len(seqs), 1),
        "turns_mean": _mean([s.turns for s in seqs], len(seqs)),
        "contexts_per_sequence": _mean([len(s.contexts) for s in seqs], len(seqs)),
        "gateway_rollbacks": sum(s.metrics.get("rollbacks", 0.0) for s in seqs),
        **{f"status_{k.value}": _mean([s.status is k for s in seqs], len(seqs)) for k in Status},
        "rollout_seconds": x.rollout_seconds,
        "train_seconds": x.train_seconds,
        "step_seconds": x.rollout_seconds + x.train_seconds,
        "generated_tokens_per_s": gen_tokens / max(x.rollout_seconds, 1e-9),
        "retained_rows": x.retained_rows,
        "version": x.version,
        "version_lag_max": max(lags) if lags else 0,
        "version_lag_mean": sum(k * n for k, n in lags.items()) / lags_n if lags_n else 0.0,
        **{f"version_lag_tokens/{k}": float(n) for k, n in sorted(lags.items())},
        "staleness_violations": float(sum(n for k, n in lags.items() if k > x.staleness - 1)),
        "sequences_spanning_versions": float(sum(s.metrics.get("versions_spanned", 0.0) > 1 for s in x.trained)),
        "interrupted_turns": sum(s.metrics.get("interrupts", 0.0) for s in seqs),
        "stale_dropped": float(sum(e.stale_dropped for e in x.ledger.values())),
        "carried_over": float(sum(e.carried_over for e in x.ledger.values())),
        "replayed_groups": float(x.replayed),
        "reissued_groups": float(x.reissued),
        **per_arm,
        **signal_metrics,
        **train_metrics,
    }
