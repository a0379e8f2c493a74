"""The executor, evaluation and checkpoint tables, and ``RunConfig``, the root that holds every
section and checks the rules that span sections (domain versus arms, vLLM versus Ray GPUs).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from rlonce.config.distill import DistillConfig
from rlonce.config.grading import GradingConfig
from rlonce.config.objectives import AlgoConfig
from rlonce.config.sections import (
    MAX_PARALLEL,
    MAX_STEPS,
    EngineConfig,
    HarnessConfig,
    ModelConfig,
    RFTConfig,
    RLConfig,
    RolloutConfig,
    RuntimeConfig,
    Section,
    SFTConfig,
)
from rlonce.config.sources import SourceConfig, TaskConfig


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
    group_timeout_s: float = Field(7200.0, gt=0, le=86_400)
    """Longest wait for a harness pool to finish one group (or the trainers one step); past it the
    group is infra (call_timeout). Above ``timeouts.trajectory_s`` + ``timeouts.reward_s`` (6300 s
    by default), so a slow sequence's own layer names its failure first."""
    max_restarts: int = Field(3, ge=0, le=1000)
    """How often Ray restarts a dead actor; in-flight work of a dead actor is infra (worker_lost)."""
    dashboard: bool = False
    """Start Ray's dashboard."""
    temp_dir: str | None = None
    """Ray's session files and logs (default: RUN/ray, or a short /tmp path linked from there
    when RUN/ray is too long for a Unix socket path)."""


MAX_SECONDS = 604_800.0
"""Upper bound of a wall-clock limit (a week)."""


class TimeoutsConfig(Section):
    """Wall-clock limits of each sequence, one per layer (``rlonce.core.timeouts``); each expiry
    is an infrastructure failure of its own category, never a low reward. Defaults: seed 001
    (Code: trajectory 4,800 s, model request 3,600 s, agent idle 720 s; setup 900 s as Cyber and
    Visual, reward 1,500 s as Visual). 0 leaves a layer unbounded."""

    trajectory_s: float = Field(4800.0, ge=0, le=MAX_SECONDS)
    """The whole sequence: setup, the agent's turns and tools, grading (trajectory_timeout; 0: unbounded)."""
    setup_s: float = Field(900.0, ge=0, le=MAX_SECONDS)
    """Creating the environment: sandbox and workspace (setup_timeout; 0: unbounded)."""
    reward_s: float = Field(1500.0, ge=0, le=MAX_SECONDS)
    """Grading one sequence, or one group by a grader that compares siblings (reward_timeout; 0: unbounded)."""
    model_request_s: float = Field(3600.0, ge=0, le=MAX_SECONDS)
    """One model request: an engine call through the gateway, a turn paused for a weight update
    included (model_timeout; 0: unbounded)."""
    agent_idle_s: float = Field(720.0, ge=0, le=MAX_SECONDS)
    """Longest time the agent may go without a model request, its tool calls included; then it is
    stopped (agent_idle_timeout; 0: unbounded)."""


class EvalConfig(Section):
    heldout_tasks: int = Field(200, ge=1, le=MAX_STEPS)
    """Held-out tasks of the baseline and final evaluations."""
    every: int = Field(10, ge=0, le=MAX_STEPS)
    """Evaluate on ``during_tasks`` held-out tasks every this many RL steps (0: never)."""
    during_tasks: int = Field(64, ge=1, le=MAX_STEPS)
    """Held-out tasks of each evaluation during RL."""
    concurrency: int = Field(128, ge=1, le=MAX_PARALLEL)
    """Evaluation sequences in flight at once."""


class TrackerConfig(Section):
    """Experiment trackers that get every ``metrics.jsonl`` record (docs/quickstart.md#trackers)."""

    tensorboard: bool = True
    """Write TensorBoard event files to RUN/tensorboard (``tensorboard --logdir RUN/tensorboard``)."""
    wandb_project: str | None = None
    """Log to this Weights & Biases project too (needs ``pip install 'rlonce[wandb]'``; the key comes
    from the environment, ``WANDB_API_KEY``, and is never written to the run directory)."""
    wandb_mode: Literal["offline", "online"] = "offline"
    """offline: W&B files under RUN/wandb, sent later with ``wandb sync``; online: streamed as the run goes."""
    wandb_entity: str | None = None
    """The W&B team or user (default: the key's)."""


class StorageConfig(Section):
    """What RUN/rollouts keeps besides every trained row (``rlonce.telemetry.rollouts``)."""

    untrained_fraction: float = Field(0.05, ge=0.0, le=1.0)
    """Share of each step's untrained sequences (filtered, rejected, stale, failed) also stored, by a
    seeded draw: for debugging what the filter threw away (0: none; 1: all). A step that trained
    no row stores every sequence whatever this says: that is when they are needed."""
    remote_rows: bool = True
    """Ray executor: fetch each step's trained rows from the object store to store them too (one more
    copy to the driver per step); false: they are counted (``rows_remote``), not stored."""


class CheckpointConfig(Section):
    every: int = Field(20, ge=1, le=MAX_STEPS)
    """Checkpoint every this many RL steps (the SFT, baseline and final states are always saved)."""
    keep: int = Field(2, ge=0, le=1000)
    """Newest checkpoints kept on disk (0: keep all)."""


class RunConfig(Section):
    @model_validator(mode="after")
    def _fits(self):
        # per-source rules (arms, SFT) need the domain registry: rlonce.rollout.sources.check_sources
        if self.sources and self.task != TaskConfig():  # a saved config holds the default [task]: fine
            raise ValueError("give either [task] (a one-source run) or [[sources]], not both: move the [task] "
                             "keys into a [[sources]] table")
        labels = [s.source_label for s in self.sources]
        if len(set(labels)) < len(labels):
            dup = next(x for x in labels if labels.count(x) > 1)
            raise ValueError(f"two sources are labelled {dup!r}: give each [[sources]] table its own label")
        if (self.engine.backend == "vllm" and self.executor == "ray"
                and self.ray.engine_gpus < self.engine.tensor_parallel_size):
            raise ValueError("engine.backend 'vllm' runs on GPUs: set ray.engine_gpus to engine.tensor_parallel_size "
                             f"({self.engine.tensor_parallel_size})")
        if self.model.lora.rank > 0 and self.engine.backend == "vllm" and self.model.lora.modules_to_save:
            raise ValueError("model.lora.modules_to_save with engine.backend = 'vllm': vLLM's adapters hold LoRA "
                             "factors only; leave modules_to_save empty")
        if self.algo.kl_coef > 0 and self.executor == "ray" and self.ray.trainer_workers > 1:
            raise ValueError("algo.kl_coef > 0 keeps the reference policy in one trainer process: set "
                             "ray.trainer_workers = 1")
        return self

    out: str = Field("runs/latest", min_length=1)
    """The run directory (no control characters: a newline in a path is a typo or an attack)."""

    @field_validator("out")
    @classmethod
    def _no_control_characters(cls, v: str) -> str:
        if any(ord(c) < 32 or ord(c) == 127 for c in v):
            raise ValueError("the run directory holds a control character (a newline, a tab, ...): name it without one")
        return v
    executor: Literal["local", "ray"] = "local"
    """Where rollouts, generation and training run: this process, or Ray actors (``[ray]``)."""
    model: ModelConfig = ModelConfig()
    """The policy model: which weights, chat format and precision."""
    runtime: RuntimeConfig = RuntimeConfig()
    """Seed and torch thread counts."""
    engine: EngineConfig = EngineConfig()
    """The inference engine that generates rollouts (torch on CPU or vLLM on GPU)."""
    task: TaskConfig = Field(default_factory=TaskConfig)
    """The domain trained on and its task generator (a one-source run; see ``sources``)."""
    sources: list[SourceConfig] = []
    """Task sources of a mixed run (``[[sources]]`` tables, docs/sources.md): each a domain with its
    options, share of the batch, arms, staleness, held-out size. Empty: the one source ``task``."""
    harness: HarnessConfig = HarnessConfig()
    """Harness arms, turn and token budgets, sampling."""
    sft: SFTConfig = SFTConfig()
    """Supervised fine-tuning on scripted-expert demonstrations before RL."""
    rft: RFTConfig = RFTConfig()
    """Rejection-sampling fine-tuning on the model's own passing attempts, after SFT (off by default)."""
    rl: RLConfig = RLConfig()
    """GRPO: steps, groups per step and their size, sync concurrency, the RL optimizer."""
    rollout: RolloutConfig = RolloutConfig()
    """The rollout orchestrator: sync or async, staleness, oversampling."""
    timeouts: TimeoutsConfig = TimeoutsConfig()
    """Wall-clock limits of each sequence: trajectory, setup, reward, model request, agent idle."""
    algo: AlgoConfig = AlgoConfig()
    """The learning signal: objective, aggregation, reward shaping, penalties."""
    grading: GradingConfig = GradingConfig()
    """Model graders: the judge, GRS and GAR inputs, the hack audit (docs/grading.md)."""
    distill: DistillConfig = DistillConfig()
    """On-policy distillation from per-source teachers, with MOPD2's prefixes (docs/distillation.md)."""
    eval: EvalConfig = EvalConfig()
    """Held-out evaluations before, during and after RL."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """How often checkpoints are written and how many are kept."""
    storage: StorageConfig = StorageConfig()
    """RUN/rollouts: every trained row, and a sample of the untrained sequences."""
    tracker: TrackerConfig = TrackerConfig()
    """Experiment trackers: TensorBoard event files (on by default) and Weights & Biases."""
    ray: RayConfig = RayConfig()
    """Actors and resources of the Ray executor (used with ``executor = "ray"``)."""
