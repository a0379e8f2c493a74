"""Padding-free training forwards (``rlonce.model.packing``) on the embedded model (grouped-query
attention, rotary positions): each packed row gets exactly what it gets run alone, gradients
match the padded path's, and a model switched to the packed route decodes as before."""

import copy

import torch

from rlonce.model.packing import NAME, Layout, packable
from rlonce.train.trainer import token_logprobs

LENGTHS = [7, 12, 4, 9]


def _batch(vocab: int):
    """Right-padded rows of different lengths, and a loss mask over each row's second half."""
    g = torch.Generator().manual_seed(0)
    B, T = len(LENGTHS), max(LENGTHS)
    ids = torch.zeros((B, T), dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T - 1))
    for b, n in enumerate(LENGTHS):
        ids[b, :n] = torch.randint(3, vocab, (n,), generator=g)
        attn[b, :n] = 1
        mask[b, n // 2: n - 1] = 1.0
    return ids, attn, mask


def _alone(model, ids, b):
    """Row b's next-token log-probs, run by itself with no padding (the reference)."""
    n = LENGTHS[b]
    with torch.no_grad():
        logits = model(input_ids=ids[b:b + 1, :n]).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, ids[b, 1:n, None])[:, 0]


def _lp_and_grads(model, ids, attn, mask):
    model.zero_grad()
    lp, _ = token_logprobs(model, ids, attn, mask_BT=mask)
    (lp * mask).sum().backward()
    return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_each_packed_row_gets_what_it_gets_alone_and_gradients_match_the_padded_path(lm):
    packed_m, padded_m = copy.deepcopy(lm.model), copy.deepcopy(lm.model)
    padded_m.rlonce_packing = False
    ids, attn, mask = _batch(lm.model.config.vocab_size)
    lp_packed, g_packed = _lp_and_grads(packed_m, ids, attn, mask)
    assert packed_m.config._attn_implementation == NAME and padded_m.config._attn_implementation == "sdpa"
    lp_padded, g_padded = _lp_and_grads(padded_m, ids, attn, mask)
    for b, n in enumerate(LENGTHS):
        sel = mask[b, : n - 1] > 0
        want = _alone(lm.model, ids, b)[sel]
        assert torch.allclose(lp_packed[b, : n - 1][sel], want, atol=1e-5)
        assert torch.allclose(lp_padded[b, : n - 1][sel], want, atol=1e-5)
    assert (lp_packed[mask == 0] == 0).all()
    assert g_packed.keys() == g_padded.keys() and len(g_packed) == len(list(lm.model.parameters()))
    for name, g in g_packed.items():
        assert torch.allclose(g, g_padded[name], rtol=1e-4, atol=1e-6), name


def test_the_layout_maps_packed_positions_to_padded_ones():
    attn = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    lay = Layout.of(attn)
    assert lay.index_N.tolist() == [0, 1, 2, 4, 8, 9, 10, 11]
    assert lay.positions().tolist() == [[0, 1, 2, 0, 0, 1, 2, 3]]
    x = torch.arange(8.0).view(1, 1, 8, 1)
    padded = lay.to_padded(x)
    assert padded[:, 0, :, 0].tolist() == [[0, 1, 2, 0], [3, 0, 0, 0], [4, 5, 6, 7]]
    assert lay.to_packed(padded.transpose(1, 2)).flatten().tolist() == list(range(8))
    assert Layout.of(torch.tensor([[0, 1, 1], [1, 1, 1]])) is None  # left padding: the padded path


def test_left_padded_rows_take_the_padded_path_and_stay_right(lm):
    model = copy.deepcopy(lm.model)
    ids, attn, mask = _batch(lm.model.config.vocab_size)
    b, n = 2, LENGTHS[2]  # shift row 2 to the right: [pad … pad, tokens]
    T = ids.shape[1]
    ids[b] = torch.cat([torch.zeros(T - n, dtype=torch.long), ids[b, :n]])
    attn[b] = torch.cat([torch.zeros(T - n, dtype=torch.long), torch.ones(n, dtype=torch.long)])
    mask[b] = 0.0
    with torch.no_grad():
        lp, _ = token_logprobs(model, ids, attn, mask_BT=mask)
    want = _alone(lm.model, ids, 0)[mask[0, : LENGTHS[0] - 1] > 0]
    assert torch.allclose(lp[0, : LENGTHS[0] - 1][mask[0, : LENGTHS[0] - 1] > 0], want, atol=1e-5)


def test_a_switched_model_decodes_padded_batches_exactly_as_sdpa():
    from transformers import AutoModelForCausalLM

    from rlonce.model.loader import _embedded_config

    torch.manual_seed(0)
    cfg = _embedded_config()
    cfg._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    attn = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
        assert packable(model) and model.config._attn_implementation == NAME
        after = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
    assert torch.equal(before, after)


def test_packing_off_keeps_the_model_on_sdpa(embedded_dir):
    from rlonce.model.loader import load

    model = load(embedded_dir, packing=False).model
    assert not packable(model) and model.config._attn_implementation == "sdpa"


def test_a_sliding_window_model_stays_padded():
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, use_sliding_window=True, sliding_window=8, attn_implementation="sdpa")
    model = AutoModelForCausalLM.from_config(cfg)
    assert not packable(model) and model.config._attn_implementation == "sdpa"
