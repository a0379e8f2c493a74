"""Pure builders: the rollout-side parts of a run from its resolved config (rollout spec,
learning-signal settings, entropy-bound controller, orchestrator). The main job, the
Ray harness pools, ``rlonce tasks filter`` and the benchmarks build their parts here, so each
of them gets the same parts from the same config."""

from __future__ import annotations

from rlonce.algo.correction import EntropyBoundController
from rlonce.algo.penalties import PenaltySpec
from rlonce.algo.signal import LengthShaping, SignalSettings
from rlonce.config import AlgoConfig, RunConfig, TimeoutsConfig
from rlonce.core.timeouts import Timeouts
from rlonce.engine.base import SamplingParams
from rlonce.harness.loop import HarnessLimits
from rlonce.model.chat import get_format
from rlonce.rollout.mixer import MixerSettings, SampleMixer, SourceStats
from rlonce.rollout.orchestrator import Orchestrator, OrchestratorSettings, SourceRules
from rlonce.rollout.runner import RolloutSpec
from rlonce.rollout.sources import Source


def signal_settings(algo: AlgoConfig, plans=(), distill_clip: float | None = None) -> SignalSettings:
    """The rollout-side half of ``algo``: shaping, filtering, penalties; and the distilled sources
    of ``plans`` (``SourcePlan``s) with their weights."""
    length = None
    if algo.length.enabled:
        fields = algo.length.model_dump(exclude={"enabled", "metrics"})
        length = LengthShaping(metrics=tuple(algo.length.metrics), **fields)
    return SignalSettings(
        norm_by_std=algo.norm_by_std, filter_no_contrast=algo.filter_no_contrast,
        zero_hacks=algo.zero_confirmed_hacks, grs=algo.grs, gar=algo.gar, gar_lambda_max=algo.gar_lambda_max,
        length=length, aggregation=algo.aggregation, export_contexts=algo.export_contexts,
        mask_unfinished=algo.mask_unfinished,
        distill={p.label: (p.kl_weight, p.reward_weight) for p in plans if p.distills}, distill_clip=distill_clip,
        lr_scale={p.label: p.lr_scale for p in plans if p.lr_scale != 1.0},
        penalties=[PenaltySpec(p.rule, p.strategy, dict(p.rule_params), dict(p.strategy_params))
                   for p in algo.penalties],
    )


def bound_controller(algo: AlgoConfig) -> EntropyBoundController | None:
    obj = algo.objective
    band = getattr(obj, "entropy_band", None)
    if band is None:
        return None
    return EntropyBoundController(target_low=band[0], target_high=band[1], step=obj.entropy_step, pos_low=obj.pos_low,
                                  pos_high=obj.pos_high, neg_low=obj.neg_low, neg_high=obj.neg_high)


def timeouts(t: TimeoutsConfig) -> Timeouts:
    """The config's wall-clock limits (0: unbounded, ``None``)."""
    return Timeouts(trajectory=t.trajectory_s or None, setup=t.setup_s or None, reward=t.reward_s or None,
                    model=t.model_request_s or None, agent_idle=t.agent_idle_s or None)


def rollout_spec(cfg: RunConfig, lm) -> RolloutSpec:
    """What every sequence of the run shares (also built inside each Ray harness pool). Sampling
    (temperature, top-p, top-k) and tool rendering are each source's: ``build_sources`` sets them
    from the run plan, where ``[[sources]]`` or ``[harness]`` resolved them."""
    h = cfg.harness
    return RolloutSpec(
        encode=lm.encode, decode=lm.decode, chat_format=get_format(lm.chat_format),
        sampling=SamplingParams(max_tokens=h.max_tokens_per_turn, stop_confident_run=cfg.algo.stop_confident_run,
                                candidate_sets=h.candidate_sets),
        limits=HarnessLimits(max_turns=h.max_turns, max_obs_chars=h.max_obs_chars, compact_at=h.compact_at,
                             format_retries=h.format_retries),
        max_context=h.max_context, arms=tuple(h.arms), arm_seed=cfg.runtime.seed,
        arm_per_sequence=h.assign == "sequence", timeouts=timeouts(cfg.timeouts),
        sequence_seed=cfg.runtime.seed if deterministic(cfg) else None,
    )


def deterministic(cfg: RunConfig) -> bool:
    """``runtime.deterministic`` applies: a sync run on the local executor with the torch engine (vLLM's
    batching and GPU kernels are not repeatable, so lockstep waves would cost without buying anything)."""
    return (cfg.runtime.deterministic and cfg.rollout.mode == "sync" and cfg.executor == "local"
            and cfg.engine.backend == "torch")


def build_orchestrator(cfg: RunConfig, sources: dict[str, Source], executor, signal: SignalSettings, decode, *,
                       state: dict | None = None, position: int = 0, max_sessions: int | None = None) -> Orchestrator:
    """The rollout orchestrator of a run: the train streams of ``sources`` through ``executor``,
    each step's batch (``rl.tasks_per_step`` groups in sync mode, refilled up to
    ``rollout.sync_dispatch_cap``; ``rollout.target_groups`` in async mode) split by the sources'
    shares, each source with its own staleness, stale policy and difficulty filter; ``state``
    resumes it (``position``: a one-source run's task position, for a checkpoint that holds no
    orchestrator state); ``max_sessions`` caps the sessions (a Ray cluster's pool capacity)."""
    r = cfg.rollout
    plans = [s.plan for s in sources.values()]
    mixer = SampleMixer({p.label: SourceStats(target=0, share=p.share) for p in plans},
                        MixerSettings(budget=r.oversampling))
    sessions = r.max_sessions if r.mode == "async" else cfg.rl.concurrency
    if max_sessions is not None:
        sessions = min(sessions, max_sessions)
    orch = Orchestrator(
        executor, lambda label, i: sources[label].domain.task("train", i), mixer, signal,
        OrchestratorSettings(mode=r.mode, group_size=cfg.rl.group_size, staleness=max(p.staleness for p in plans),
                             refill=r.mode == "sync", dispatch_cap=r.sync_dispatch_cap,
                             max_sessions=max(sessions, *(p.group_size for p in plans)),
                             kv_budget=float("inf") if r.kv_budget is None else float(r.kv_budget),
                             batch=cfg.rl.tasks_per_step if r.mode == "sync" else r.target_groups,
                             rules={p.label: SourceRules(p.staleness, p.stale_policy, p.difficulty_window,
                                                         p.dispatch_cap, p.group_size) for p in plans},
                             group_by_arm=cfg.harness.group_by_arm, deterministic=deterministic(cfg)),
        decode=decode)
    if state:
        orch.load_state_dict(state)
    elif position and len(plans) == 1:
        orch.next_index[plans[0].label] = position
    return orch
