"""Learning signal: pure functions that turn outcomes into per-token weights and losses."""

from rlonce.algo.advantages import group_advantages
from rlonce.algo.losses import OBJECTIVES, aggregate, aggregation_weights, policy_loss

__all__ = ["OBJECTIVES", "aggregate", "aggregation_weights", "group_advantages", "policy_loss"]
