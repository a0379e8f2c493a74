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
    n, kv, routes = store.lookup([1, 2, 3, 4, 5], "free")
    assert n == 3 and kv[0][0].shape[2] == 3
    assert store.lookup([1, 2, 3], "free")[0] == 2  # the last prompt token is always run
    assert store.lookup([1, 2, 9, 9], "free")[0] == 2  # a partial match
    assert store.lookup([1, 2, 3, 4], "wave") == (0, None, None)  # another lane's entries are not its own
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


def test_prefix_store_matches_a_brute_force_search_over_many_entries():
    """The longest kept prefix (the least recently used entry among equals) and the kept prefixes
    a new entry makes redundant, against checking every entry token by token."""
    import random

    import numpy as np

    def common(a, b) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    rng = random.Random(0)
    store = kvcache.PrefixStore(1 << 30)
    system = [1, 2, 3, 4]
    for _ in range(60):  # sessions sharing a system prompt, some extending an earlier one
        kept = [e.tokens.tolist() for e in store._entries.values()]
        base = rng.choice(kept) if kept and rng.random() < 0.4 else system + [rng.randint(5, 8)]
        toks = base + [rng.randint(5, 8) for _ in range(rng.randint(0, 6))]
        lane = rng.choice(["free", "free", "wave"])
        before = {k: e for k, e in store._entries.items()}
        store.put(toks, _kv(1, len(toks)), lane)
        dropped = {k for k in before if k not in store._entries}
        assert dropped == {k for k, e in before.items() if e.lane == lane and len(e.tokens) <= len(toks)
                           and e.tokens.tolist() == toks[:len(e.tokens)]}
        for _ in range(5):
            prompt = rng.choice([system, *[e.tokens.tolist() for e in store._entries.values()]])[:rng.randint(1, 12)]
            prompt = prompt + [rng.randint(5, 8) for _ in range(rng.randint(0, 3))]
            for lane_q in ("free", "wave"):
                limit = len(prompt) - 1
                scores = [(min(common(e.tokens.tolist(), prompt), limit), k)
                          for k, e in store._entries.items() if e.lane == lane_q]
                best = max([s for s, _ in scores], default=0)
                want = next((k for s, k in scores if s == best), None) if best > 0 else None
                assert store._longest(np.asarray(prompt), lane_q, limit) == (best, want)
