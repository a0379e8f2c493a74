"""The LM head where it is needed: the trainer computes logits only at the positions it trains on."""

from __future__ import annotations

import torch


def selected_logits(model, ids_BT: torch.Tensor, attn_BT: torch.Tensor, sel_BT: torch.Tensor) -> torch.Tensor:
    """The LM head's logits (N×V) at the N positions ``sel_BT`` (B×T-1) selects; the decoder runs
    on every token, the head only on those."""
    decoder = getattr(model, model.base_model_prefix)
    hidden_BTH = decoder(input_ids=ids_BT, attention_mask=attn_BT).last_hidden_state[:, :-1]
    return model.get_output_embeddings()(hidden_BTH[sel_BT])
