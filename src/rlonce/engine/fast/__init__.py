"""The torch engine's fast path, set apart from its reference (``rlonce.engine.forward``).

* ``decode``: a Llama-family model's decode step and prefill written out as their plain tensor
  operations, without transformers' per-call work;
* ``native`` (``step.c``): that step's rotary positions and attention, RMSNorm and
  ``silu(gate) * up`` in C loops (AVX-512, or AVX2 with FMA), built once per machine;
* ``solo``: a lone row decodes with ``torch.compile`` over a static cache (``engine.compile_solo``,
  off by default);
* ``parity``: logits and cached keys of a prefill and decode steps against transformers' forward,
  on this machine's model.

One switch turns it on or off: ``engine.fast_path`` (default true). Each engine that takes it
first runs the parity check on its own model (``enable``): only if the fast step agrees with the
reference within ``parity.TOLERANCE`` does it decode through it; otherwise it runs the reference
and logs why in one line. ``rlonce doctor`` runs the same check and shows its result.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def enable(model, reference, native_kernels: bool = True):
    """``(FastDecode, status)`` when ``model`` can take the written-out step and it passes the parity
    check against ``reference`` (``rlonce.engine.forward.Generic``) with the C loops where they
    build (``native_kernels``), else ``(None, why)``."""
    from rlonce.engine.fast import decode, parity

    why = decode.why_not(model)
    if why is not None:
        return None, f"reference path (transformers' forward): {why}"
    fast = decode.FastDecode(model, native_kernels)
    result = parity.check(model, fast, reference)
    if not result.ok:
        log.warning("engine fast path off: %s", result.line())
        return None, f"reference path (transformers' forward): {result.line()}"
    return fast, f"fast path: {result.line()}"
