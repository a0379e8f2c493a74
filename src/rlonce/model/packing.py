"""Padding-free forwards for training: a micro-batch's rows run through the decoder as one
concatenated sequence, so every linear layer (projections, MLP, norms) sees only real tokens.

Right-padded rows of a length-sorted micro-batch still carry a third of padding on the tool and
reasoning workloads (rows of 51–115 tokens padded to 115), and those padded positions cost as much
as real ones in every matmul. Here the rows are concatenated (positions restart at 0 in each
row, so rotary embeddings see what they would alone) and only attention is per row: the packed
queries, keys and values are laid out as a padded batch for one causal ``scaled_dot_product_attention``
call — a right-padded row's real tokens attend only to earlier real tokens — and gathered back.
That is block-diagonal causal attention without an N×N mask; attention is a small share of the
FLOPs at these lengths, the linear layers the rest.

The route is an attention implementation registered with transformers (``rlonce_packed``); a
model whose attention is ``sdpa`` is switched to it on first use. Outside a packed forward it is
exactly ``sdpa`` (same function, same masks), so a model the engine shares decodes as before.
Models with another attention implementation, rows that are not right-padded, and models
loaded with ``packing=False`` (``model.packing``) take the padded path."""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch

NAME = "rlonce_packed"
_LAYOUT: contextvars.ContextVar[Layout | None] = contextvars.ContextVar("rlonce_packed_layout", default=None)


@dataclass(frozen=True)
class Layout:
    """Where each packed position sits in the padded batch: ``index_N[p] = b * T + t``."""

    B: int
    T: int
    index_N: torch.Tensor

    @staticmethod
    def of(attn_BT: torch.Tensor) -> Layout | None:
        """The layout of right-padded rows (each row's mask is ones then zeros), or None when some
        row is not right-padded (left padding, holes)."""
        lengths_B = attn_BT.sum(1)
        B, T = attn_BT.shape
        ar_T = torch.arange(T, device=attn_BT.device)
        if not bool(((ar_T[None, :] < lengths_B[:, None]) == attn_BT.bool()).all()):
            return None
        index_N = (torch.arange(B, device=attn_BT.device)[:, None] * T + ar_T[None, :])[attn_BT.bool()]
        return Layout(B, T, index_N)

    def positions(self) -> torch.Tensor:
        """Position ids of the packed sequence (1×N): each row counts from 0."""
        return (self.index_N % self.T)[None]

    def to_padded(self, x_1HND: torch.Tensor) -> torch.Tensor:
        """(1, H, N, D) packed → (B, H, T, D) padded with zeros."""
        _, H, N, D = x_1HND.shape
        flat = x_1HND[0].transpose(0, 1)  # N, H, D
        out = flat.new_zeros(self.B * self.T, H, D).index_copy(0, self.index_N, flat)
        return out.view(self.B, self.T, H, D).transpose(1, 2)

    def to_packed(self, y_BTHD: torch.Tensor) -> torch.Tensor:
        """(B, T, H, D) padded → (1, N, H, D) packed."""
        B, T, H, D = y_BTHD.shape
        return y_BTHD.reshape(B * T, H, D).index_select(0, self.index_N)[None]


def _attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layout = _LAYOUT.get()
    if layout is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kwargs.pop("is_causal", None)
    out_BTHD, _ = sdpa_attention_forward(module, layout.to_padded(query), layout.to_padded(key),
                                         layout.to_padded(value), None, dropout=dropout, scaling=scaling,
                                         is_causal=True, **kwargs)
    return layout.to_packed(out_BTHD), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, _attention)
        AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def packable(model) -> bool:
    """Whether ``model`` runs packed: a transformers decoder on ``sdpa`` (or already switched),
    without sliding-window attention, not loaded with ``packing=False``. Switches it to the
    packed route, which is ``sdpa`` outside a packed forward."""
    if not getattr(model, "rlonce_packing", True):
        return False
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl not in ("sdpa", NAME) or getattr(config, "is_encoder_decoder", False):
        return False
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False  # the packed route attends causally over the whole row: no window
    if impl == "sdpa":
        _register()
        config._attn_implementation = NAME
        for sub in model.modules():  # sub-configs (a decoder's own config object) follow
            c = getattr(sub, "config", None)
            if c is not None and getattr(c, "_attn_implementation", None) == "sdpa":
                c._attn_implementation = NAME
    return True


@contextlib.contextmanager
def packed(layout: Layout):
    """Within this block, attention through the packed route treats its input as ``layout``'s rows."""
    token = _LAYOUT.set(layout)
    try:
        yield
    finally:
        _LAYOUT.reset(token)
