"""The torch engine's key/value caches: the running batch's, and finished sequences' kept for reuse.

A batch cache is a ``transformers`` ``DynamicCache`` whose layers are ``GrowLayer``: each layer's
keys and values are views of a buffer with room to grow, so appending a decoded token writes one
column in place instead of copying the whole cache (``DynamicLayer`` concatenates at every step).
Rows are left-padded: each row's tokens are the last columns of its row, the columns before them
masked out (a row prefilled after a kept cache also has a masked hole between the two). ``merge``
joins caches of different lengths into one batch (continuous batching) and ``take`` keeps some
rows and drops the columns no kept row uses.

``PrefixStore`` keeps the cache of finished sequences — prompt and reply, the tokens the model has
seen — under a memory budget, least recently used first out. A new prompt that starts with a
kept sequence's tokens (the next turn of the same session: history, the reply, then the tool's
answer) is prefilled from that sequence's cache and runs the model on the new tokens only; a
partial match (the system prompt a group shares) reuses the common part. Entries belong to a
lane: lockstep waves ('wave') look up and evict only among their own, and their lane is emptied
when a new round of lockstep sequences begins, so a deterministic run's reuse depends only on the
round's own history, not on what else the engine served; 'free' entries go first under pressure.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, keys and values, each (rows, kv heads, columns, head dim)."""


class GrowLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views of buffers with spare columns."""

    spare = 64

    def put(self, keys: torch.Tensor, values: torch.Tensor, room: int | None = None) -> None:
        """Hold ``keys``/``values`` (copied into fresh buffers with ``room`` spare columns)."""
        n = keys.shape[-2]
        room = self.spare if room is None else room
        self.is_initialized, self.device = True, keys.device
        self._kb = keys.new_empty((*keys.shape[:-2], n + room, keys.shape[-1]))
        self._vb = values.new_empty((*values.shape[:-2], n + room, values.shape[-1]))
        self._kb[..., :n, :], self._vb[..., :n, :] = keys, values
        self.keys, self.values = self._kb[..., :n, :], self._vb[..., :n, :]

    def adopt(self, kbuf: torch.Tensor, vbuf: torch.Tensor, n: int) -> None:
        """Hold buffers already filled up to column ``n``."""
        self.is_initialized, self.device = True, kbuf.device
        self._kb, self._vb = kbuf, vbuf
        self.keys, self.values = kbuf[..., :n, :], vbuf[..., :n, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.put(key_states, value_states)
            return self.keys, self.values
        n, t = self.keys.shape[-2], key_states.shape[-2]
        if n + t > self._kb.shape[-2]:  # out of room: double it
            self.put(self.keys, self.values, room=max(self.spare, n + t))
        self._kb[..., n:n + t, :], self._vb[..., n:n + t, :] = key_states, value_states
        self.keys, self.values = self._kb[..., :n + t, :], self._vb[..., :n + t, :]
        return self.keys, self.values


def new_cache(kv: KV | None = None, layers: int = 0) -> DynamicCache:
    """A batch cache of ``GrowLayer`` holding ``kv`` (or empty, with ``layers`` layers)."""
    cache = DynamicCache()
    cache.layers = [GrowLayer() for _ in range(len(kv) if kv is not None else layers)]
    for layer, (k, v) in zip(cache.layers, kv or []):
        layer.put(k, v)
    return cache


def kv_of(cache: DynamicCache) -> KV:
    return [(layer.keys, layer.values) for layer in cache.layers]


def growing(cache: DynamicCache | None) -> bool:
    """Whether every layer of ``cache`` is a ``GrowLayer`` with a spare column (a batch can decode in it)."""
    return cache is not None and all(type(layer) is GrowLayer and layer.keys.shape[-2] < layer._kb.shape[-2]
                                     for layer in cache.layers)


def mergeable(cache: DynamicCache) -> bool:
    """Only full-attention layers can be padded, merged and reused (not sliding windows)."""
    return all(type(layer) in (GrowLayer, DynamicLayer) for layer in cache.layers)


def merge(parts: list[tuple[KV, torch.Tensor]]) -> tuple[DynamicCache, torch.Tensor]:
    """One batch cache (with room to grow) stacking caches with their (rows, columns) attention
    masks, the shorter ones left-padded with masked zero columns; each part is copied once."""
    width = max(attn.shape[1] for _, attn in parts)
    attn = torch.cat([torch.nn.functional.pad(a, (width - a.shape[1], 0)) for _, a in parts])
    rows = attn.shape[0]
    cache = new_cache(layers=len(parts[0][0]))
    for layer, grow in enumerate(cache.layers):
        bufs = []
        for which in (0, 1):
            first = parts[0][0][layer][which]
            buf = first.new_empty((rows, first.shape[1], width + GrowLayer.spare, first.shape[-1]))
            r = 0
            for kv, _ in parts:
                x = kv[layer][which]
                n = x.shape[-2]
                buf[r:r + x.shape[0], :, :width - n].zero_()
                buf[r:r + x.shape[0], :, width - n:width] = x
                r += x.shape[0]
            bufs.append(buf)
        grow.adopt(bufs[0], bufs[1], width)
    return cache, attn


def take(kv: KV, attn: torch.Tensor, rows: list[int]) -> tuple[KV, torch.Tensor]:
    """Keep ``rows``, and only the columns at least one of them attends to."""
    sel = torch.tensor(rows)
    attn = attn[sel]
    used = attn.any(0).nonzero()
    first = int(used[0]) if len(used) else attn.shape[1]
    return [(k[sel, :, first:], v[sel, :, first:]) for k, v in kv], attn[:, first:]


def row_of(kv: KV, attn: torch.Tensor, row: int) -> KV:
    """Row ``row``'s columns that hold its tokens (where ``attn`` is 1), copied out of the batch."""
    cols = attn[row].nonzero()[:, 0]
    if len(cols) and int(cols[-1]) - int(cols[0]) + 1 == len(cols):  # one run of columns: a plain slice
        a, b = int(cols[0]), int(cols[-1]) + 1
        return [(k[row:row + 1, :, a:b].clone(), v[row:row + 1, :, a:b].clone()) for k, v in kv]
    return [(k[row:row + 1, :, cols], v[row:row + 1, :, cols]) for k, v in kv]


def nbytes(kv: KV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


@dataclass
class _Entry:
    tokens: np.ndarray
    kv: KV
    lane: str
    size: int
    last: int
    """The last token, as a Python int: a store compares it against every entry."""
    routes: np.ndarray | None = None
    """A sparse model's experts at each of ``tokens`` (``rlonce.model.moe``), kept with the cache they made."""


class PrefixStore:
    """Finished sequences' caches, by their tokens, within ``budget_bytes`` (module docstring)."""

    def __init__(self, budget_bytes: int):
        self.budget = budget_bytes
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next = 0
        self.used = 0
        self._lane_used: dict[str, int] = {}
        self.stats = {"lookups": 0, "hits": 0, "reused_tokens": 0, "stored": 0, "evicted": 0}

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: list[int], lane: str) -> tuple[int, KV | None, np.ndarray | None]:
        """The longest kept prefix of ``prompt`` (leaving at least its last token to run): its
        length, its cache and its experts (None: not kept), sliced to that length; (0, None, None)
        when nothing matches."""
        self.stats["lookups"] += 1
        best, best_key = self._longest(np.asarray(prompt, dtype=np.int64), lane, len(prompt) - 1)
        if best_key is None:
            return 0, None, None
        self._entries.move_to_end(best_key)
        self.stats["hits"] += 1
        self.stats["reused_tokens"] += best
        e = self._entries[best_key]
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in e.kv], None if e.routes is None else e.routes[:best]

    def covered(self, tokens: list[int], lane: str) -> int:
        """How many leading tokens of ``tokens`` a kept entry of ``lane`` holds (no statistics)."""
        return self._longest(np.asarray(tokens, dtype=np.int64), lane, len(tokens))[0]

    def _longest(self, p: np.ndarray, lane: str, limit: int) -> tuple[int, int | None]:
        best, best_key = 0, None
        for key, e in self._entries.items():
            n = min(len(e.tokens), limit)
            # an entry longer than ``best`` here must agree with ``p`` up to position ``best`` too
            if e.lane != lane or n <= best or e.tokens[best] != p[best]:
                continue
            same = e.tokens[:n] == p[:n]
            m = n if same.all() else int(same.argmin())
            if m > best:
                best, best_key = m, key
        return best, best_key

    def fits(self, size: int, lane: str) -> bool:
        """Whether an entry of ``size`` bytes of ``lane`` could be kept, pushing out what it may."""
        lanes = ("free",) if lane == "free" else ("free", lane)  # a free entry never pushes out a wave's
        return self.used - sum(self._lane_used.get(x, 0) for x in lanes) + size <= self.budget

    def put(self, tokens: list[int], kv: KV, lane: str, routes: np.ndarray | None = None) -> bool:
        """Keep ``kv`` (one row) for ``tokens`` if it fits, with ``routes`` (a sparse model's experts
        at each token) — kept prefixes of it are dropped, being redundant; whether it was kept (if
        not, what is there stays)."""
        size = nbytes(kv) + (0 if routes is None else routes.nbytes)
        if not self.fits(size, lane):
            return False
        t, n = np.asarray(tokens, dtype=np.int64), len(tokens)
        for key in [k for k, e in self._entries.items()  # the last token first (Python ints): most entries differ there
                    if e.lane == lane and len(e.tokens) <= n
                    and (e.last < 0 or e.last == tokens[len(e.tokens) - 1])
                    and np.array_equal(e.tokens, t[:len(e.tokens)])]:
            self._drop(key)
        if self.used + size > self.budget:
            for key in [k for k, e in self._entries.items() if e.lane == "free"] + \
                    [k for k, e in self._entries.items() if e.lane == lane != "free"]:
                if self.used + size <= self.budget:
                    break
                self._drop(key)
                self.stats["evicted"] += 1
        self._entries[self._next] = _Entry(t, kv, lane, size, int(tokens[-1]) if n else -1, routes)
        self._next += 1
        self.used += size
        self._lane_used[lane] = self._lane_used.get(lane, 0) + size
        self.stats["stored"] += 1
        return True

    def clear(self, lane: str | None = None) -> None:
        """Drop every entry (of ``lane``)."""
        for key in [k for k, e in self._entries.items() if lane in (None, e.lane)]:
            self._drop(key)

    def _drop(self, key: int) -> None:
        e = self._entries.pop(key)
        self.used -= e.size
        self._lane_used[e.lane] -= e.size
