"""What a batch of new prompts shares, so the torch engine runs each shared token once.

* Equal prompts (a GRPO group's samples) are prefilled once; the others read the first's cache
  (``dedupe``).
* A prefix that several different prompts start with — a system prompt, a task's preamble — is
  prefilled once, on its own, and kept in the engine's prefix store before the batch runs; the
  prompts then find it there as a kept prefix and run only their own tokens
  (``shared_prefixes``; ``TorchEngine._keep_shared``). On the toolfind sessions of
  ``benchmarks/throughput`` 38 of a first turn's ~50 tokens are the same for every session.
"""

from __future__ import annotations

import numpy as np

SHARED_MIN = 16
"""The shortest shared prefix worth a forward of its own and a cache merge per prompt."""


def dedupe(prompts: list[list[int]], kept: list[int]) -> tuple[list[int], list[int] | None, list[int]]:
    """Equal prompts run once: the index of each distinct prompt's first request, the distinct
    row each request reads (None: every prompt differs), and per request the prompt tokens it
    does not run — ``kept`` (read from a kept cache), or all of them when an equal prompt runs."""
    rows: dict[tuple[int, ...], int] = {}
    first, of, reused = [], [], []
    for i, (p, k) in enumerate(zip(prompts, kept)):
        key = tuple(p)
        if key not in rows:
            rows[key] = len(first)
            first.append(i)
            reused.append(k)
        else:
            reused.append(len(p))
        of.append(rows[key])
    return first, (of if len(first) < len(prompts) else None), reused


def common_length(a, b) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    same = np.asarray(a[:n]) == np.asarray(b[:n])
    return n if same.all() else int(same.argmin())


def shared_prefixes(prompts: list[list[int]], min_len: int = SHARED_MIN) -> list[list[int]]:
    """Prefixes of at least ``min_len`` tokens that two or more different prompts start with: in
    sorted order, each run of neighbours that share that much gives the prefix common to the run."""
    distinct = sorted({tuple(p) for p in prompts})
    out, i = [], 0
    while i < len(distinct) - 1:
        j, common = i, None
        while j + 1 < len(distinct):
            n = common_length(distinct[j], distinct[j + 1])
            n = n if common is None else min(common, n)
            if n < min_len:
                break
            common, j = n, j + 1
        if common is not None:
            out.append(list(distinct[i][:common]))
        i = j + 1
    return out


def charge(fresh: list[list[int]], prompts: list[list[int]], kept: list[int]) -> tuple[list[int], int]:
    """Per request, its prompt tokens read from a kept cache, with each prefix run for this
    admission (``fresh``) charged to the first request that reads it: those tokens were run once,
    not reused, and ``cached_prompt_tokens`` says so. Also the fresh tokens no request read."""
    out, unread = list(kept), 0
    for prefix in fresh:
        n = len(prefix)
        i = next((i for i, p in enumerate(prompts) if out[i] >= n and p[:n] == prefix), None)
        if i is None:
            unread += n
        else:
            out[i] -= n
    return out, unread


def kv_bytes_per_token(model) -> int:
    """What one token's keys and values take in ``model``'s cache (0 if its config does not say)."""
    cfg = model.config
    try:
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return 2 * cfg.num_hidden_layers * heads * dim * next(model.parameters()).element_size()
    except (AttributeError, TypeError, StopIteration):
        return 0
