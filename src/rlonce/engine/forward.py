"""The torch engine's forward passes, and which of them it runs.

The reference is transformers' own forward (``Generic``), for every architecture, and it is what
the trainer's log-probs are checked against. The fast path (``rlonce.engine.fast``: a written-out
decode step and prefill for the Llama family, C loops for its elementwise work, compiled one-row
decoding) is taken only where ``engine.fast_path`` is on, the model is of that family, and a
parity check on this machine has just shown its logits and cached keys equal to the reference's
within the documented tolerance (``rlonce.engine.fast.parity``); otherwise the engine runs the
reference and says why in one line (``stepper``'s ``status``).
"""

from __future__ import annotations

import inspect
import logging
import os

from transformers import DynamicCache

from rlonce.engine import kvcache

log = logging.getLogger(__name__)

OFF_ENV = "RLONCE_FAST_PATH"
"""``RLONCE_FAST_PATH=off`` (or 0, false) in the environment: every engine of the process runs the
reference, whatever ``engine.fast_path`` says — for running a whole test suite on the reference
(``make test-reference``) or ruling the fast path out without editing configs."""


class Generic:
    """transformers' forward, for every architecture: the reference path."""

    status = ""
    """Why the engine runs this path (set by ``stepper``)."""

    def __init__(self, model, cache_kw: str):
        self.model, self.cache_kw = model, cache_kw
        self.last_only = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters \
            else {}

    def new_cache(self) -> DynamicCache:
        return kvcache.new_cache()  # transformers adds the layers the model's config asks for

    def __call__(self, ids_B1, pos_B1, cache, attn_BN):
        out = self.model(input_ids=ids_B1, attention_mask=attn_BN, position_ids=pos_B1, use_cache=True,
                         **{self.cache_kw: cache})
        return out.logits[:, -1]

    def prefill(self, ids_BT, pos_BT, cache, attn_BN):
        out = self.model(input_ids=ids_BT, attention_mask=attn_BN, position_ids=pos_BT, use_cache=True,
                         **{self.cache_kw: cache}, **self.last_only)
        return out.logits[:, -1]


def forced_off() -> bool:
    """Whether the environment turns the fast path off for this process (``OFF_ENV``)."""
    return os.environ.get(OFF_ENV, "").strip().lower() in ("0", "off", "false", "no")


def cache_keyword(model) -> str:
    """The name ``model.forward`` takes its key/value cache by."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def stepper(model, cache_kw: str, fast: bool = True, native_kernels: bool = True):
    """The engine's forward passes: ``step(ids_B1, pos_B1, cache, attn_BN) -> logits_BV`` (one new
    token per row; ``attn_BN`` None: every column attended), ``prefill(ids_BT, pos_BT, cache,
    attn_BN)`` (several, the last position's logits) and ``new_cache()``. The fast path's
    (``rlonce.engine.fast.enable``, its C loops with ``native_kernels``) where ``fast`` and it
    passes its parity check, else the reference; ``status`` says which, and why."""
    ref = Generic(model, cache_kw)
    if not fast:
        ref.status = "reference path (transformers' forward): engine.fast_path is false"
        return ref
    if forced_off():
        ref.status = f"reference path (transformers' forward): {OFF_ENV}={os.environ[OFF_ENV]}"
        return ref
    from rlonce.engine.fast import enable

    chosen, status = enable(model, ref, native_kernels)
    if chosen is None:
        ref.status = status
        return ref
    chosen.status = status
    return chosen
