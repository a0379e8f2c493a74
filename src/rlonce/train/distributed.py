"""Data-parallel training with FSDP2: N processes, each holding 1/N of a global batch.

The contract: ``shard_model`` shards a model over the default process group, ``rows_for_rank``
gives each rank its share of the global batch of ``TrainingRow``s, and a ``Trainer`` built on
the sharded model then makes, from its rank's rows, the update one process would make from the
whole batch (``rlonce.train.trainer`` computes the aggregation weights from the global
mini-batch, and FSDP sums the gradients rather than averaging them). ``full_state_dict``
gathers the unsharded weights on rank 0 to publish to engines or checkpoints.

Launch one process per device with ``torchrun --nproc-per-node N``; ``init_process_group``
reads its environment. Gloo serves CPU processes, NCCL GPUs.
"""

from __future__ import annotations

import os
import types
from collections.abc import Sequence

import torch
import torch.distributed as dist

from rlonce.core.records import TrainingRow

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def init_process_group(backend: str | None = None) -> tuple[int, int]:
    """Join the process group torchrun describes; returns ``(rank, world_size)``.

    ``backend`` defaults to 'nccl' when CUDA is available (the process then uses the GPU
    ``LOCAL_RANK``), else 'gloo'."""
    missing = [k for k in TORCHRUN_ENV if k not in os.environ]
    if missing:
        raise RuntimeError(f"data-parallel training needs the torchrun environment; {', '.join(missing)} "
                           "not set (launch with `torchrun --nproc-per-node N ...`)")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    return dist.get_rank(), dist.get_world_size()


def decoder_layers(model) -> list[torch.nn.Module]:
    """The transformer blocks: ``<base>.layers`` of a Hugging Face decoder, else every module
    whose class name ends in 'DecoderLayer' or 'Block'."""
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    layers = getattr(base, "layers", None)
    if isinstance(layers, torch.nn.ModuleList):
        return list(layers)
    return [m for m in model.modules() if type(m).__name__.endswith(("DecoderLayer", "Block"))]


def shard_model(model, mesh=None):
    """Shard ``model`` in place with FSDP2 — each decoder layer, then the root — and return it.

    The root group holds the embeddings, the final norm and the LM head; a tied head is the
    embedding's own parameter, so the tie stays inside that one group (torch 2.13 refuses a
    shared parameter split across groups). Gradients are summed over ranks, not averaged: the
    trainer's loss already carries global denominators. ``selected_logits`` is registered as a
    forward method so the trainer's head-on-trained-tokens path gathers the root's parameters
    like a call to ``model(...)`` would. Build the ``Trainer`` (its optimizer) after this.
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

    from rlonce.model.logits import selected_logits

    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM
    model.selected_logits = types.MethodType(selected_logits, model)
    register_fsdp_forward_method(model, "selected_logits")
    return model


def rows_for_rank(rows: Sequence[TrainingRow], rank: int, world: int) -> list[TrainingRow]:
    """This rank's share of the global batch, balanced by token count.

    Longest rows first, each goes to the rank with the fewest tokens so far (the lowest rank on
    a tie); every rank computes the same assignment, and every row goes to exactly one rank.
    The rows keep their global order."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world}")
    load = [0] * world
    owner = [0] * len(rows)
    for i in sorted(range(len(rows)), key=lambda i: (-len(rows[i]), i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += len(rows[i])
    return [row for row, r in zip(rows, owner) if r == rank]


def data_parallel_group(model) -> dist.ProcessGroup | None:
    """The process group ``model``'s parameters are sharded over (FSDP2 DTensors), else None."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    from torch.distributed.tensor import DTensor

    p = next(iter(model.parameters()), None)
    return p.device_mesh.get_group() if isinstance(p, DTensor) else None


def gather(group: dist.ProcessGroup, obj) -> list:
    """Every rank's ``obj``, in rank order."""
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def sum_over_ranks(group: dist.ProcessGroup | None, values: dict[str, float]) -> dict[str, float]:
    """Each key summed over the ranks that have it; ``values`` itself without a group."""
    if group is None:
        return values
    out: dict[str, float] = {}
    for shard in gather(group, values):
        for k, v in shard.items():
            out[k] = out.get(k, 0.0) + v
    return out


def cat_over_ranks(group: dist.ProcessGroup | None, tensors: list[torch.Tensor]) -> torch.Tensor:
    """Every rank's ``tensors`` concatenated in rank order; this rank's alone without a group."""
    if group is None:
        return torch.cat(tensors) if tensors else torch.empty(0)
    return torch.cat([t for shard in gather(group, tensors) for t in shard] or [torch.empty(0)])


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """The unsharded weights, on CPU, on rank 0 (every rank must call it; the others get {})."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def full_optimizer_state(model, optimizer) -> dict:
    """The optimizer state unsharded and keyed by parameter name, on rank 0 (every rank must
    call it): a checkpoint that any number of ranks can load (``load_full_optimizer_state``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_optimizer_state(model, optimizer, state: dict) -> None:
    """Load ``full_optimizer_state``'s result (given on rank 0, ``{}`` elsewhere) into every rank's shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, optim_state_dict=state,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
