"""Typed run configuration: pydantic models, hand-written TOML, ``key.sub=value`` overrides.

Imports without torch. Unknown keys are errors (``extra="forbid"``), reported as one line
naming the key and the keys that section does know. Every number has stated bounds (``Field``
constraints, listed by ``reference()`` and in docs/config.md); NaN, infinity and booleans given
for a number are refused, so a bad value stops the run before any model loads.

The sections live in ``sections`` (base and per-part tables), ``objectives`` (the learning
signal), ``run`` (``RunConfig``); reading and checking in ``load``; the config as text in
``reference``. Import from here.
"""

from rlonce.config.distill import DistillConfig
from rlonce.config.grading import GradingConfig, JudgeConfig
from rlonce.config.load import (
    _explain,
    _field_at,
    _parse_value,
    _read_text,
    _section_type,
    apply_overrides,
    bounds,
    load_config,
    read_saved_config,
    save_config,
    validate,
)
from rlonce.config.objectives import (
    _VARIANTS,
    PENALTY_PARAMS,
    AlgoConfig,
    CISPOObjective,
    FourBoundObjective,
    LengthConfig,
    Objective,
    PenaltyConfig,
    PPOObjective,
    UnifiedObjective,
    objective_params,
)
from rlonce.config.reference import Setting, _plain, _toml, reference, settings
from rlonce.config.run import (
    CheckpointConfig,
    EvalConfig,
    RayConfig,
    RunConfig,
    StorageConfig,
    TimeoutsConfig,
    TrackerConfig,
)
from rlonce.config.sections import (
    MAX_PARALLEL,
    MAX_STEPS,
    MAX_TOKENS,
    OPTIMIZERS,
    ArmName,
    ConfigError,
    EngineConfig,
    HarnessConfig,
    LoraConfig,
    ModelConfig,
    RFTConfig,
    RLConfig,
    RolloutConfig,
    RuntimeConfig,
    Section,
    SFTConfig,
    _numeric,
)
from rlonce.config.sources import SourceConfig, TaskConfig

__all__ = [
    "MAX_PARALLEL", "MAX_STEPS", "MAX_TOKENS", "OPTIMIZERS", "PENALTY_PARAMS", "_VARIANTS", "AlgoConfig", "ArmName",
    "CISPOObjective", "CheckpointConfig", "ConfigError", "DistillConfig", "EngineConfig", "EvalConfig",
    "FourBoundObjective",
    "GradingConfig", "HarnessConfig", "JudgeConfig", "LengthConfig", "LoraConfig",
    "ModelConfig", "Objective", "PPOObjective", "PenaltyConfig", "RFTConfig", "RLConfig",
    "RayConfig", "RolloutConfig", "RunConfig", "RuntimeConfig", "SFTConfig", "Section", "Setting", "SourceConfig",
    "StorageConfig", "TaskConfig", "TimeoutsConfig", "TrackerConfig", "UnifiedObjective", "_explain", "_field_at",
    "_numeric", "_parse_value", "_plain",
    "_read_text", "_section_type", "_toml", "apply_overrides", "bounds", "load_config", "objective_params",
    "read_saved_config", "reference", "save_config", "settings", "validate",
]
