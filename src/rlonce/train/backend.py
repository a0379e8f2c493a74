"""Where the policy trains and how its weights reach the engines: the trainer-backend contract.

The RL loop (``rlonce.recipes.grpo.Job``) drives exactly one ``TrainerBackend`` and never asks
which one it is:

    executor(domain, spec) ─► (Executor, session cap)   rollout groups run there
    engine                                              generates (rollouts, evals)
    await train(batch, request) ─► metrics              one optimizer step on the step's rows
    await publish(version)                              the new weights to every engine as ``version``
    pull(model) ─► optimizer state                      ``model`` takes the trainer's weights (checkpoints)
    close()

``LocalBackend`` (here): the trainer steps ``lm.model`` in this process; the engine generates
with a copy that ``publish`` refreshes between tokens. ``RayCluster`` (``rlonce.dist.cluster``):
trainer, engine and harness-pool actors; ``rlonce.dist.backends.build_backend`` picks one from
``executor``.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from typing import Protocol

from rlonce.core import faults
from rlonce.core.records import version_lags
from rlonce.engine.base import BackendError, Engine
from rlonce.engine.factory import EngineSpec
from rlonce.engine.lockstep import Lockstep
from rlonce.errors import RlonceError
from rlonce.model import lora, omp
from rlonce.rollout.builders import deterministic
from rlonce.rollout.orchestrator import Executor, StepResult
from rlonce.rollout.runner import LocalExecutor
from rlonce.train.checkpoint import tensor_bytes
from rlonce.train.request import RLRequest
from rlonce.train.trainer import OptimSettings, Trainer

STATE_ERRORS = (KeyError, ValueError, RuntimeError, TypeError)
"""What loading a damaged optimizer state raises (torch and the trainer's own checks)."""


class TrainerStateError(RlonceError, ValueError):
    """A saved optimizer state that does not load into this trainer (the caller names the file)."""


class TrainerBackend(Protocol):
    engine: Engine

    def executor(self, domain, spec) -> tuple[Executor, int | None]:
        """The executor rollout groups run on, and the most sessions it holds at once (None: no cap)."""

    async def train(self, batch: StepResult, request: RLRequest) -> dict:
        """One optimizer step on ``batch``'s rows as ``request`` asks (``Trainer.rl_step``); the
        metrics carry ``lag_counts``: trained rows by version lag."""

    async def publish(self, version: int) -> int:
        """The trainer's current weights to every engine, as ``version``; the bytes of tensors one
        engine received (``publish_bytes``: the whole state dict, or under LoRA the adapter)."""

    def pull(self, model) -> dict:
        """Load the trainer's current weights into ``model``; return its optimizer state."""

    def close(self) -> None: ...


def restore_trainer(trainer: Trainer, state: dict, *, world: int = 1, rank: int = 0,
                    parallel_hint: str = "ray.trainer_workers > 1") -> None:
    """Load a checkpoint's optimizer ``state`` into ``trainer`` (rank ``rank`` of ``world``). A
    single trainer's state and data-parallel ranks' unsharded one do not mix: either way round,
    a ``BackendError`` says which setting resumes it."""
    parallel = "optimizer_full" in state
    if world > 1:
        if not parallel:
            raise BackendError("this checkpoint's optimizer state is from a single trainer; resume it with "
                               "ray.trainer_workers = 1")
        from rlonce.train.distributed import load_full_optimizer_state

        load_full_optimizer_state(trainer.model, trainer.optimizer, state["optimizer_full"] if rank == 0 else {})
        trainer.step = state["step"]
    elif parallel:
        raise BackendError(f"this checkpoint's optimizer state is from data-parallel trainers; resume it with "
                           f"{parallel_hint}")
    else:
        trainer.load_state_dict(state)


def train_rows(trainer: Trainer, rows: list, request: RLRequest) -> dict:
    """``trainer.rl_step`` on ``rows``, with the rows counted by version lag (``lag_counts``)."""
    metrics = trainer.rl_step(rows, request)
    metrics["lag_counts"] = dict(version_lags(rows, request.version))
    return metrics


class LocalBackend:
    """Trainer and engine in this process. The trainer updates ``lm.model`` in place; the engine
    generates with its own copy, built from the weights as they are now (after SFT)."""

    def __init__(self, cfg, lm, model_dir, *, version: int, optim: OptimSettings, trainer_state: dict | None = None,
                 engine_factory=None):
        self.trainer = Trainer(lm.model, optim, micro_batch_tokens=cfg.runtime.micro_batch_tokens, adapter=lm.peft)
        if trainer_state is not None:
            try:
                restore_trainer(self.trainer, trainer_state,
                                parallel_hint='executor = "ray" and ray.trainer_workers > 1')
            except BackendError:
                raise
            except STATE_ERRORS as e:
                raise TrainerStateError(f"optimizer state: {str(e)[:160]}") from None
        self.train_threads = cfg.runtime.train_threads
        self.overlap = cfg.rollout.mode == "async"
        """Async rollout keeps going on the event loop while the trainer steps on a thread."""
        spec = EngineSpec.from_config(cfg, model_dir)
        if engine_factory is not None:
            self.engine = engine_factory(0)
        elif spec.backend == "torch":
            # a plain model: under LoRA the adapters merged in (the engine's decode reads each weight)
            plain = lora.merged(lm.peft) if lm.peft is not None else copy.deepcopy(lm.model)
            self.engine = spec.build(lm=dataclasses.replace(lm, model=plain, peft=None), version=version)
        else:  # vLLM loads a folder (under LoRA the base), then takes the weights as they are now (after SFT)
            if lm.peft is not None and lora.is_adapter(model_dir):
                spec = dataclasses.replace(spec, model_dir=lora.adapter_base(model_dir))
            self.engine = spec.build(lm=lm, version=version)
            self.engine.load_weights(lora.adapter_weights(lm.peft, with_base=False) if lm.peft is not None
                                     else lm.model.state_dict(), version)
        if deterministic(cfg):  # waves of a fixed membership: the run repeats bit for bit
            self.engine = Lockstep(self.engine)

    def executor(self, domain, spec) -> tuple[Executor, None]:
        return LocalExecutor(domain.env_factory, self.engine, spec), None

    async def train(self, batch: StepResult, request: RLRequest) -> dict:
        if self.overlap:  # on a thread of its own, which does not inherit a torch thread count
            threads = self.train_threads

            def train():
                import torch

                torch.set_num_threads(threads)
                return self._train(batch, request)

            return await asyncio.get_running_loop().run_in_executor(None, train)
        return self._train(batch, request)

    def _train(self, batch: StepResult, request: RLRequest) -> dict:
        try:
            return train_rows(self.trainer, batch.rows, request)
        finally:  # the engine's worker decodes next: this thread's OpenMP team would slow it (rlonce.model.omp)
            omp.release()

    async def publish(self, version: int) -> int:
        """The whole state dict, or under LoRA the adapter's factors (``rlonce.model.lora.AdapterWeights``:
        the engine merges them into its own weights)."""
        adapter = self.trainer.adapter
        state = lora.adapter_weights(adapter) if adapter is not None else self.trainer.model.state_dict()
        self.engine.pause()  # in-flight turns stop at their next token and continue under the new weights
        try:
            faults.point("publish")
            self.engine.load_weights(state, version)
        finally:
            self.engine.resume()
        return state.nbytes if adapter is not None else tensor_bytes(state)

    def trained_logprobs(self) -> list:
        """Per row of the last ``train``: the trainer's log-probs of its next tokens when its
        gradient was taken (what the rollout log-probs are compared with; ``rlonce view``)."""
        return self.trainer.token_logprobs

    def pull(self, model) -> dict:
        if model is not self.trainer.model:
            model.load_state_dict(self.trainer.model.state_dict())
        return self.trainer.state_dict()

    def close(self) -> None:
        self.engine.close()
