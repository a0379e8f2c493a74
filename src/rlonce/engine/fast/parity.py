"""The fast path's parity check: before an engine decodes through the written-out step, the step
and transformers' forward run the same small batch on this machine's model and must agree.

The batch: two rows of seeded token ids, the shorter left-padded, prefilled; then three decode
steps, with a masked hole in the first row's columns (as a row prefilled after a kept cache has).
Compared: the logits of the prefill and of every step, and every layer's cached keys where
attended. Each largest difference is taken relative to the reference's largest magnitude (at
least 1); the check passes when both are within ``TOLERANCE`` (float32 weights; bfloat16 ones round
in different places on the two paths, ``BF16_TOLERANCE``). On the embedded model in float32
(torch's operations) the logits differed by 2.4e-7 and the keys by 2.9e-7, relative; with
bfloat16 weights by 4.0e-3 and 6.5e-3 (``tests/integration/test_engine_decode.py`` holds the
same comparisons at 2e-5 absolute). It costs a few forwards of 13 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TOLERANCE = 1e-5
"""Largest relative difference the fast path may show in float32."""
BF16_TOLERANCE = 4e-2
"""The same for bfloat16 weights (8 bits of mantissa, rounded at other points on each path)."""

PROMPT_LENGTHS = (9, 5)
STEPS = 3


@dataclass(frozen=True)
class Parity:
    ok: bool
    logits: float
    """Largest |fast − reference| over every logit compared, relative to the reference's largest |logit|."""
    keys: float
    """The same over every layer's attended cached keys."""
    tolerance: float
    native: bool
    """Whether the checked step ran its C loops."""
    error: str = ""
    """What raised, when the fast step failed outright."""

    def line(self) -> str:
        """One line: the verdict, both differences and the tolerance."""
        if self.error:
            return f"parity FAILED: the written-out step raised {self.error}"
        where = "with C loops" if self.native else "with torch's operations"
        verdict = "parity ok" if self.ok else "parity FAILED"
        return (f"{verdict} {where} (logits {self.logits:.1e}, cached keys {self.keys:.1e} relative; "
                f"tolerance {self.tolerance:.0e})")


def _run(fwd, model) -> tuple[torch.Tensor, list[torch.Tensor]]:
    from rlonce.engine.rows import left_pad

    vocab = model.get_input_embeddings().num_embeddings
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    ids, attn, pos = left_pad(prompts, 0)
    cache = fwd.new_cache()
    out = [fwd.prefill(ids, pos, cache, attn).float()]
    attn = attn.clone()
    attn[0, 2:4] = 0  # a hole in the first row's columns
    pos = pos[:, -1:]
    for _ in range(STEPS):
        nxt = torch.randint(1, vocab, (len(prompts), 1), generator=g)
        attn, pos = torch.cat([attn, torch.ones_like(nxt)], 1), pos + 1
        out.append(fwd(nxt, pos, cache, attn).float())
    keys = [layer.keys.float() * attn[:, None, :, None] for layer in cache.layers]
    return torch.stack(out), keys


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max().clamp(min=1.0))


def check(model, fast, reference) -> Parity:
    """Run the batch through ``fast`` (a ``FastDecode``) and ``reference`` (``Generic``) and compare."""
    tol = BF16_TOLERANCE if next(model.parameters()).dtype == torch.bfloat16 else TOLERANCE
    native = getattr(fast, "kernel", None) is not None
    with torch.inference_mode():
        want, want_keys = _run(reference, model)
        try:
            got, got_keys = _run(fast, model)
        except Exception as e:  # noqa: BLE001 — any failure of the fast step means: do not take it
            return Parity(False, float("inf"), float("inf"), tol, native, error=f"{type(e).__name__}: {e}"[:200])
    if got.shape != want.shape or len(got_keys) != len(want_keys) or not bool(torch.isfinite(got).all()):
        return Parity(False, float("inf"), float("inf"), tol, native)
    logits = _rel(got, want)
    keys = max(_rel(a, b) for a, b in zip(got_keys, want_keys))
    return Parity(logits <= tol and keys <= tol, logits, keys, tol, native)
