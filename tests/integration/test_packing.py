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
    assert packable(packed_m) and not packable(padded_m)
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


def test_packing_off_keeps_training_forwards_padded_on_the_route(embedded_dir):
    from rlonce.model.loader import load

    model = load(embedded_dir, packing=False).model
    assert not packable(model) and model.config._attn_implementation == NAME


def test_masked_attention_keeps_grouped_heads_and_matches_sdpa(lm, monkeypatch):
    """A left-padded prefill after a cache with a masked hole (the engine's kept-prefix admission)
    and a padded training forward: the route runs sdpa with grouped key/value heads as they are
    (no ``repeat_kv`` copy) and gives transformers' sdpa results, gradients included."""
    from transformers.integrations import sdpa_attention

    from rlonce.engine import kvcache

    route_m, sdpa_m = copy.deepcopy(lm.model), copy.deepcopy(lm.model)
    assert route_m.config._attn_implementation == NAME and route_m.model.layers[0].self_attn.num_key_value_groups > 1
    for m in [sdpa_m, *sdpa_m.modules()]:
        if hasattr(m, "config"):
            m.config._attn_implementation = "sdpa"
    copies = []
    real_repeat = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda x, n: copies.append(n) or real_repeat(x, n))
    g = torch.Generator().manual_seed(3)
    past = torch.randint(3, 200, (2, 6), generator=g)
    ids = torch.randint(3, 200, (2, 4), generator=g)
    attn = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]])  # row 0: pad, kept, hole
    past_pos, pos = torch.tensor([[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]]), torch.tensor([[0, 4, 5, 6], [6, 7, 8, 9]])
    out = {}
    for name, m in (("route", route_m), ("sdpa", sdpa_m)):
        with torch.no_grad():
            cache = kvcache.new_cache(layers=m.config.num_hidden_layers)
            m(input_ids=past, attention_mask=attn[:, :6], position_ids=past_pos, use_cache=True, cache=cache)
            out[name] = m(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, cache=cache).logits
        out[name + "_copies"] = len(copies)
    assert out["route_copies"] == 0 and out["sdpa_copies"] > 0
    assert torch.allclose(out["route"], out["sdpa"], atol=1e-5)
    for m in (route_m, sdpa_m):
        m.rlonce_packing = False  # the padded training path: a mask, several queries
    ids, attn, mask = _batch(lm.model.config.vocab_size)
    lp_route, g_route = _lp_and_grads(route_m, ids, attn, mask)
    lp_sdpa, g_sdpa = _lp_and_grads(sdpa_m, ids, attn, mask)
    assert torch.allclose(lp_route, lp_sdpa, atol=1e-5)
    for name, grad in g_route.items():
        assert torch.allclose(grad, g_sdpa[name], rtol=1e-4, atol=1e-6), name


def test_a_sliding_window_model_stays_padded():
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, use_sliding_window=True, sliding_window=8, attn_implementation="sdpa")
    model = AutoModelForCausalLM.from_config(cfg)
    assert not packable(model) and model.config._attn_implementation == "sdpa"


def _group_batch(vocab: int, prompt: int = 6, completions=(5, 9, 3, 7)):
    """Two prompts, each followed by several completions (a GRPO micro-batch), right-padded; the
    loss mask covers the completions. Rows 0-1 share prompt A, rows 2-3 prompt B, and row 4 has
    prompt A and the first two completion tokens of row 0."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, vocab, (prompt,), generator=g) for _ in range(2)]
    rows = [(0, completions[0]), (0, completions[1]), (1, completions[2]), (1, completions[3]), (0, 4)]
    T = prompt + max(n for _, n in rows)
    ids, attn, mask = torch.zeros((len(rows), T), dtype=torch.long), torch.zeros((len(rows), T), dtype=torch.long), \
        torch.zeros((len(rows), T - 1))
    for b, (p, n) in enumerate(rows):
        ids[b, :prompt], ids[b, prompt: prompt + n] = prompts[p], torch.randint(3, vocab, (n,), generator=g)
        attn[b, : prompt + n] = 1
        mask[b, prompt - 1: prompt + n - 1] = 1.0
    ids[4, prompt: prompt + 2] = ids[0, prompt: prompt + 2]
    return ids, attn, mask


def test_a_shared_prompt_runs_once_and_changes_neither_log_probs_nor_gradients(lm):
    ids, attn, mask = _group_batch(lm.model.config.vocab_size)
    lay = Layout.of(attn, ids)
    # rows 1 and 3 read their 6 prompt tokens from rows 0 and 2, row 4 its first 8 from row 0
    assert lay.index_N.numel() == int(attn.sum()) - 6 - 6 - 8
    where = lay.where_BT()
    assert torch.equal(where[1, :6], where[0, :6]) and torch.equal(where[3, :6], where[2, :6])
    assert torch.equal(where[4, :8], where[0, :8]) and where[4, 8] not in where[0].tolist()
    assert (where[attn == 0] == -1).all()
    assert sorted(where[where >= 0].unique().tolist()) == list(range(lay.index_N.numel()))
    shared_m, alone_m = copy.deepcopy(lm.model), copy.deepcopy(lm.model)
    alone_m.rlonce_share_prefix = False
    lp_shared, g_shared = _lp_and_grads(shared_m, ids, attn, mask)
    lp_alone, g_alone = _lp_and_grads(alone_m, ids, attn, mask)
    for b in range(ids.shape[0]):
        n = int(attn[b].sum())
        sel = mask[b, : n - 1] > 0
        with torch.no_grad():
            logits = lm.model(input_ids=ids[b: b + 1, :n]).logits[0, :-1].float()
        want = logits.log_softmax(-1).gather(-1, ids[b, 1:n, None])[:, 0][sel]
        assert torch.allclose(lp_shared[b, : n - 1][sel], want, atol=1e-5)
    assert torch.allclose(lp_shared, lp_alone, atol=1e-5)
    assert g_shared.keys() == g_alone.keys()
    for name, g in g_shared.items():  # summed in another order: equal to float32 rounding of the largest entry
        assert float((g - g_alone[name]).abs().max()) <= 1e-5 * float(g_alone[name].abs().max()), name


def test_a_row_reads_the_longest_prefix_another_row_holds():
    attn = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]])
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 9], [5, 6, 9, 0], [4, 6, 7, 8]])
    lay = Layout.of(attn, ids)
    # row 2 reads 5 6 from row 0 and holds its 9; row 1 reads 5 6 9 through row 2; row 3 shares nothing
    assert lay.index_N.tolist() == [0, 1, 2, 3, 7, 10, 12, 13, 14, 15]
    assert lay.where_BT().tolist() == [[0, 1, 2, 3], [0, 1, 5, 4], [0, 1, 5, -1], [6, 7, 8, 9]]
    assert lay.positions().tolist() == [[0, 1, 2, 3, 3, 2, 0, 1, 2, 3]]
    assert Layout.of(attn, torch.tensor([[1, 2, 3, 4], [2, 2, 3, 4], [3, 2, 3, 0], [4, 6, 7, 8]])).shared is None


def test_micro_batches_keep_a_prompt_s_rows_together_and_count_it_once(lm):
    from rlonce.core.records import TrainingRow
    from rlonce.model.packing import micro_batches

    def row(prompt: list[int], n: int) -> TrainingRow:
        ids = prompt + list(range(100, 100 + n))
        mask = [0] * len(prompt) + [1] * n
        return TrainingRow(ids, mask, [0.0] * len(ids), [0.0] * len(ids), [0] * len(ids))

    a, b = [5] * 10, [6] * 10
    rows = [row(a, 4), row(b, 6), row(a, 2), row(b, 3), row(a, 3)]  # a's longest row: 14 tokens, b's: 16
    model = copy.deepcopy(lm.model)
    # shared: a's rows first (its longest row is shorter), each prompt counted once: a = 10 + 4 + 2 + 3 = 19
    # tokens, b = 10 + 6 + 3 = 19; a budget of 30 fits one prompt's rows, not both
    assert micro_batches(model, rows, 30) == [[2, 4, 0], [3, 1]]
    assert micro_batches(model, rows, 38) == [[2, 4, 0, 3, 1]]
    # 20 one-token answers to a 100-token prompt: 120 packed tokens fit a budget of 200, but attention's
    # padded size (rows × 101) is held to 4 × 200 = 800: 7 rows a micro-batch
    many = [row([7] * 100, 1) for _ in range(20)]
    assert [len(c) for c in micro_batches(model, many, 200)] == [7, 7, 6]
    model.rlonce_share_prefix = False  # by length, padded: 12, 13, 13 | 14, 16 → 3 × 13 = 39 > 30 after two rows
    assert micro_batches(model, rows, 30) == [[2, 3], [4, 0], [1]]


def test_duplicate_rows_and_a_row_that_is_another_s_prefix_change_nothing(lm):
    """A group whose samples are all the same (a confident policy) leaves the readers no token of
    their own; a row that is a strict prefix of another reads all of it."""
    V = lm.model.config.vocab_size
    g = torch.Generator().manual_seed(2)
    base = torch.randint(3, V, (9,), generator=g)
    for rows in ([base, base, base], [base, base, base[:5]], [base[:1], base[:1], base]):
        T = max(len(r) for r in rows)
        ids, attn = torch.zeros((len(rows), T), dtype=torch.long), torch.zeros((len(rows), T), dtype=torch.long)
        mask = torch.zeros((len(rows), T - 1))
        for b, r in enumerate(rows):
            ids[b, : len(r)], attn[b, : len(r)] = r, 1
            mask[b, : len(r) - 1] = 1.0
        shared_m, alone_m = copy.deepcopy(lm.model), copy.deepcopy(lm.model)
        alone_m.rlonce_share_prefix = False
        lp_shared, g_shared = _lp_and_grads(shared_m, ids, attn, mask)
        lp_alone, g_alone = _lp_and_grads(alone_m, ids, attn, mask)
        assert torch.allclose(lp_shared, lp_alone, atol=1e-5)
        for name, grad in g_shared.items():
            assert float((grad - g_alone[name]).abs().max()) <= 1e-5 * float(g_alone[name].abs().max()), name
