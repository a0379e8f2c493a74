"""Mini-batches hold whole prompt groups, so prompt-mean normalises each group over all of it."""

import random

import pytest
import torch

from rlonce.algo.losses import aggregation_weights
from rlonce.train.minibatch import minibatch_splits


def test_eight_row_groups_are_never_split_over_two_minibatches():
    # four groups of 8 rows (the default group size), rows of varied lengths, groups interleaved
    group_ids = [f"g{i % 4}" for i in range(32)]
    lengths = [10 + (7 * i) % 13 for i in range(32)]
    for seed in range(50):
        splits = minibatch_splits(group_ids, lengths, 2, seed)
        assert sorted(i for s in splits for i in s) == list(range(32))  # every row exactly once
        for s in splits:
            for g in {group_ids[i] for i in s}:
                assert sum(group_ids[i] == g for i in s) == 8  # the whole group, never 3/5
        assert [len(s) for s in splits] == [16, 16]  # two groups each: equal rows go to the lighter side
    assert minibatch_splits(group_ids, lengths, 2, 0) == minibatch_splits(group_ids, lengths, 2, 0)


def test_prompt_mean_weights_of_a_minibatch_cover_each_group_once():
    group_ids = [f"g{i % 4}" for i in range(32)]
    mask_BT = torch.ones(32, 5)
    mask_BT[::3, 3:] = 0  # rows of unequal trained lengths
    for s in minibatch_splits(group_ids, [5] * 32, 2, seed=7):
        w_BT = aggregation_weights(mask_BT[s], "prompt-mean", group_ids_B=[group_ids[i] for i in s])
        for g in {group_ids[i] for i in s}:
            rows = [j for j, i in enumerate(s) if group_ids[i] == g]
            # two whole groups per mini-batch: each group's tokens carry 1/2 of the mini-batch's loss
            assert float(w_BT[rows].sum()) == pytest.approx(0.5)


def test_groups_go_to_the_lightest_minibatch_in_seeded_order():
    # A = rows 0, 3, 5 (5 tokens each: 15), B = row 1 (9), C = rows 2, 4 (4 each: 8)
    group_ids = ["A", "B", "C", "A", "C", "A"]
    lengths = [5, 9, 4, 5, 4, 5]
    orders = {}
    for seed in (0, 4, 5):
        o = ["A", "B", "C"]
        random.Random(seed).shuffle(o)
        orders[seed] = o
    assert orders == {0: ["A", "C", "B"], 4: ["C", "B", "A"], 5: ["A", "B", "C"]}
    # seed 0: A → mb0 (15); C → mb1 (8); B → mb1 (8 < 15: 17)
    assert minibatch_splits(group_ids, lengths, 2, 0) == [[0, 3, 5], [1, 2, 4]]
    # seed 4: C → mb0 (8); B → mb1 (9); A → mb0 (8 < 9: 23)
    assert minibatch_splits(group_ids, lengths, 2, 4) == [[0, 2, 3, 4, 5], [1]]
    # seed 5: A → mb0 (15); B → mb1 (9); C → mb1 (9 < 15: 17)
    assert minibatch_splits(group_ids, lengths, 2, 5) == [[0, 3, 5], [1, 2, 4]]
    # more mini-batches than groups: one group each, the empty fourth left out
    assert minibatch_splits(group_ids, lengths, 4, 0) == [[0, 3, 5], [2, 4], [1]]
    assert minibatch_splits(group_ids, lengths, 1, 0) == [[0, 1, 2, 3, 4, 5]]
    with pytest.raises(ValueError):
        minibatch_splits(group_ids, lengths, 0, 0)
