"""The per-step metrics record (one line of ``metrics.jsonl``), built from what a step produced.

It reads records only (sequences, ledger entries, the trainer's metrics); it imports nothing
above the core layer, so any loop — the main job, a benchmark, a new recipe — builds the same
record from the same inputs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rlonce.core.records import Role, Status
from rlonce.telemetry.metrics import JsonlWriter


@dataclass(kw_only=True)
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
    violations: int
    """Trained tokens older than their source's staleness allows (``core.records.staleness_violations``)."""
    replayed: int = 0
    reissued: int = 0
    arms: list[str] = field(default_factory=list)
    lag_counts: Counter = field(default_factory=Counter)
    """Trained tokens by how many versions they lag the trainer."""
    finished_sources: list[str] = field(default_factory=list)
    """The source of each of ``finished`` (per-source metrics when the run has several)."""
    shares: dict[str, float] = field(default_factory=dict)
    """Source → target share of the batch."""
    taken_groups: dict[str, int] = field(default_factory=dict)
    """Source → groups trained on this step."""


def source_metrics(x: StepInputs) -> dict:
    """``src/<label>/…`` per source of a mixed run: target and retained share of the step's
    trained groups, the ledger's counts, reward, success, the interceptor's denials, mean sequence
    duration and context tokens of the sequences that finished."""
    if len(x.ledger) < 2:
        return {}
    taken = {n: x.taken_groups.get(n, 0) for n in x.ledger}
    total = sum(taken.values())
    out = {}
    for n, e in x.ledger.items():
        seqs = [s for s, src in zip(x.finished, x.finished_sources) if src == n]
        scored = [s for s in seqs if not s.infra_failed]
        k = f"src/{n}/"
        out.update({
            k + "target_share": x.shares.get(n, 0.0),
            k + "retained_share": taken[n] / total if total else 0.0,
            k + "retained_groups": float(taken[n]),
            k + "dispatched": float(e.dispatched),
            k + "filtered": float(e.no_contrast_filtered + e.penalty_rejected),
            k + "unfinished_dropped": float(e.unfinished_dropped),
            k + "stale_dropped": float(e.stale_dropped),
            k + "infra_failed": float(e.infra_failed),
            **{k + f"infra/{c}": float(v) for c, v in sorted(e.infra_by_category.items())},
            k + "hack_zeroed": float(e.hack_zeroed),
            k + "policy_input_errors": float(e.policy_input_errors),
            k + "groups_short": float(e.groups_short),
            k + "difficulty_skipped": float(e.difficulty_skipped),
            k + "intercepted": float(sum(v for s in seqs for m, v in s.metrics.items() if m.startswith("intercepted"))),
            k + "reward_mean": _mean([s.reward for s in scored], len(scored)),
            k + "success_rate": _mean([s.passed for s in scored], len(scored)),
            k + "seconds_mean": _mean([s.metrics.get("seconds", 0.0) for s in seqs], len(seqs)),
            k + "context_tokens_mean": _mean([s.metrics.get("context_tokens", 0.0) for s in seqs], len(seqs)),
        })
    return out


def _mean(values, n: int) -> float:
    return sum(values) / max(n, 1)


def grade_metrics(scored) -> dict[str, float]:
    """A grader's own measurements (``grade/<name>`` in ``Sequence.metrics``: the music feature
    score and adherence items, the cyber oracle's report counts, …), each averaged over the
    scored sequences that have it."""
    keys = sorted({k for s in scored for k in s.metrics if k.startswith("grade/")})
    return {k: _mean([s.metrics[k] for s in scored if k in s.metrics], sum(k in s.metrics for s in scored))
            for k in keys}


def _prefill(seqs) -> dict[str, float]:
    """Prompt tokens the engine ran the model on, and the share it took from a kept cache instead
    (the torch engine's prefix reuse, vLLM's prefix caching)."""
    prompt = sum(s.metrics.get("prompt_tokens", 0.0) for s in seqs)
    cached = sum(s.metrics.get("cached_prompt_tokens", 0.0) for s in seqs)
    return {"prefill_tokens": prompt - cached, "prefix_reuse_rate": cached / prompt if prompt else 0.0}


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
        "success_rate": _mean([s.passed for s in scored], len(scored)),
        "response_tokens_mean": gen_tokens / max(len(seqs), 1),
        "turns_mean": _mean([s.turns for s in seqs], len(seqs)),
        "contexts_per_sequence": _mean([len(s.contexts) for s in seqs], len(seqs)),
        "gateway_rollbacks": sum(s.metrics.get("rollbacks", 0.0) for s in seqs),
        "context_lost_turns": sum(s.metrics.get("context_lost_turns", 0.0) for s in seqs),
        **{f"status_{k.value}": _mean([s.status is k for s in seqs], len(seqs)) for k in Status},
        "format_retries": sum(s.metrics.get("format_retries", 0.0) for s in seqs),
        "rollout_seconds": x.rollout_seconds,
        "train_seconds": x.train_seconds,
        "step_seconds": x.rollout_seconds + x.train_seconds,
        "generated_tokens_per_s": gen_tokens / max(x.rollout_seconds, 1e-9),
        "compiled_decode_share": sum(s.metrics.get("compiled_tokens", 0.0) for s in seqs)
        / max(sum(s.metrics.get("sampled_tokens", 0.0) for s in seqs), 1.0),
        **_prefill(seqs),
        "retained_rows": x.retained_rows,
        "version": x.version,
        "version_lag_max": max(lags) if lags else 0,
        "version_lag_mean": sum(k * n for k, n in lags.items()) / lags_n if lags_n else 0.0,
        **{f"version_lag_tokens/{k}": float(n) for k, n in sorted(lags.items())},
        "staleness_violations": float(x.violations),
        "sequences_spanning_versions": float(sum(s.metrics.get("versions_spanned", 0.0) > 1 for s in x.trained)),
        "interrupted_turns": sum(s.metrics.get("interrupts", 0.0) for s in seqs),
        "stale_dropped": float(sum(e.stale_dropped for e in x.ledger.values())),
        "carried_over": float(sum(e.carried_over for e in x.ledger.values())),
        "groups_short": float(sum(e.groups_short for e in x.ledger.values())),
        "replayed_groups": float(x.replayed),
        "reissued_groups": float(x.reissued),
        **per_arm,
        **grade_metrics(scored),
        **source_metrics(x),
        **{k: v for k, v in signal_metrics.items() if not k.startswith(("distill_kl_sum/", "distill_tokens/"))},
        **distill_metrics(signal_metrics),
        **train_metrics,
    }


def distill_metrics(signal_metrics: dict) -> dict[str, float]:
    """The sampled reverse KL of the distilled sources' trained tokens judged this step, per source
    (``src/<label>/distill_reverse_kl``, with its token count) and over all (``distill_reverse_kl``):
    the mean of log π_student − log π_teacher over the student's sampled tokens, what distillation
    drives to 0 (``rlonce.algo.signal.distill_advantages``)."""
    labels = [k.removeprefix("distill_tokens/") for k in signal_metrics if k.startswith("distill_tokens/")]
    if not labels:
        return {}
    out, kl, n = {}, 0.0, 0.0
    for label in labels:
        lk, ln = signal_metrics.get(f"distill_kl_sum/{label}", 0.0), signal_metrics[f"distill_tokens/{label}"]
        out[f"src/{label}/distill_reverse_kl"] = lk / ln if ln else 0.0
        out[f"src/{label}/distill_tokens"] = float(ln)
        kl, n = kl + lk, n + ln
    out["distill_reverse_kl"] = kl / n if n else 0.0
    out["distill_tokens"] = n
    return out


def why_untrained(e) -> str:
    """Why a source's ledger entry (``LedgerEntry`` or its dict) for a step trained nothing, from
    where its sequences went: groups whose every sequence failed or passed (no contrast), rejected
    by penalties, cut unfinished, stale, failed in the infrastructure, or never dispatched."""
    g = e if isinstance(e, dict) else e.to_dict()
    if not g.get("dispatched") and not g.get("carried_in"):
        return "nothing dispatched"
    passed = g.get("no_contrast_all_passed", 0)
    parts = [(g.get("no_contrast_filtered", 0) - passed, "in groups that all failed"),
             (passed, "in groups that all passed"), (g.get("penalty_rejected", 0), "rejected by penalties"),
             (g.get("unfinished_dropped", 0), "cut unfinished"), (g.get("stale_dropped", 0), "stale"),
             (g.get("infra_failed", 0), "failed in the infrastructure"),
             (g.get("carried_over", 0), "still running")]
    said = [f"{n} {what}" for n, what in parts if n]
    return ", ".join(said) + " (sequences)" if said else "no group finished"


def untrained_line(step: int, ledger: dict, taken: dict, shares: dict) -> str | None:
    """One warning line when step ``step`` trained nothing, or when a source owed a share of the
    batch trained no group: each such source with why (``why_untrained``). None when every source
    trained."""
    idle = [n for n in ledger if not taken.get(n) and shares.get(n, 1.0) > 0]
    if not idle:
        return None
    why = "; ".join(f"{n}: {why_untrained(ledger[n])}" for n in idle)
    if not any(taken.get(n) for n in ledger):
        return f"step {step} trained nothing: {why}"
    return f"step {step}: {', '.join(idle)} trained no group ({why})"


def per_source_success(ev: dict) -> dict:
    """``src/<label>/heldout_success`` of an evaluation over several sources (none for one)."""
    per = ev["per_source"]
    return {f"src/{k}/heldout_success": v["success"] for k, v in per.items()} if len(per) > 1 else {}


def write_trajectories(folder: Path, step: int, seqs, decode) -> None:
    """``folder/step-NNNN.jsonl``: per sequence its outcome (and an infrastructure failure's
    cause), its decoded first context, and per model turn the sampled log-probs and versions."""
    folder.mkdir(exist_ok=True)
    w = JsonlWriter(folder / f"step-{step:04d}.jsonl")
    for s in seqs:
        model = [g for c in s.contexts for g in c.segments if g.role is Role.MODEL]
        w.write({"task_id": s.task_id, "arm": s.arm, "status": s.status.value, "reward": s.reward,
                 "failure": s.failure.value if s.failure else None, "cause": s.cause,
                 "answer": s.answer, "turns": s.turns,
                 "text": decode(s.contexts[0].token_ids()) if s.contexts else "",
                 "turn_versions": [g.versions for g in model], "turn_logprobs": [g.logprobs for g in model]})
    w.close()
