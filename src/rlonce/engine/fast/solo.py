"""Compiled decoding of a batch down to one row: ``torch.compile`` over a static cache.

One decode step of one sequence on a small model on the CPU costs mostly Python — the eager
forward's module calls — not its matmuls. ``torch.compile`` removes that, but it wants shapes
that stay the same from step to step, and the engine's caches grow by a column a step. So when a
batch is down to one row (a lone session, or the last straggler of a wave), the row's attended
columns move into a transformers ``StaticCache`` of a fixed size (the next power of two, at least
``MIN_COLUMNS``, that holds the row's whole token budget) and it decodes with the model compiled
for that size (``dynamic=False``: each size compiles once, a few seconds, the first time a row
needs it). A request that joins the batch moves the row back: ``Batch.kv()`` hands the filled
columns to the ordinary merge. Unfilled columns are masked by the model (the mask is built from
``cache_position``), so the log-probs are the eager ones up to float rounding.

If compiling fails (no C++ compiler, an inductor error, dynamo's recompile limit, which all
compiled models of a process share), the engine says so once and decodes eagerly from then on;
the row that found out loses nothing.
"""

from __future__ import annotations

import logging

import torch
from transformers import StaticCache

from rlonce.core import faults
from rlonce.engine import kvcache
from rlonce.engine.base import EngineError

log = logging.getLogger(__name__)

MIN_COLUMNS = 256


def columns_for(n: int, room: int) -> int:
    """The static cache size for a row of ``n`` columns that may add ``room`` more."""
    return max(MIN_COLUMNS, 1 << max(0, n + room - 1).bit_length())


class Solo:
    """The compiled model and the static caches it decodes over (module docstring)."""

    def __init__(self, model, cache_kw: str = "past_key_values"):
        self.model = model
        self.cache_kw = cache_kw
        """The model's name for its cache argument (``cache`` in newer transformers)."""
        self.compiled = torch.compile(model, dynamic=False)
        self.failed: str | None = None
        """Why compiling failed (then the engine decodes eagerly); None while it works."""
        self.stats = {"compiled_steps": 0, "compiled_entries": 0}

    def start(self, kv: kvcache.KV, room: int) -> StaticCache:
        """A static cache holding ``kv`` (one row, every column attended) with room for ``room`` more."""
        n = kv[0][0].shape[-2]
        cache = StaticCache(config=self.model.config, max_cache_len=columns_for(n, room))
        for layer, (k, v) in zip(cache.layers, kv, strict=True):
            layer.lazy_initialization(k, v)
            layer.keys[:, :, :n] = k
            layer.values[:, :, :n] = v
            layer.cumulative_length.fill_(n)
        return cache

    def step(self, cache: StaticCache, n: int, ids_R1: torch.Tensor, pos_R1: torch.Tensor) -> torch.Tensor:
        """Run token ``ids_R1`` at position ``pos_R1`` into column ``n`` of ``cache``: its next-token logits."""
        out = self.compiled(input_ids=ids_R1, position_ids=pos_R1, use_cache=True, cache_position=torch.tensor([n]),
                            **{self.cache_kw: cache})
        self.stats["compiled_steps"] += 1
        return out.logits[:, -1]

    def enter(self, kv: kvcache.KV, room: int, ids_R1: torch.Tensor, pos_R1: torch.Tensor):
        """Move a row's cache ``kv`` into a static cache and run its next token there — the step
        that may compile. Returns (cache, logits), or None once compiling has failed (the row's
        own cache is untouched: it runs eagerly)."""
        if self.failed is not None:
            return None
        try:
            faults.point("engine.compile", EngineError)
            cache = self.start(kv, room)
            with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):  # not a silent eager fallback
                logits = self.step(cache, kv[0][0].shape[-2], ids_R1, pos_R1)
        except Exception as e:  # noqa: BLE001 - compiling failed: say so once, decode eagerly
            self.give_up(e)
            return None
        self.stats["compiled_entries"] += 1
        return cache, logits

    def warm(self) -> None:
        """Compile for the smallest static cache: a one-token prompt run eagerly (so the cache has
        the dtypes real rows' have), then one step compiled after it."""
        try:
            cache = kvcache.new_cache()
            self.model(input_ids=torch.zeros((1, 1), dtype=torch.long), use_cache=True, **{self.cache_kw: cache})
            ids, pos = torch.ones((1, 1), dtype=torch.long), torch.ones((1, 1), dtype=torch.long)  # two
            # tensors: one passed as both would compile a graph for that aliasing, not for real steps
            if self.enter(kvcache.kv_of(cache), 1, ids, pos) is not None:
                self.stats["compiled_steps"] -= 1  # not a row's step
                self.stats["compiled_entries"] -= 1
        except Exception as e:  # noqa: BLE001 - the eager one-token forward failed: nothing will compile
            self.give_up(e)

    def give_up(self, e: Exception) -> None:
        self.failed = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}"
        log.warning("compiled decoding is off for this engine (compiling failed: %s); decoding eagerly", self.failed)


def kv_of(cache: StaticCache, n: int) -> kvcache.KV:
    """The first ``n`` (filled) columns of a static cache, as views."""
    return [(layer.keys[:, :, :n], layer.values[:, :, :n]) for layer in cache.layers]
