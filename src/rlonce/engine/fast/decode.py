"""The torch engine's forward passes: the decode step (one new token per row, after its cache)
and the prefill (a prompt's tokens, or a turn's new ones after a kept cache).

For models of the Llama family (``llama``, ``qwen2``: pre-norm decoder layers of RMSNorm, grouped
query attention with rotary positions, a gated SiLU MLP) both are written out here as the
plain sequence of tensor operations, over the same weights: transformers' generic forward spends
most of a small model's one-token step in per-call work around the arithmetic (masks built
for any shape, cache bookkeeping, output records, attention dispatch), which this skips. Where
``rlonce.engine.fast.native``'s C loops build and the tensors are float32,
the step's rotary positions and attention of one query per row run in one of them, and RMSNorm and
the MLP's ``silu(gate) * up`` in others (in a prefill too): each one call where torch makes several.
Otherwise attention is two batched products against the cached keys and values; either way each
query head reads its key/value head (no repeated copies) and the batch's attention mask is an
additive bias on the scores. A prefill's attention is
``scaled_dot_product_attention`` over the grouped heads with a boolean mask (attended columns,
causal among the new tokens), and its last layer runs the query, attention and MLP at each row's
last position only — the one whose logits are read.
Everything else — weights, rotary tables, the LM head (float32 under autocast or
bfloat16 weights, ``fp32_lm_head``) — is the model's own modules, so a weight load or an
optimizer step is seen at once. On the embedded model a 64-row step took 0.64× the time of
transformers' forward and a one-row step 0.45×, a prefill 0.74–0.79× (one-off timings;
``docs/performance.md``); logits and cached keys agree with transformers' forward, and the
log-probs with the trainer's recomputation, within float32 rounding
(``tests/integration/test_engine_decode.py``).

Other architectures, a failed parity check (``rlonce.engine.fast.parity``), or
``engine.fast_path = false`` run transformers' forward (``rlonce.engine.forward``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from rlonce.engine import kvcache
from rlonce.engine.fast import native

FAMILY = ("llama", "qwen2")
"""``config.model_type`` values whose decoder layers this step reproduces."""


def why_not(model) -> str | None:
    """Why ``model`` cannot take the fast step (None: it can)."""
    cfg, inner = model.config, getattr(model, "model", None)
    if cfg.model_type not in FAMILY:
        return f"model type {cfg.model_type!r} is not one of {', '.join(FAMILY)}"
    if inner is None or not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "the model's layout is not embed_tokens, layers, norm, rotary_emb"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r}, not silu"
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()) \
            or getattr(cfg, "use_sliding_window", False):
        return "sliding-window attention"
    for layer in inner.layers:
        a = layer.self_attn
        if not all(hasattr(a, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj", "scaling")) \
                or any(hasattr(a, n) for n in ("q_norm", "k_norm")) \
                or not all(hasattr(layer.mlp, p) for p in ("gate_proj", "up_proj", "down_proj")):
            return "a decoder layer is not q/k/v/o attention and a gated MLP"
    return None


class FastDecode:
    """The written-out one-token step of a Llama-family model (module docstring)."""

    status = ""
    """Its parity check's verdict (set by ``rlonce.engine.forward.stepper``)."""

    def __init__(self, model, native_kernels: bool = True):
        self.model, self.inner, cfg = model, model.model, model.config
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        found = native.kernel() if native_kernels else None
        self.kernel = None if isinstance(found, str) else found
        """``rlonce.engine.fast.native``'s loops (None: torch's operations)."""

    def new_cache(self) -> DynamicCache:
        return kvcache.new_cache(layers=len(self.inner.layers))

    def __call__(self, ids_B1: torch.Tensor, pos_B1: torch.Tensor, cache, attn_BN: torch.Tensor | None) -> torch.Tensor:
        x_BH = self.inner.embed_tokens(ids_B1)[:, 0]
        step = {"rot": self.inner.rotary_emb(x_BH, pos_B1)}  # the step's tables, each made once when first needed
        if attn_BN is not None:  # masked columns (left padding, holes) add -inf before the softmax
            step["BN"] = torch.zeros(attn_BN.shape, dtype=torch.float32).masked_fill_(attn_BN == 0, float("-inf"))
        for layer, cached in zip(self.inner.layers, cache.layers):
            a, mlp = layer.self_attn, layer.mlp
            o = self._attention(self._norm(x_BH, layer.input_layernorm), a, cached, step)
            x_BH = _residual(x_BH, o.view(x_BH.shape[0], self.heads * self.head_dim), a.o_proj)
            x_BH = _residual(x_BH, self._gated(self._norm(x_BH, layer.post_attention_layernorm), mlp), mlp.down_proj)
        return _head(self.model, self._norm(x_BH, self.inner.norm))

    def _attention(self, h_BH: torch.Tensor, a, cached, step: dict) -> torch.Tensor:
        """A layer's attention for one new token per row: its query, key and value, the key and
        value appended to ``cached``, the query against the row's cache; (B, kv heads, G, D).
        ``rlonce.engine.fast.native``'s loop where it takes these tensors and the cache is a ``GrowLayer``
        (whose ``update`` hands back views of its buffers: the key is appended as it comes and
        rotated there, in place), else torch's rotations and ``_attend``."""
        B, d, kvh = h_BH.shape[0], self.head_dim, self.kv_heads
        q = _linear(h_BH, a.q_proj).view(B, kvh, self.heads // kvh, d)
        k, v = _linear(h_BH, a.k_proj).view(B, kvh, 1, d), _linear(h_BH, a.v_proj).view(B, kvh, 1, d)
        if self.kernel is not None and type(cached) is kvcache.GrowLayer and native.usable(q, k, v):
            if "BD" not in step:  # the rotary tables as (B, D) rows
                step["BD"] = tuple(t.reshape(B, d).float().contiguous() for t in step["rot"])
            keys, values = cached.update(k, v)
            return native.attend(self.kernel, q, keys, values, step.get("BN"), (*step["BD"], a.scaling))
        if "B11D" not in step:  # rotating half = rolling, a sign flipped
            cos, sin = (t.view(B, 1, 1, d) for t in step["rot"])
            step["B11D"] = cos, torch.cat((-sin[..., :d // 2], sin[..., d // 2:]), -1)
        if a.scaling not in step:  # the tables times the attention's scale: the query comes out scaled
            step[a.scaling] = tuple(t * a.scaling for t in step["B11D"])
        keys, values = cached.update(_rope(k, *step["B11D"]), v)
        q = _rope(q, *step[a.scaling])
        if "BN" in step and "R1N" not in step:  # the bias per row and head, made once
            step["R1N"] = step["BN"][:, None, :].expand(B, kvh, keys.shape[-2]).reshape(B * kvh, 1, -1)
        return _attend(q.reshape(B * kvh, -1, d), keys, values, step.get("R1N"))

    def _norm(self, x: torch.Tensor, m) -> torch.Tensor:
        """The RMSNorm ``m`` of ``x``: ``rlonce.engine.fast.native``'s loop where it takes these, else ``_norm``."""
        if self.kernel is not None and native.norm_usable(x, m.weight):
            return native.rms_norm(self.kernel, x, m.weight, _eps(m))
        return _norm(x, m)

    def _gated(self, h: torch.Tensor, mlp) -> torch.Tensor:
        """The MLP's ``silu(gate(h)) * up(h)``, in the gate's output: no further buffer (a prefill's
        are megabytes, which the allocator maps fresh and the kernel zeroes each time)."""
        gate, up = _linear(h, mlp.gate_proj), _linear(h, mlp.up_proj)
        if self.kernel is not None and native.silu_usable(gate, up):
            return native.silu_mul(self.kernel, gate, up)
        return F.silu(gate, inplace=True).mul_(up)

    def prefill(self, ids_BT: torch.Tensor, pos_BT: torch.Tensor, cache, attn_BN: torch.Tensor) -> torch.Tensor:
        """Run ``T`` new tokens per row after ``cache`` (``attn_BN``: every column of the cache after
        them, 1 where attended) and append their keys and values; the next-token logits of each
        row's last position. The last layer runs its query, attention and MLP at that position only:
        no other position's output is read (transformers' forward runs them all)."""
        B, T = ids_BT.shape
        d, kvh, H = self.head_dim, self.kv_heads, self.heads
        N = attn_BN.shape[1]
        x = self.inner.embed_tokens(ids_BT)
        cos, sin = self.inner.rotary_emb(x, pos_BT)
        cos, sin = cos[:, None], torch.cat((-sin[..., :d // 2], sin[..., d // 2:]), -1)[:, None]  # (B, 1, T, d)
        # a query sees the attended columns up to its own, and always its own (a left-padded one has no other)
        own = torch.arange(N - T, N)
        allowed = (attn_BN[:, None, :] != 0) & (torch.arange(N)[None, :] <= own[:, None])[None]
        allowed[:, torch.arange(T), own] = True
        allowed = allowed[:, None]  # (B, 1, T, N)
        x = x.reshape(B * T, -1)
        last = len(self.inner.layers) - 1
        for i, (layer, cached) in enumerate(zip(self.inner.layers, cache.layers)):
            a, mlp = layer.self_attn, layer.mlp
            h = self._norm(x, layer.input_layernorm)
            k = _rope(_linear(h, a.k_proj).view(B, T, kvh, d).transpose(1, 2), cos, sin)
            keys, values = cached.update(k, _linear(h, a.v_proj).view(B, T, kvh, d).transpose(1, 2))
            if i == last:  # from here on, each row's last position only
                x, h, cos_q, sin_q, mask, t = x.view(B, T, -1)[:, -1], h.view(B, T, -1)[:, -1], cos[:, :, -1:], \
                    sin[:, :, -1:], allowed[:, :, -1:], 1
            else:
                cos_q, sin_q, mask, t = cos, sin, allowed, T
            q = _rope(_linear(h, a.q_proj).view(B, t, H, d).transpose(1, 2), cos_q, sin_q)
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=a.scaling, enable_gqa=True)
            x = _residual(x, o.transpose(1, 2).reshape(B * t, H * d), a.o_proj)
            x = _residual(x, self._gated(self._norm(x, layer.post_attention_layernorm), mlp), mlp.down_proj)
        return _head(self.model, self._norm(x, self.inner.norm))


def _attend(q_RGD: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias_R1N: torch.Tensor | None):
    """One query per row and head against its cached keys and values, ``R`` = rows × kv heads with
    ``G`` query heads each: scores (plus the mask's bias, in the same product), softmax in float32,
    weighted values."""
    R, N, D = q_RGD.shape[0], keys.shape[-2], keys.shape[-1]
    keys_RDN = keys.transpose(-1, -2).reshape(R, D, N)  # views of the cache: rows and kv heads fold
    s = (torch.baddbmm(bias_R1N.to(q_RGD.dtype), q_RGD, keys_RDN) if bias_R1N is not None
         else torch.bmm(q_RGD, keys_RDN)).float()
    return torch.bmm(s.softmax(-1).to(values.dtype), values.reshape(R, N, D))


FLIP_ROWS = 128
"""A float32 product of at most this many rows runs as ``W·xᵀ`` (its transpose): MKL runs the weight
as the left operand faster when the rows are few (``_flipped``)."""


def _flipped(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``x·Wᵀ`` runs as ``(W·xᵀ)ᵀ``: float32 rows, at most ``FLIP_ROWS`` of them, outside
    autocast. On SmolLM2's decode step at 64 rows (AVX2, two threads) the layers' products took 0.87×
    the time and the LM head's 0.77× (one-off, 2026-12-07; ``docs/performance.md``); same products,
    other blocking, so the results differ in the last bits."""
    return (x.dim() == 2 and x.shape[0] <= FLIP_ROWS and x.dtype == w.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu"))


def _linear(x: torch.Tensor, m: torch.nn.Linear) -> torch.Tensor:
    if _flipped(x, m.weight):
        y = torch.mm(m.weight, x.t())
        return (y if m.bias is None else y.add_(m.bias[:, None])).t().contiguous()
    return F.linear(x, m.weight, m.bias)


def _residual(x: torch.Tensor, h: torch.Tensor, m: torch.nn.Linear) -> torch.Tensor:
    """``x + m(h)``: one matmul adding into ``x`` where the types allow (no bias, one dtype)."""
    if m.bias is None and _flipped(h, m.weight) and x.dtype == torch.float32:
        return torch.add(x, torch.mm(m.weight, h.t()).t())
    if m.bias is None and x.dtype == h.dtype == m.weight.dtype:
        return torch.addmm(x, h, m.weight.t())
    return x + _linear(h, m)


def _head(model, h: torch.Tensor) -> torch.Tensor:
    """The LM head's logits of ``h``: flipped (``_flipped``) where the head is a plain float32
    ``Linear``, else the model's module (a float32 head under autocast or bfloat16 weights)."""
    head = model.lm_head
    if type(head) is torch.nn.Linear and "forward" not in vars(head) and head.bias is None \
            and _flipped(h, head.weight):
        return torch.mm(head.weight, h.t()).t().contiguous()
    return head(h)


def _norm(x: torch.Tensor, m) -> torch.Tensor:
    """The layer's RMSNorm: one fused call in float32; the module itself otherwise (it computes in
    float32 and rounds before its weight, which the fused call does not)."""
    if x.dtype == torch.float32 and m.weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), m.weight, _eps(m))
    return m(x)


def _eps(m) -> float:
    return getattr(m, "variance_epsilon", getattr(m, "eps", 1e-6))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions: ``x * cos + rotate_half(x) * sin``, where ``rotate_half(x) * sin`` is ``x``
    rolled by half its width times ``sin`` with its first half negated (as the step passes it)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin)
