"""The engine's cache pieces by hand: growing layers, merging and trimming batches, the prefix store."""

import torch

from rlonce.engine import kvcache


def _kv(rows: int, cols: int, start: float = 0.0, layers: int = 2) -> kvcache.KV:
    """Keys/values whose every entry is its column's number (plus ``start``): easy to follow."""
    col = torch.arange(cols, dtype=torch.float32)[None, None, :, None] + start
    x = col.expand(rows, 1, cols, 2).clone()
    return [(x.clone(), -x.clone()) for _ in range(layers)]


def test_a_grow_layer_appends_in_place_and_doubles_when_full():
    layer = kvcache.GrowLayer()
    k, v = _kv(1, 3)[0]
    layer.put(k, v, room=2)
    buf = layer._kb.data_ptr()
    layer.update(k[:, :, :1] + 10, v[:, :, :1])
    assert layer._kb.data_ptr() == buf and layer.keys[0, 0, :, 0].tolist() == [0, 1, 2, 10]
    layer.update(k[:, :, :1] + 11, v[:, :, :1])
    layer.update(k[:, :, :1] + 12, v[:, :, :1])  # 6 > 5 columns of room: a new buffer
    assert layer._kb.data_ptr() != buf and layer.keys[0, 0, :, 0].tolist() == [0, 1, 2, 10, 11, 12]
    assert layer.get_seq_length() == 6


def test_merge_left_pads_and_take_drops_unused_columns():
    a, b = _kv(1, 2, start=100), _kv(2, 4)
    cache, attn = kvcache.merge([(a, torch.ones(1, 2, dtype=torch.long)), (b, torch.ones(2, 4, dtype=torch.long))])
    kv = kvcache.kv_of(cache)
    assert attn.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]]
    assert kv[0][0][0, 0, :, 0].tolist() == [0, 0, 100, 101] and kv[1][1].shape == (3, 1, 4, 2)
    kv2, attn2 = kvcache.take(kv, attn, [0])
    assert attn2.tolist() == [[1, 1]] and kv2[0][0][0, 0, :, 0].tolist() == [100, 101]
    attn[2, 0] = 0
    tail = kvcache.row_of(kv, attn, 2)
    assert tail[0][0][0, 0, :, 0].tolist() == [1, 2, 3] and tail[0][0].is_contiguous()
    attn[2, 2] = 0  # a masked hole: the kept cache, then new tokens
    assert kvcache.row_of(kv, attn, 2)[1][1][0, 0, :, 0].tolist() == [-1, -3]


def test_prefix_store_longest_match_partial_reuse_and_redundant_prefixes():
    store = kvcache.PrefixStore(1 << 20)
    store.put([1, 2, 3], _kv(1, 3), "free")
    n, kv = store.lookup([1, 2, 3, 4, 5], "free")
    assert n == 3 and kv[0][0].shape[2] == 3
    assert store.lookup([1, 2, 3], "free")[0] == 2  # the last prompt token is always run
    assert store.lookup([1, 2, 9, 9], "free")[0] == 2  # a partial match
    assert store.lookup([1, 2, 3, 4], "wave") == (0, None)  # another lane's entries are not its own
    store.put([1, 2, 3, 4, 5, 6], _kv(1, 6), "free")  # covers [1, 2, 3]: that one goes
    assert len(store) == 1 and store.lookup([1, 2, 3, 4, 5, 6, 7], "free")[0] == 6
    assert store.stats["hits"] == 4 and store.stats["reused_tokens"] == 3 + 2 + 2 + 6


def test_prefix_store_budget_least_recently_used_out_and_free_entries_never_push_out_wave_ones():
    one = kvcache.nbytes(_kv(1, 4))  # 2 layers x (keys + values) x 4 columns x 2 floats x 4 bytes
    assert one == 2 * 2 * 4 * 2 * 4
    store = kvcache.PrefixStore(3 * one)
    store.put([1, 1, 1, 1], _kv(1, 4), "wave")
    store.put([2, 2, 2, 2], _kv(1, 4), "free")
    store.put([3, 3, 3, 3], _kv(1, 4), "free")
    store.lookup([2, 2, 2, 2, 9], "free")  # [2...] is now the most recently used free entry
    store.put([4, 4, 4, 4], _kv(1, 4), "free")  # full: the least recently used free entry, [3...], goes
    assert store.lookup([3, 3, 3, 3, 9], "free")[0] == 0 and store.lookup([2, 2, 2, 2, 9], "free")[0] == 4
    assert store.stats["evicted"] == 1 and store.used == 3 * one
    store.put([5, 5, 5, 5], _kv(1, 4), "wave")  # a wave entry pushes out free ones first
    store.put([6, 6, 6, 6], _kv(1, 4), "wave")
    assert store.lookup([1, 1, 1, 1, 9], "wave")[0] == 4 and len(store) == 3
    store.put([7, 7, 7, 7], _kv(1, 4), "free")  # no free entry left to evict: not kept
    assert store.lookup([7, 7, 7, 7, 9], "free")[0] == 0 and len(store) == 3
    store.put([8] * 16, _kv(1, 16), "wave")  # larger than the whole budget: not kept, nothing lost
    assert len(store) == 3
    store.clear("wave")
    assert len(store) == 0 and store.used == 0
