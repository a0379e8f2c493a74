"""The LM head where it is needed: the trainer computes logits only at the positions it trains on,
and normalises each token's log-prob over the candidate set it was sampled from."""

from __future__ import annotations

import torch

from rlonce.model.packing import Layout, packable, packed, shares_prefixes


def selected_logits(model, ids_BT: torch.Tensor, attn_BT: torch.Tensor, sel_BT: torch.Tensor) -> torch.Tensor:
    """The LM head's logits (N×V) at the N positions ``sel_BT`` (B×T-1) selects; the decoder runs
    on every token, the head only on those. Right-padded rows of a model that can
    (``rlonce.model.packing``) run packed: the decoder sees their real tokens only, and a prefix
    rows share once."""
    decoder = getattr(model, model.base_model_prefix)
    head = model.get_output_embeddings()
    layout = Layout.of(attn_BT, ids_BT if shares_prefixes(model) else None) if packable(model) else None
    if layout is not None:
        at_N = layout.where_BT()[:, :-1][sel_BT]
        if bool((at_N >= 0).all()):
            ids_1N = ids_BT.reshape(-1)[layout.index_N][None]
            with packed(layout):
                hidden_NH = decoder(input_ids=ids_1N, attention_mask=torch.ones_like(ids_1N),
                                    position_ids=layout.positions(), use_cache=False).last_hidden_state[0]
            return head(hidden_NH.index_select(0, at_N))  # rows may share a position: rlonce.model.packing
    hidden_BTH = decoder(input_ids=ids_BT, attention_mask=attn_BT, use_cache=False).last_hidden_state[:, :-1]
    return head(hidden_BTH[sel_BT])


def token_logprobs_over(logits_NV: torch.Tensor, tokens_N: torch.Tensor, sizes_N: torch.Tensor | None = None,
                        with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each token ``tokens_N`` under ``logits_NV`` (already divided by the temperature),
    normalised over its candidate set, and the entropy of that distribution.

    ``sizes_N[i] = k > 0``: the set is the k highest logits of row i — what top-k/top-p left when
    the token was sampled — so ``log p = logit − logsumexp(top-k logits)``; 0 (or no ``sizes_N``):
    the whole vocabulary, a plain log-softmax. The token's own logit is taken whether or not it
    ranks inside the set, so a boundary tie never yields −inf. Only ``max(sizes_N)`` logits per row
    are sorted (``topk``), so small sets cost little beside the vocabulary-wide head. The entropy
    is that of the renormalised distribution — the one sampled from and now trained — and is
    computed without gradient (the trainer reports it; no loss uses it).
    """
    logz_N = logits_NV.logsumexp(-1)
    top_NK = keep_NK = None
    if sizes_N is not None and bool((sizes_N > 0).any()):
        sizes_N = sizes_N.to(logits_NV.device)
        top_NK = logits_NV.topk(min(int(sizes_N.max()), logits_NV.shape[-1]), dim=-1).values
        keep_NK = (sizes_N[:, None] <= 0) | (torch.arange(top_NK.shape[-1], device=top_NK.device) < sizes_N[:, None])
        top_NK = top_NK.masked_fill(~keep_NK, float("-inf"))
        logz_N = torch.where(sizes_N > 0, top_NK.logsumexp(-1), logz_N)
    lp_N = logits_NV.gather(-1, tokens_N[:, None])[:, 0] - logz_N
    if not with_entropy:
        return lp_N, None
    with torch.no_grad():  # a metric: no gradient, and autograd keeps none of its vocabulary-wide tensors
        logz_N = logz_N.detach()
        logp_NV = logits_NV.detach() - logz_N[:, None]
        ent_N = -(logp_NV.exp() * logp_NV).sum(-1)
        if top_NK is not None:
            logq_NK = top_NK.detach() - logz_N[:, None]
            cut_N = -(logq_NK.exp() * logq_NK.masked_fill(~keep_NK, 0.0)).sum(-1)
            ent_N = torch.where(sizes_N > 0, cut_N, ent_N)
    return lp_N, ent_N
