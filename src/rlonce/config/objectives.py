"""The learning-signal tables: the objective variants (a discriminated union on ``name``),
length shaping, penalty rules and ``AlgoConfig`` that holds them.

The objectives own their loss functions' parameters and defaults (``rlonce.algo.losses`` has
none); ``objective_params`` hands them over.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from rlonce.config.sections import MAX_TOKENS, Section


class PPOObjective(Section):
    """PPO clip with clip-higher and an optional dual clip (the public vanilla loss)."""

    name: Literal["ppo"] = "ppo"
    """Selects this variant (``algo.objective = "ppo"``)."""
    clip_low: float = Field(0.2, ge=0, lt=1)
    """Ratio floor 1 - clip_low (binds for negative advantages)."""
    clip_high: float = Field(0.28, ge=0, le=100)
    """Ratio ceiling 1 + clip_high (clip-higher; binds for positive advantages)."""
    clip_c: float | None = Field(3.0, gt=1, le=1000)
    """Dual-clip bound for negative advantages (None disables it)."""


class FourBoundObjective(Section):
    """MiMo's production rule: tokens whose ratio leaves the interval for their advantage sign
    are masked. Ratio intervals, not 1 ± ε."""

    name: Literal["four_bound"] = "four_bound"
    """Selects this variant (``algo.objective = "four_bound"``)."""
    pos_low: float = Field(0.2, ge=0, lt=1)
    """Lowest kept ratio for positive advantages."""
    pos_high: float = Field(5.0, gt=1, le=1000)
    """Highest kept ratio for positive advantages."""
    neg_low: float = Field(0.2, ge=0, lt=1)
    """Lowest kept ratio for negative advantages."""
    neg_high: float = Field(5.0, gt=1, le=1000)
    """Highest kept ratio for negative advantages."""
    entropy_band: tuple[Annotated[float, Field(ge=0, le=100)], Annotated[float, Field(ge=0, le=100)]] | None = None
    """Target entropy band ``[low, high]`` (nats/token, each in [0, 100], low <= high); when set, the four
    bounds follow policy entropy."""
    entropy_step: float = Field(0.05, gt=0, lt=1)
    """Relative move of the bounds per step outside the band."""

    @field_validator("entropy_band")
    @classmethod
    def _band_ordered(cls, band):
        if band is not None and band[0] > band[1]:
            raise ValueError(f"the band [{band[0]}, {band[1]}] is empty: give [low, high] with low <= high")
        return band


class CISPOObjective(Section):
    """MiniMax-M1's CISPO: the importance weight is clipped, no token is dropped."""

    name: Literal["cispo"] = "cispo"
    """Selects this variant (``algo.objective = "cispo"``)."""
    eps_low: float = Field(1.0, ge=0, le=1)
    """Weight floor 1 - eps_low; 1.0 puts it at 0: M1 imposes none."""
    eps_high: float = Field(0.28, ge=0, le=100)
    """Weight ceiling 1 + eps_high."""


class UnifiedObjective(Section):
    """CISPO with M1's token mask (Eq. 7): mask_low/mask_high bound the PPO trust region."""

    name: Literal["unified"] = "unified"
    """Selects this variant (``algo.objective = "unified"``)."""
    eps_low: float = Field(1.0, ge=0, le=1)
    """Weight floor 1 - eps_low."""
    eps_high: float = Field(0.28, ge=0, le=100)
    """Weight ceiling 1 + eps_high."""
    mask_low: float = Field(0.2, ge=0, lt=1)
    """Tokens with ratio below 1 - mask_low (negative advantage) are masked."""
    mask_high: float = Field(0.28, ge=0, le=100)
    """Tokens with ratio above 1 + mask_high (positive advantage) are masked."""


class GSPOObjective(Section):
    """GSPO: PPO's clip on the sequence's importance ratio (the geometric mean of its tokens'
    ratios), one per training row. The paper and verl's GSPO example aggregate with
    ``algo.aggregation = "seq-mean-token-mean"``."""

    name: Literal["gspo"] = "gspo"
    """Selects this variant (``algo.objective = "gspo"``)."""
    clip_low: float = Field(3e-4, ge=0, lt=1)
    """Sequence-ratio floor 1 - clip_low (the GSPO paper's 3e-4, §5.1)."""
    clip_high: float = Field(4e-4, ge=0, le=100)
    """Sequence-ratio ceiling 1 + clip_high (the GSPO paper's 4e-4, §5.1)."""


Objective = Annotated[PPOObjective | FourBoundObjective | CISPOObjective | UnifiedObjective | GSPOObjective,
                      Field(discriminator="name")]


_VARIANTS = {m.model_fields["name"].default: m for m in (PPOObjective, FourBoundObjective, CISPOObjective,
                                                           UnifiedObjective, GSPOObjective)}
"""The objective variants by name."""


class LengthConfig(Section):
    """Group-relative length shaping; constants default to the public Cyber reference profile."""

    enabled: bool = False
    """Turn length shaping on."""
    metrics: list[Literal["turns", "input_tokens", "output_tokens"]] = Field(
        ["turns", "input_tokens", "output_tokens"], min_length=1)
    """Length measures compared within a group; the default is the reference profile's three."""
    max_penalty: float = Field(0.2, ge=0, le=1)
    """Largest reward reduction."""
    deadzone: float = Field(0.0, ge=0, le=1000)
    """Relative excess over the anchor that goes unpenalised (below ``saturation``)."""
    saturation: float = Field(1.0, gt=0, le=1000)
    """Relative excess at which the penalty reaches max_penalty."""
    exponent: float = Field(1.5, gt=0, le=100)
    """Shape of the penalty curve between deadzone and saturation."""
    anchor_quantile: float = Field(0.3, ge=0, le=1)
    """Quantile of the passing siblings' lengths used as the anchor."""
    pass_rate_gate: float = Field(0.5, ge=0, le=1)
    """Shape only groups whose pass rate is strictly above this."""
    combine: Literal["max", "mean"] = "max"
    """How penalties of several metrics combine."""

    @model_validator(mode="after")
    def _ramp(self):
        if self.deadzone >= self.saturation:
            raise ValueError(f"algo.length.deadzone ({self.deadzone}) must be below algo.length.saturation "
                             f"({self.saturation})")
        return self


PENALTY_PARAMS = {
    "repetition": ("n", "min_repeats"), "confident_run": ("run", "p"), "tool_call": (), "garbled": ("max_bad_share",),
    "infra": (), "monitor": (), "mask": (), "adv_set": ("value",), "adv_reduction": ("amount",),
    "adv_signed": ("kappa", "alpha_max", "beta_min"),
}
"""Parameter names of each penalty rule and strategy (``rlonce.algo.penalties``; a test keeps them in step)."""


class PenaltyConfig(Section):
    """One penalty rule paired with a strategy (see docs/algorithms.md for both tables)."""

    rule: Literal["repetition", "confident_run", "tool_call", "garbled", "infra"]
    """What is detected in a model segment."""
    strategy: Literal["monitor", "mask", "adv_set", "adv_reduction", "adv_signed"] = "monitor"
    """What happens to a flagged segment."""
    rule_params: dict[str, float | int] = {}
    """Keyword arguments of the rule (finite numbers; names in ``PENALTY_PARAMS``)."""
    strategy_params: dict[str, float] = {}
    """Keyword arguments of the strategy (finite numbers; names in ``PENALTY_PARAMS``)."""

    @model_validator(mode="after")
    def _known_params(self):
        for kind, name, params in (("rule", self.rule, self.rule_params),
                                   ("strategy", self.strategy, self.strategy_params)):
            unknown = sorted(set(params) - set(PENALTY_PARAMS[name]))
            if unknown:
                raise ValueError(f"penalty {kind} {name!r} has no parameter {', '.join(map(repr, unknown))}; "
                                 f"its parameters: {', '.join(PENALTY_PARAMS[name]) or 'none'}")
        return self


class AlgoConfig(Section):
    objective: Objective = PPOObjective()
    """By name (``algo.objective=cispo``) or as a table with the variant's parameters (the rows
    ``algo.objective.*`` below, each marked with its variant)."""
    aggregation: Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                         "seq-mean-token-sum-norm", "prompt-mean"] = "prompt-mean"
    """How per-token losses become one number (docs/algorithms.md). The default is the seeds'
    production mode: tokens normalised within each prompt group, then groups averaged."""
    norm_by_std: bool = False
    """Divide group advantages by the group's std (the public Code recipe leaves it off)."""
    filter_no_contrast: bool = True
    """Dynamic filtering: drop groups whose valid rewards are all equal (no group-relative signal)."""
    rollout_correction: Literal["none", "token", "sequence", "token-mis", "sequence-mis", "geometric"] = "none"
    """Correction between trainer-recomputed (π_old) and rollout log-probs, costing one extra
    forward: 'token'/'sequence' truncated IS (weight capped), 'token-mis'/'sequence-mis' masked IS
    (tokens/sequences whose weight exceeds the cap are masked), 'geometric' (a sequence whose
    geometric mean of μ/π_old leaves [``geometric_low``, ``geometric_high``] is masked, as verl)."""
    correction_cap: float = Field(2.0, ge=1, le=1000)
    """Cap of the rollout-correction weight (truncated IS) or mask threshold (masked IS)."""
    geometric_low: float = Field(0.999, gt=0, le=1)
    """'geometric': a sequence whose geometric mean of μ/π_old (the inverse ratio, verl's
    convention) over its tokens is below this is masked whole, so π_old/μ's is kept up to
    1/``geometric_low``. Default with ``geometric_high``: verl's geometric rejection preset, 0.999_1.001."""
    geometric_high: float = Field(1.001, ge=1, le=1000)
    """'geometric': a sequence whose geometric mean of μ/π_old over its tokens is above this is
    masked whole, so π_old/μ's is kept down to 1/``geometric_high``."""
    kl_coef: float = Field(0.0, ge=0, le=100)
    """β of the KL term against the reference policy (MiniMax-M1 Eq. 1), added to the loss as β
    times the k3 estimate per token under the aggregation's weights; the reference is the policy
    RL starts from, a frozen copy in the trainer. 0: off, as in the seeds' recipes."""
    zero_confirmed_hacks: bool = True
    """Reward 0 for sequences the grader confirms as shortcut hacks."""
    grs: bool = False
    """Reward = test · solution rubric · behaviour rubric, when the grader supplies them."""
    gar: bool = False
    """Redistribute advantages among passing rows by grader quality factors."""
    gar_lambda_max: float = Field(2.0, ge=1, le=1000)
    """Largest GAR redistribution factor."""
    export_contexts: Literal["all", "longest"] = "all"
    """Which contexts of a multi-context sequence become training rows: 'all', or 'longest' (the
    context with the most tokens; the public Code recipe's choice)."""
    mask_unfinished: bool = False
    """Give no training rows to a sequence cut by a budget (turns, tokens, context) that did not
    pass, instead of training it as a failure; its score still counts in its group's baseline."""
    length: LengthConfig = LengthConfig()
    """Group-relative length shaping of passing rows' rewards (off by default)."""
    penalties: list[PenaltyConfig] = [PenaltyConfig(rule="repetition"), PenaltyConfig(rule="tool_call"),
                                      PenaltyConfig(rule="garbled")]
    """Rules and strategies; the default only monitors (counts appear in metrics.jsonl)."""
    stop_confident_run: int = Field(3000, ge=0, le=MAX_TOKENS)
    """Engine stop rule: end a turn after this many consecutive tokens with p > 0.99 (0: off)."""

    @model_validator(mode="before")
    @classmethod
    def _objective_by_name(cls, data):
        if isinstance(data, dict) and isinstance(data.get("objective"), str):
            data = {**data, "objective": {"name": data["objective"]}}
        if isinstance(data, dict) and isinstance(data.get("objective"), dict) and "name" not in data["objective"]:
            data = {**data, "objective": {"name": "ppo", **data["objective"]}}
        return data


def objective_params(algo: AlgoConfig) -> dict:
    """The keyword arguments of ``algo.objective``'s loss function (``rlonce.algo.losses``): every
    parameter in its table but its name and the entropy controller's knobs."""
    return algo.objective.model_dump(exclude={"name", "entropy_band", "entropy_step"})
