"""Pure builders: the rollout-side parts of a run from its resolved config. The main job, the
Ray harness pools, ``rlonce tasks filter`` and the benchmarks build their parts here, so each
of them gets the same parts from the same config."""

from __future__ import annotations

from rlonce.algo.correction import EntropyBoundController
from rlonce.algo.penalties import PenaltySpec
from rlonce.algo.signal import LengthShaping, SignalSettings
from rlonce.config import AlgoConfig, RunConfig
from rlonce.engine.base import SamplingParams
from rlonce.harness.loop import HarnessLimits
from rlonce.model.chat import get_format
from rlonce.rollout.runner import RolloutSpec


def signal_settings(algo: AlgoConfig) -> SignalSettings:
    """The rollout-side half of ``algo``: shaping, filtering, penalties."""
    length = None
    if algo.length.enabled:
        fields = algo.length.model_dump(exclude={"enabled", "metrics"})
        length = LengthShaping(metrics=tuple(algo.length.metrics), **fields)
    return SignalSettings(
        norm_by_std=algo.norm_by_std, filter_no_contrast=algo.filter_no_contrast,
        zero_hacks=algo.zero_confirmed_hacks, grs=algo.grs, gar=algo.gar, gar_lambda_max=algo.gar_lambda_max,
        length=length,
        penalties=[PenaltySpec(p.rule, p.strategy, dict(p.rule_params), dict(p.strategy_params))
                   for p in algo.penalties],
    )


def bound_controller(algo: AlgoConfig) -> EntropyBoundController | None:
    obj = algo.objective
    band = getattr(obj, "entropy_band", None)
    if band is None:
        return None
    return EntropyBoundController(band[0], band[1], obj.entropy_step, obj.pos_low, obj.pos_high,
                                  obj.neg_low, obj.neg_high)


def rollout_spec(cfg: RunConfig, lm) -> RolloutSpec:
    """What every sequence of the run shares (also built inside each Ray harness pool)."""
    h = cfg.harness
    return RolloutSpec(
        lm.encode, lm.decode, get_format(lm.chat_format),
        SamplingParams(max_tokens=h.max_tokens_per_turn, temperature=h.temperature, top_p=h.top_p, top_k=h.top_k,
                       stop_confident_run=cfg.algo.stop_confident_run),
        HarnessLimits(max_turns=h.max_turns, max_obs_chars=h.max_obs_chars, render_tools=h.render_tools,
                      compact_at=h.compact_at),
        max_context=h.max_context, arms=tuple(h.arms), arm_seed=cfg.runtime.seed,
        arm_per_sequence=h.assign == "sequence",
    )
