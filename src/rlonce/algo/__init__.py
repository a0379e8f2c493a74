"""Learning signal: pure functions that turn outcomes into per-token weights and losses.

Where each piece runs in a step is written once, in ``rlonce.algo.signal.learning_signal``;
``docs/algorithms.md`` gives the formulas and the seed passages they implement.
"""

from rlonce.algo.advantages import broadcast_session_advantages, group_advantages
from rlonce.algo.correction import EntropyBoundController, rollout_correction
from rlonce.algo.losses import AGGREGATIONS, OBJECTIVES, aggregate, aggregation_weights, policy_loss
from rlonce.algo.penalties import RULES, STRATEGIES, PenaltySpec
from rlonce.algo.shaping import (
    gar_redistribute,
    grs_reward,
    keep_groups,
    length_penalty,
    signed_rebalance,
    zero_confirmed_hacks,
)
from rlonce.algo.signal import LengthShaping, SignalSettings, learning_signal

__all__ = [
    "AGGREGATIONS", "OBJECTIVES", "RULES", "STRATEGIES", "EntropyBoundController", "LengthShaping", "PenaltySpec",
    "SignalSettings", "aggregate", "aggregation_weights", "broadcast_session_advantages", "gar_redistribute",
    "group_advantages", "grs_reward", "keep_groups", "learning_signal", "length_penalty", "policy_loss",
    "rollout_correction", "signed_rebalance", "zero_confirmed_hacks",
]
