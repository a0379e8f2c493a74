"""Trainer actors: data-parallel ranks that step on the payloads the pools left in the object store."""

from __future__ import annotations

import os

from rlonce.dist.common import ray_module
from rlonce.train.request import RLRequest


class TrainerActor:
    """The trainer in its own process: fetches the rows of the groups it trains on, steps, and
    publishes its weights to the object store by version.

    With ``ray.trainer_workers = N > 1`` there are N of them, ranks of one ``torch.distributed``
    group (gloo on CPU, NCCL on GPU) training one FSDP2-sharded model (``rlonce.train.distributed``):
    each fetches only its share of the step's groups, and the update equals one process's on the
    whole batch. Rank 0 publishes the gathered weights.

    With ``lora`` (``rlonce.config.LoraConfig``) the model carries peft adapters as the driver's
    does (the same state-dict keys), only they train, and a publish puts the adapter's factors
    alone (``rlonce.model.lora.AdapterWeights`` without W0: each engine actor holds its base)."""

    def __init__(self, model_dir: str, dtype: str, lm_head_fp32: bool, optim, threads: int,
                 state_refs: list, version: int, timeout: float = 300.0, autocast: bool = False,
                 packing: tuple[bool, bool] = (True, True), micro_batch_tokens: int = 2048, lora=None):
        import torch

        from rlonce.model import loader

        ray = ray_module()
        torch.set_num_threads(threads)
        self.timeout = timeout
        lm = loader.load(model_dir, dtype=dtype, lm_head_fp32=lm_head_fp32, autocast=autocast,
                         packing=packing[0], share_prefix=packing[1], lora_settings=lora)
        self.model, self.peft = lm.model, lm.peft
        if state_refs:
            self.model.load_state_dict(ray.get(state_refs[0], timeout=timeout))
        if torch.cuda.is_available():  # Ray shows this actor a GPU only when ray.trainer_gpus > 0
            self.model.to("cuda")
        self.optim, self.micro_batch_tokens = optim, micro_batch_tokens
        self.version, self._published = version, None
        self.rank, self.world = 0, 1

    def ready(self) -> dict:
        return {"pid": os.getpid(), "version": self.version, "rank": self.rank}

    def rendezvous(self) -> tuple[str, int]:
        """An address and free port on this actor's node for the process group (rank 0)."""
        import socket

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return ray_module().util.get_node_ip_address(), port

    def setup(self, rank: int, world: int, address: tuple[str, int] | None, trainer_state: dict | None) -> dict:
        """Build the trainer: alone, or as ``rank`` of ``world`` (joining the process group at
        ``address`` and sharding the model first: the optimizer must hold the shards)."""
        from rlonce.train.backend import restore_trainer
        from rlonce.train.trainer import Trainer

        self.rank, self.world = rank, world
        if world > 1:
            from rlonce.train.distributed import init_process_group, shard_model

            os.environ.update(MASTER_ADDR=address[0], MASTER_PORT=str(address[1]), RANK=str(rank),
                              WORLD_SIZE=str(world), LOCAL_RANK="0")
            init_process_group()
            shard_model(self.model)
        self.trainer = Trainer(self.model, self.optim, micro_batch_tokens=self.micro_batch_tokens, adapter=self.peft)
        if trainer_state:
            restore_trainer(self.trainer, trainer_state, world=world, rank=rank)
        self.publish(self.version)
        return self.ready()

    def rl_step(self, payload_refs: list, rows: list, request: RLRequest) -> dict:
        from rlonce.train.backend import train_rows

        for _, more in ray_module().get(payload_refs, timeout=self.timeout):
            rows = rows + list(more)
        return train_rows(self.trainer, rows, request)  # lag_counts: this rank's rows

    def _full_state(self) -> dict:
        if self.world > 1:
            from rlonce.train.distributed import full_state_dict

            return full_state_dict(self.model)  # every rank takes part; rank 0 gets the weights
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}

    def publish(self, version: int) -> tuple[list | None, int]:
        """Put the weights into the object store once (rank 0); engines fetch them by reference.
        The references and the bytes of the tensors put."""
        from rlonce.model import lora
        from rlonce.train.checkpoint import tensor_bytes

        self.version = version
        if self.peft is not None:  # every rank gathers the factors; rank 0 puts them
            adapter = lora.adapter_weights(self.peft, with_base=False)
            if self.rank == 0:
                self._published = [ray_module().put(adapter)]
            return self._published, adapter.nbytes if self.rank == 0 else 0
        state = self._full_state()
        if self.rank == 0:
            self._published = [ray_module().put(state)]  # serialised (copied) now
        return self._published, tensor_bytes(state) if self.rank == 0 else 0

    def latest(self) -> tuple[int, list | None]:
        return self.version, self._published

    def state(self) -> tuple[dict, dict]:
        """(weights, optimizer state) for a checkpoint; complete on rank 0."""
        model_state = self._full_state()
        if self.world > 1:
            from rlonce.train.distributed import full_optimizer_state

            return model_state, {"optimizer_full": full_optimizer_state(self.model, self.trainer.optimizer),
                                 "step": self.trainer.step}
        return model_state, self.trainer.state_dict()
