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
model whose attention is ``sdpa`` is switched to it when loaded (``route``). Outside a packed
forward it is ``sdpa`` (same masks, the same result), except that on CPU a masked call with more
than one query keeps grouped key/value heads as they are (``sdpa``'s ``enable_gqa``) where
transformers copies them out once per query head, and back through the copy in a backward pass:
a training step whose rows read a shared prompt (a masked attention call) ran 1.18× faster on
the embedded model (``benchmarks/throughput --parts gqa``; the engine's prefill did not change
measurably).
Models with another attention implementation, rows that are not right-padded, and models
loaded with ``packing=False`` (``model.packing``) take the padded path.

**Shared prompts.** A group's samples start with the same prompt, and a causal decoder's hidden
state at a position depends only on the tokens up to it, so rows whose first n tokens agree have
equal hidden states at those n positions. ``Layout.of`` given the rows' tokens packs such a
prefix once (a row reads it from the row it shares the longest prefix with); the other rows
contribute only their later tokens, and attention gathers each row's keys and values from the
packed positions its tokens live at, shared ones included (``Shared``). The loss and its
gradient are the same (the shared positions' gradients are summed over the rows that read
them, which autograd does through the gather); the linear layers run on a group's prompt once
instead of once per sample, and attention runs queries only where a row has its own tokens.
Off with ``model.share_prefix = false``.

Shared positions are read by several rows, so the gathers here (and the trainer's pick of the
trained positions, ``rlonce.model.logits.selected_logits``) repeat indices, and their backward
sums each position's gradients. They are ``index_select``, whose backward on CPU (``index_add_``)
sums in a fixed order. Indexing with a tensor (``x[:, idx]``) would sum through
``index_put_(accumulate=True)``, which on CPU with more than one torch thread adds by atomic
float adds in whatever order the threads reach them: two runs of the same step would part in
the last bits, and ``runtime.deterministic`` promises bit-identical runs."""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch
import torch.nn.functional as F

NAME = "rlonce_packed"
_LAYOUT: contextvars.ContextVar[Layout | None] = contextvars.ContextVar("rlonce_packed_layout", default=None)


@dataclass(frozen=True)
class Shared:
    """How attention runs when some rows read a prefix from another row (``Layout.of``).

    Rows that hold all their tokens ("holders") attend causally over their own padded length,
    as without sharing. A row that reads its first ``start`` tokens from another row only needs
    queries at its own positions: those rows run in a second call, their queries padded to the
    longest own part, their keys and values gathered over their whole length (shared positions
    included), with an explicit mask (a query at position t sees keys 0…t). ``back_N`` picks each
    packed position's output from the two calls' outputs laid end to end."""

    where_BT: torch.Tensor
    """The packed position each padded one reads; -1 at padding."""
    holders: torch.Tensor
    """(R, T_h) packed positions of the holders' padded rows (padding reads 0)."""
    readers_kv: torch.Tensor
    """(S, T_r) packed positions of the readers' keys and values."""
    readers_q: torch.Tensor
    """(S, Q) packed positions of the readers' own queries."""
    readers_mask: torch.Tensor
    """(S, 1, Q, T_r): a reader's query may attend to that key."""
    back_N: torch.Tensor

    @staticmethod
    def of(where_BT: torch.Tensor, lengths: list[int], starts: list[int], index_N: torch.Tensor) -> Shared:
        B, T = where_BT.shape
        dev = where_BT.device
        hold = [b for b in range(B) if starts[b] == 0]
        read = [b for b in range(B) if starts[b] > 0]
        th, tr = max(lengths[b] for b in hold), max(lengths[b] for b in read)
        q = max(lengths[b] - starts[b] for b in read)
        start_S = torch.tensor([starts[b] for b in read], device=dev)
        t_SQ = start_S[:, None] + torch.arange(q, device=dev)[None, :]  # the position of each reader query
        rows = where_BT.clamp(min=0)
        rank = torch.zeros(B, dtype=torch.long, device=dev)
        rank[hold] = torch.arange(len(hold), device=dev)
        rank[read] = torch.arange(len(read), device=dev)
        b_N, t_N = index_N // T, index_N % T
        start_B = torch.tensor(starts, device=dev)
        back_N = torch.where(start_B[b_N] == 0, rank[b_N] * th + t_N,
                             len(hold) * th + rank[b_N] * q + t_N - start_B[b_N])
        return Shared(where_BT, rows[hold][:, :th], rows[read][:, :tr], rows[read].gather(1, t_SQ.clamp(max=T - 1)),
                      (torch.arange(tr, device=dev)[None, None, :] <= t_SQ[:, :, None])[:, None], back_N)

    def attention(self, module, query, key, value, dropout: float, scaling, **kwargs):
        def take(x_1HND: torch.Tensor, idx_RT: torch.Tensor) -> torch.Tensor:  # → (R, H, T, D)
            x = x_1HND[0].index_select(1, idx_RT.reshape(-1))  # repeated positions: see the module docstring
            return x.view(x.shape[0], *idx_RT.shape, x.shape[-1]).transpose(0, 1)

        H, D = query.shape[1], query.shape[-1]
        own, _ = _sdpa(module, take(query, self.holders), take(key, self.holders), take(value, self.holders), None,
                       dropout=dropout, scaling=scaling, is_causal=True, **kwargs)
        parts = [own.reshape(-1, H, D)]
        if self.readers_q.shape[1]:  # else every reader is a duplicate of the row it reads: no query of its own
            rest, _ = _sdpa(module, take(query, self.readers_q), take(key, self.readers_kv),
                            take(value, self.readers_kv), self.readers_mask, dropout=dropout, scaling=scaling,
                            is_causal=False, **kwargs)
            parts.append(rest.reshape(-1, H, D))
        out = torch.cat(parts)
        return out.index_select(0, self.back_N)[None], None


@dataclass(frozen=True)
class Layout:
    """Where each packed position sits in the padded batch: ``index_N[p] = b * T + t`` (the row
    that holds it); ``shared`` when some rows read a prefix from another row."""

    B: int
    T: int
    index_N: torch.Tensor
    shared: Shared | None = None

    @staticmethod
    def of(attn_BT: torch.Tensor, ids_BT: torch.Tensor | None = None) -> Layout | None:
        """The layout of right-padded rows (each row's mask is ones then zeros), or None when some
        row is not right-padded (left padding, holes). With ``ids_BT``, a row's first n tokens
        that equal another row's are held once."""
        lengths_B = attn_BT.sum(1)
        B, T = attn_BT.shape
        ar_T = torch.arange(T, device=attn_BT.device)
        real_BT = attn_BT.bool()
        if not bool(((ar_T[None, :] < lengths_B[:, None]) == real_BT).all()):
            return None
        flat_BT = torch.arange(B, device=attn_BT.device)[:, None] * T + ar_T[None, :]
        owners = _prefix_owners(ids_BT, real_BT) if ids_BT is not None else {}
        if not owners:
            return Layout(B, T, flat_BT[real_BT])
        kept_BT = real_BT.clone()
        for b, (_, n) in owners.items():
            kept_BT[b, :n] = False
        index_N = flat_BT[kept_BT]
        where_BT = torch.full((B, T), -1, dtype=torch.long, device=attn_BT.device)
        where_BT[kept_BT] = torch.arange(index_N.numel(), device=attn_BT.device)
        for b, (owner, n) in owners.items():
            where_BT[b, :n] = where_BT[owner, :n]
        starts = [owners[b][1] if b in owners else 0 for b in range(B)]
        return Layout(B, T, index_N, Shared.of(where_BT, lengths_B.tolist(), starts, index_N))

    def positions(self) -> torch.Tensor:
        """Position ids of the packed sequence (1×N): each row counts from 0."""
        return (self.index_N % self.T)[None]

    def where_BT(self) -> torch.Tensor:
        """B×T: the packed position each padded one reads; -1 at padding."""
        if self.shared is not None:
            return self.shared.where_BT
        where_M = torch.full((self.B * self.T,), -1, dtype=torch.long, device=self.index_N.device)
        where_M[self.index_N] = torch.arange(self.index_N.numel(), device=self.index_N.device)
        return where_M.view(self.B, self.T)

    def to_padded(self, x_1HND: torch.Tensor) -> torch.Tensor:
        """(1, H, N, D) packed → (B, H, T, D) padded with zeros (a layout without ``shared``)."""
        _, H, N, D = x_1HND.shape
        flat = x_1HND[0].transpose(0, 1)  # N, H, D
        out = flat.new_zeros(self.B * self.T, H, D).index_copy(0, self.index_N, flat)
        return out.view(self.B, self.T, H, D).transpose(1, 2)

    def to_packed(self, y_BTHD: torch.Tensor) -> torch.Tensor:
        """(B, T, H, D) padded → (1, N, H, D) packed."""
        B, T, H, D = y_BTHD.shape
        return y_BTHD.reshape(B * T, H, D).index_select(0, self.index_N)[None]


def _prefix_owners(ids_BT: torch.Tensor, real_BT: torch.Tensor) -> dict[int, tuple[int, int]]:
    """Row → (the row it reads its first n tokens from, n), in an order where each row comes
    after the row it reads from. Rows sorted by their tokens: a row's longest common prefix with
    any row before it in that order is the one with the row just before it."""
    lengths = real_BT.sum(1).tolist()
    rows = [ids_BT[b, : lengths[b]] for b in range(ids_BT.shape[0])]
    order = sorted(range(len(rows)), key=lambda b: rows[b].tolist())
    owners: dict[int, tuple[int, int]] = {}
    for prev, b in zip(order, order[1:]):
        m = min(lengths[prev], lengths[b])
        same = (rows[prev][:m] == rows[b][:m]).int()
        n = int(same.cumprod(0).sum()) if m else 0
        if n:
            owners[b] = (prev, n)
    return owners


def _sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers' ``sdpa`` attention; on CPU, a masked call with several queries and grouped
    key/value heads runs with ``enable_gqa`` instead of first copying each key/value head out per
    query head (transformers' ``repeat_kv``, which it does whenever a mask is given): the same
    result, without the copy."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.device.type != "cpu" or attention_mask is None or query.shape[2] == 1 or query.shape[1] == key.shape[1] \
            or any(kwargs.get(k) is not None for k in ("position_bias", "softcap")) or kwargs.get("output_attentions"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    out_BHTD = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                              scale=scaling, enable_gqa=True)
    return out_BHTD.transpose(1, 2).contiguous(), None


def _attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    layout = _LAYOUT.get()
    if layout is None:
        return _sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    kwargs.pop("is_causal", None)
    if layout.shared is not None:
        return layout.shared.attention(module, query, key, value, dropout, scaling, **kwargs)
    out_BTHD, _ = _sdpa(module, layout.to_padded(query), layout.to_padded(key), layout.to_padded(value), None,
                        dropout=dropout, scaling=scaling, is_causal=True, **kwargs)
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
    route(model)
    return True


def route(model) -> None:
    """Switch ``model`` from ``sdpa`` attention to the packed route (``sdpa`` outside a packed
    forward, without the key/value copy on CPU; module docstring); other models stay as they are."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or getattr(config, "is_encoder_decoder", False):
        return
    _register()
    config._attn_implementation = NAME
    for sub in model.modules():  # sub-configs (a decoder's own config object) follow
        c = getattr(sub, "config", None)
        if c is not None and getattr(c, "_attn_implementation", None) == "sdpa":
            c._attn_implementation = NAME


def shares_prefixes(model) -> bool:
    """Whether ``model``'s training forwards hold rows' common prefixes once (packed, and not
    loaded with ``share_prefix=False``)."""
    return packable(model) and getattr(model, "rlonce_share_prefix", True)


PADDED_PER_BUDGET = 4
"""With shared prefixes, a micro-batch's padded size (rows × longest row: what attention's
gathered keys and values take) may reach this many times the token budget."""


def micro_batches(model, rows, budget: int) -> list[list[int]]:
    """``rows`` (``TrainingRow``s) split into micro-batches of at most ``budget`` tokens (a row
    longer than that alone), as index lists.

    By default rows go by length and a micro-batch's cost is its padded size (longest row × rows).
    Where ``model`` shares prefixes, a prompt's rows (equal tokens before the first trained one)
    go next to each other — prompts ordered by their longest row, so a micro-batch's rows still
    have similar lengths — and the cost is what the packed forward runs: each prompt once, then
    every row's own tokens. Splitting a prompt's rows by padded size would leave each micro-batch
    one prompt of a few rows, too small to keep a CPU's matmuls busy. Attention still gathers
    each row's keys and values over its whole length, so the padded size stays bounded too, at
    ``PADDED_PER_BUDGET`` × ``budget``."""
    shared = shares_prefixes(model)
    keys = [tuple(r.token_ids[: r.loss_mask.index(1) if 1 in r.loss_mask else len(r)]) for r in rows] if shared else []
    if shared:
        longest: dict[tuple, int] = {}
        for k, r in zip(keys, rows, strict=True):
            longest[k] = max(longest.get(k, 0), len(r))
        first = {k: i for i, k in reversed(list(enumerate(keys)))}
        order = sorted(range(len(rows)), key=lambda i: (longest[keys[i]], first[keys[i]], len(rows[i])))
    else:
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    chunks: list[list[int]] = []
    cur: list[int] = []
    spent = widest = 0
    for i in order:
        n = len(rows[i])
        padded = max(widest, n) * (len(cur) + 1)
        if shared:  # the packed tokens: a prompt already in the micro-batch runs once
            cost = spent + n - (len(keys[i]) if cur and keys[cur[-1]] == keys[i] else 0)
        else:
            cost = padded
        if cur and (cost > budget or padded > PADDED_PER_BUDGET * budget):
            chunks.append(cur)
            cur, widest, cost = [], 0, n
        cur.append(i)
        spent, widest = cost, max(widest, n)
    if cur:
        chunks.append(cur)
    return chunks


def current_layout() -> Layout | None:
    """The layout of the packed forward running now in this thread, or None."""
    return _LAYOUT.get()


@contextlib.contextmanager
def packed(layout: Layout):
    """Within this block, attention through the packed route treats its input as ``layout``'s rows."""
    token = _LAYOUT.set(layout)
    try:
        yield
    finally:
        _LAYOUT.reset(token)
