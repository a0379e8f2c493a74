"""bfloat16 matmuls where the CPU has units for them: ``model.autocast``.

With autocast on, the engine's and the trainer's forward passes run under
``torch.autocast("cpu", dtype=torch.bfloat16)``: matrix products in bfloat16, the weights (and the
optimizer's state) in float32 — the master copy — and the LM head in float32 (``fp32_lm_head``
keeps it out of autocast; MiniMax-M1 §3.2). On a CPU with AVX-512 BF16 or AMX this makes the
batched products 2.5–6× faster (one token at a time it is slower); the log-prob mismatch between
engine and trainer grows, which the run's mismatch metric reports.
"""

from __future__ import annotations

import contextlib
from pathlib import Path


def bf16_units() -> bool:
    """Whether this CPU has bfloat16 matrix units (the ``avx512_bf16`` or ``amx_bf16`` flags)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def wants_autocast(setting: str) -> bool:
    """``model.autocast``: 'bfloat16' on, 'off' off, 'auto' on where the CPU has bfloat16 units."""
    return setting == "bfloat16" or (setting == "auto" and bf16_units())


def use_autocast(model, on: bool = True, lm_head_fp32: bool = True) -> None:
    """Run ``model``'s forward passes (in the engine and the trainer) under bfloat16 autocast, its
    LM head in float32 unless ``lm_head_fp32`` is off; the weights stay as they are."""
    from rlonce.model.loader import fp32_lm_head

    model.rlonce_autocast = on
    if on and lm_head_fp32:
        fp32_lm_head(model)


def autocast(model):
    """The context ``model``'s forward passes run in: bfloat16 autocast if ``use_autocast`` turned it on."""
    if getattr(model, "rlonce_autocast", False):
        import torch

        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()
