"""TRL's half of the rlonce-vs-TRL benchmark: GRPO with ``trl.GRPOTrainer`` on CPU, set up to
match one rlonce GRPO step as closely as TRL allows, with per-step timings.

    from benchmarks.vs_trl.trl_side import run_trl
    result = run_trl(model_dir, prompts, reward_fn, group_size=4, prompts_per_step=2,
                     max_new_tokens=32, lr=1e-4, steps=3, seed=0, work_dir="/tmp/trl")

One optimizer step = one generation batch: ``prompts_per_step`` prompts (taken in order, task
``s*prompts_per_step + k`` at step ``s``), ``group_size`` completions each, scored, turned into
group-relative advantages (mean-centred, not divided by the std), then a single PPO-clip update
(clip-higher, dual clip, token-mean, no KL) over the whole batch, AdamW, grad clip 1.0, constant LR. This is
rlonce's sync-mode step with ``rl.minibatches=1``, ``algo.aggregation=token-mean`` and
``algo.norm_by_std=false``; ``trl_settings`` lists the TRL settings, each with why it matches.

What TRL cannot match:

* Ratio denominator. rlonce takes it from the rollout engine's log-probs; TRL (one update per
  generation batch, no vLLM) uses the detached log-probs of the same forward pass, so its ratio
  is exactly 1 where rlonce's is 1 up to engine numerics. Neither pays an extra forward pass
  and the clip essentially never binds on either side.
* Dynamic filtering (rlonce ``algo.filter_no_contrast``, on by default): TRL keeps groups whose
  rewards are all equal; their advantages are 0, but their tokens still enter the token-mean
  denominator and the forward/backward. Turn the filter off on the rlonce side for equal work.
* Generation engine: TRL samples with ``model.generate`` on the training model itself (one
  padded batch, no weight copy after the update); rlonce samples with its own engine on a copy
  of the weights that it refreshes after each update. Random streams differ, so the
  completions (and their lengths) differ between the two sides even at the same seed.

Timings per optimizer step (seconds of wall clock):

* ``step_seconds``: from the trainer's ``on_step_begin`` callback to its ``on_step_end``
  callback. In transformers 5 both sit inside the loop over optimizer steps and bracket the
  whole step: ``training_step`` (which generates, scores, computes the loss and backpropagates)
  plus the gradient clip, ``optimizer.step``, the scheduler step and ``zero_grad``. Wrapping
  ``training_step`` alone would miss the optimizer step. Fetching the step's prompts from the
  data loader (a list lookup) happens just before ``on_step_begin``; logging and held-out evals
  happen after ``on_step_end``; neither is counted.
* ``rollout_seconds``: time inside ``GRPOTrainer._generate_and_score_completions`` (in TRL
  1.16 the one method that tokenizes the prompts, samples the completions with
  ``model.generate``, decodes them, calls the reward function and computes the advantages).
* ``update_seconds``: ``step_seconds - rollout_seconds`` (forward, backward, clip, AdamW).
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable

import torch
import transformers
import trl
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from transformers.trainer_callback import PrinterCallback
from transformers.utils import logging as hf_logging
from trl import GRPOConfig, GRPOTrainer


def trl_settings(*, work_dir: str, group_size: int, prompts_per_step: int, max_new_tokens: int, lr: float,
                 steps: int, seed: int, temperature: float, clip_low: float, clip_high: float,
                 clip_c: float | None) -> dict:
    """The ``GRPOConfig`` keyword arguments that match an rlonce GRPO step (TRL 1.16 names)."""
    return {
        "output_dir": work_dir,
        "seed": seed,
        "max_steps": steps,
        # Batch geometry: every optimizer step consumes exactly one generation batch of
        # prompts_per_step * group_size completions, in one forward/backward (no accumulation,
        # no split of the generation batch over several steps, no reuse of it).
        "num_generations": group_size,
        "per_device_train_batch_size": prompts_per_step * group_size,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 1,
        "num_iterations": 1,
        # rlonce consumes tasks in order: the RepeatSampler walks the dataset without shuffling.
        "shuffle_dataset": False,
        "remove_unused_columns": False,  # keeps "task_index" for the reward function
        # Sampling: plain temperature sampling with HF generate on the training model.
        "use_vllm": False,
        "max_completion_length": max_new_tokens,
        "temperature": temperature,
        "top_p": 1.0,
        "top_k": 0,
        # Objective: PPO clip with clip-higher, no KL term and so no reference model.
        "beta": 0.0,
        "epsilon": clip_low,
        "epsilon_high": clip_high,
        # rlonce's dual clip caps a negative-advantage token's loss at clip_c·|A|. TRL's `delta`
        # clamps the unclipped ratio at delta, which gives the same loss and gradient for A < 0
        # and changes nothing for A > 0 as long as delta > 1 + epsilon_high (checked by run_trl).
        "delta": clip_c,
        # "dapo" divides the summed token losses by the number of completion tokens in the whole
        # generation batch: rlonce's "token-mean". ("bnpo" divides by the tokens of the local
        # micro-batch; with one micro-batch per step the two are the same.)
        "loss_type": "dapo",
        # Advantages are reward - group mean, not divided by the group std (rlonce norm_by_std=false).
        "scale_rewards": "none",
        "mask_truncated_completions": False,
        # Optimizer: torch.optim.AdamW's fused kernel (transformers' default), as rlonce's Trainer
        # builds it; constant rate, no warm-up; grad-norm clip at 1.0.
        "learning_rate": lr,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "optim": "adamw_torch_fused",
        "adam_beta1": 0.9,
        "adam_beta2": 0.95,
        "adam_epsilon": 1e-8,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        # CPU, float32 throughout; TRL turns activation (gradient) checkpointing and bf16 on by default.
        "use_cpu": True,
        "bf16": False,
        "fp16": False,
        "activation_checkpointing": False,  # transformers 5 name of `gradient_checkpointing`
        # No logging integrations, no metric logs, no checkpoints, no trainer progress bar.
        "report_to": "none",
        "logging_strategy": "no",
        "save_strategy": "no",
        "log_completions": False,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }


@contextlib.contextmanager
def _quiet():
    """Silence transformers/TRL/accelerate log lines, their progress bars and Python warnings;
    restore all of them on exit."""
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    loggers = [logging.getLogger(name) for name in ("trl", "accelerate")]
    levels = [lg.level for lg in loggers]
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _completion_text(completion) -> str:
    """A TRL completion as text: conversational prompts give ``[{"role": "assistant", "content": ...}]``."""
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content") or "") for m in completion)


class _StepMeter:
    """What the current optimizer step has accumulated, reset at each step's start."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.started = time.perf_counter()
        self.rollout_seconds = 0.0
        self.generated_tokens = 0
        self.rewards: list[float] = []


class _StepTimer(TrainerCallback):
    """Closes each optimizer step's record at ``on_step_end``, then runs the held-out eval if due,
    outside the timed window."""

    def __init__(self, meter: _StepMeter, records: list[dict], evaluate: Callable[[int], float], eval_at: set[int],
                 bar):
        self.meter, self.records, self.evaluate, self.eval_at, self.bar = meter, records, evaluate, eval_at, bar
        self.postfix: dict[str, str] = {}

    def run_eval(self, step: int) -> None:
        self.postfix["heldout"] = f"{self.evaluate(step):.3f}"
        self.bar.set_postfix(self.postfix)

    def on_step_begin(self, args, state, control, **kwargs):
        self.meter.reset()

    def on_step_end(self, args, state, control, **kwargs):
        m = self.meter
        step_seconds = time.perf_counter() - m.started
        record = {
            "step": state.global_step,
            "rollout_seconds": m.rollout_seconds,
            "update_seconds": step_seconds - m.rollout_seconds,
            "step_seconds": step_seconds,
            "generated_tokens": m.generated_tokens,
            "reward_mean": sum(m.rewards) / max(len(m.rewards), 1),
        }
        self.records.append(record)
        self.postfix.update(reward=f"{record['reward_mean']:.3f}", step_s=f"{step_seconds:.2f}")
        self.bar.set_postfix(self.postfix, refresh=False)
        self.bar.update(1)
        if state.global_step in self.eval_at:
            self.run_eval(state.global_step)


def run_trl(model_dir: str, prompts: list[list[dict]], reward_fn: Callable[[str, int], float], *, group_size: int,
            prompts_per_step: int, max_new_tokens: int, lr: float, steps: int, seed: int, temperature: float = 1.0,
            clip_low: float = 0.2, clip_high: float = 0.28, clip_c: float | None = 3.0,
            eval_fn: Callable | None = None, eval_every: int = 0, threads: int = 2, work_dir: str,
            progress: bool = True, bf16: bool = False) -> dict:
    """Train ``model_dir`` with ``GRPOTrainer`` for ``steps`` optimizer steps; return per-step timings.

    ``prompts[i]`` (a list of ``{"role", "content"}`` messages) is task ``i``; step ``s`` (from 0)
    uses tasks ``[s*prompts_per_step, (s+1)*prompts_per_step)``. ``reward_fn(text, task_index)``
    scores one completion. ``clip_c`` is rlonce's dual-clip bound (``objective.clip_c``, default
    3.0; None turns it off). With ``eval_fn`` and ``eval_every > 0``, ``eval_fn(model, step)`` is
    called before training (step 0), after every ``eval_every`` optimizer steps and after the
    last one; the floats it returns are ``heldout``, keyed by step as a string. ``bf16`` turns on
    the Trainer's bfloat16 mixed precision (CPU autocast), TRL's fastest CPU setting. ``threads`` is
    torch's intra-op thread count for the run (restored afterwards): keep it at or below the idle
    cores, as oversubscribed OpenMP threads spin and can slow a step down by orders of magnitude.
    """
    if group_size < 2:
        raise ValueError(f"GRPO needs group_size >= 2, got {group_size}")
    if clip_c is not None and clip_c <= 1 + clip_high:
        raise ValueError(f"clip_c={clip_c} must exceed 1 + clip_high = {1 + clip_high}: only then does TRL's "
                         "`delta` reproduce rlonce's dual clip")
    needed = steps * prompts_per_step
    if len(prompts) < needed:
        raise ValueError(f"{steps} steps of {prompts_per_step} prompts need {needed} prompts, got {len(prompts)}")
    settings = trl_settings(work_dir=work_dir, group_size=group_size, prompts_per_step=prompts_per_step,
                            max_new_tokens=max_new_tokens, lr=lr, steps=steps, seed=seed, temperature=temperature,
                            clip_low=clip_low, clip_high=clip_high, clip_c=clip_c)
    settings["bf16"] = bf16
    eval_at = set()
    if eval_fn is not None and eval_every > 0:
        eval_at = {*range(eval_every, steps + 1, eval_every), steps}

    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    meter, records, heldout = _StepMeter(), [], {}
    bar = tqdm(total=steps, desc="trl grpo", unit="step", disable=not progress, dynamic_ncols=True)
    try:
        with _quiet():
            tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            # Only the prompts the run consumes: max_steps then ends exactly at the end of the
            # first epoch, so no task is seen twice.
            dataset = Dataset.from_dict({"prompt": prompts[:needed], "task_index": list(range(needed))})

            def reward(completions, task_index, **_):
                scores = [float(reward_fn(_completion_text(c), int(i))) for c, i in zip(completions, task_index)]
                meter.rewards.extend(scores)
                return scores

            def evaluate(step: int) -> float:
                # A forked RNG: the eval's own sampling leaves training's sampling stream untouched.
                policy = trainer.model
                was_training = policy.training
                with torch.random.fork_rng(devices=[]):
                    heldout[str(step)] = float(eval_fn(policy, step))
                policy.train(was_training)
                return heldout[str(step)]

            timer = _StepTimer(meter, records, evaluate, eval_at, bar)
            trainer = GRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(**settings),
                                  train_dataset=dataset, processing_class=tokenizer,
                                  callbacks=[timer])
            trainer.remove_callback(PrinterCallback)  # it prints the final metrics dict

            generate_and_score = trainer._generate_and_score_completions

            def timed_generate_and_score(inputs):
                t0 = time.perf_counter()
                out = generate_and_score(inputs)
                meter.rollout_seconds += time.perf_counter() - t0
                meter.generated_tokens += int(out["completion_mask"].sum())  # includes the EOS token, not padding
                return out

            trainer._generate_and_score_completions = timed_generate_and_score

            if eval_at:
                timer.run_eval(0)
            trainer.train()
    finally:
        bar.close()
        torch.set_num_threads(threads_before)

    return {
        "steps": records,
        "heldout": heldout,
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "settings": {**settings, "model_dtype": "float32", "torch_threads": threads},
    }
