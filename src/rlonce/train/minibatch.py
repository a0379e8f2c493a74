"""Mini-batches of one RL step: whole prompt groups, balanced by tokens, the same on every rank.

Prompt-mean aggregation divides each group's token losses by the group's own token count (seed
001: "The denominator is the sum of output lengths within the prompt group … Tokens are
normalized within each prompt group, then prompt groups are averaged"). That is only the
seed's reduction when every mini-batch holds whole groups: a group dealt over two mini-batches
is normalised twice, over two halves. So rows are split by group (rows sharing ``group_id``,
the same key ``prompt-mean`` uses), never row by row.

Data-parallel, a group's rows may sit on several ranks (``rlonce.train.distributed.rows_for_rank``
deals rows; the Ray cluster deals whole groups). The split is therefore taken over the global
batch — every rank gathers every rank's group ids and lengths and computes the same assignment —
and each rank keeps its own rows of each mini-batch, possibly none.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch.distributed as dist

from rlonce.core.records import TrainingRow
from rlonce.train.distributed import gather


def minibatch_splits(group_ids: Sequence[str], lengths: Sequence[int], minibatches: int,
                     seed: int) -> list[list[int]]:
    """Row indices of each mini-batch, every prompt group whole in one of them.

    The groups, in a shuffle seeded by ``seed``, go one by one to the mini-batch with the fewest
    tokens so far (then the fewest rows, then the lowest index); indices within a mini-batch are
    in row order. With fewer groups than ``minibatches`` the empty mini-batches are left out, so
    there may be fewer than asked for."""
    if minibatches < 1:
        raise ValueError(f"minibatches must be >= 1, got {minibatches}")
    groups: dict[str, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    order = list(groups.values())
    random.Random(seed).shuffle(order)
    splits: list[list[int]] = [[] for _ in range(minibatches)]
    tokens = [0] * minibatches
    for rows in order:
        k = min(range(minibatches), key=lambda k: (tokens[k], len(splits[k]), k))
        splits[k].extend(rows)
        tokens[k] += sum(lengths[i] for i in rows)
    return [sorted(s) for s in splits if s]


def scaled_splits(group_ids: Sequence[str], lengths: Sequence[int], scales: Sequence[float], minibatches: int,
                  seed: int) -> list[tuple[list[int], float]]:
    """Mini-batches as ``minibatch_splits`` makes them, each with its learning-rate scale: rows of
    one scale (``TrainingRow.lr_scale``: their source's ``lr`` over ``rl.lr``) are split among
    themselves into up to ``minibatches`` mini-batches, scales in ascending order. A group's rows
    share their source, so its scale. One scale (every source at ``rl.lr``): ``minibatch_splits``
    with scale 1."""
    by_scale: dict[float, list[int]] = {}
    for i, s in enumerate(scales):
        by_scale.setdefault(float(s), []).append(i)
    out = []
    for scale in sorted(by_scale):
        idx = by_scale[scale]
        for split in minibatch_splits([group_ids[i] for i in idx], [lengths[i] for i in idx], minibatches, seed):
            out.append(([idx[j] for j in split], scale))
    return out


def rank_splits(group, rows: list[TrainingRow], minibatches: int, seed: int) -> list[tuple[list[int], float]]:
    """This rank's row indices of each mini-batch with the mini-batch's learning-rate scale:
    ``scaled_splits`` over every rank's rows (rank order), restricted to this rank's. Every rank
    gets as many mini-batches, with the same scales; one may be empty here. ``group``: the
    data-parallel process group, or None (one process)."""
    if group is None:
        return scaled_splits([r.group_id for r in rows], [len(r) for r in rows], [r.lr_scale for r in rows],
                             minibatches, seed)
    shards = gather(group, [(r.group_id, len(r), r.lr_scale) for r in rows])
    flat = [x for shard in shards for x in shard]
    start = sum(len(s) for s in shards[: dist.get_rank(group)])
    splits = scaled_splits([g for g, _, _ in flat], [n for _, n, _ in flat], [s for _, _, s in flat], minibatches,
                           seed)
    return [([i - start for i in s if start <= i < start + len(rows)], scale) for s, scale in splits]
